"""A canary whose newest release cannot install: which requirement refuses it, the first release that cannot
install, and the newest that does (whose tiers the canary then searches as usual, ``runner/culprit.py``).

Whether a release installs is asked of uv's resolver alone (``uv pip compile`` of the row's install with the
release as an override: the same constraints, overrides and packages as ``matrix.install_command``, no venv, no
wheel downloaded), a few seconds a release. uv's own reason is kept as one line: "transformers 5.25.0 needs
kernels>=0.19.1,<0.20; sglang 0.5.17 requires kernels>=0.14.1,<0.15" (taken from its "Because A depends on X and
B depends on Y" sentence; uv's first "Because ..." clause when the sentence has another shape).

The search over the releases between the row's pin and the canary's release is ``bisect.search`` with this
resolution as the probe: bad where uv reports a conflict, good where it resolves, untestable where the index does
not answer for that release (an unreachable index stops it: no release can be told apart then).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix.core.evidence import fingerprint, manifest
from mtpmatrix.core.failures import classify_install
from mtpmatrix.core.paths import REPO
from mtpmatrix.core.rows import Row
from mtpmatrix.core.schema import ROW_FILE
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import bisect, matrix, plan
from mtpmatrix.runner.canary import Resolution, canary_row
from mtpmatrix.runner.matrix import constraints_text, find_uv, overridden_names

RESOLVER_CONFLICT = "resolver conflict"  # classify_install's label for uv's "No solution found"
UNREACHABLE = "index unreachable"

# uv: "Because transformers>=5.25.0 depends on kernels>=0.19.1,<0.20 and sglang==0.5.17 depends on
# kernels>=0.14.1,<0.15, we can conclude that ..." (a requirement holds no space; its commas are not followed by one)
_NAME = r"[A-Za-z0-9][A-Za-z0-9._\-]*"
_REQ = r"[^\s,]+(?:,[^\s,]+)*"
_BOTH = re.compile(
    rf"Because (?P<a>{_NAME})(?P<aspec>\S*?) depends on (?P<areq>{_REQ}) and "
    rf"(?P<b>{_NAME})(?P<bspec>\S*?) depends on (?P<breq>{_REQ})"
)
_SPEC = re.compile(r"^(==|>=)(?P<v>[^,]+)$")


def is_conflict(failure: dict | None) -> bool:
    """An install failure uv's resolver owns (the release's requirements refuse the row's), not a fault of the
    index or the machine."""
    return failure is not None and str(failure.get("message") or "").startswith(RESOLVER_CONFLICT)


def _who(name: str, spec: str, releases: dict[str, str]) -> str:
    """``transformers 5.25.0`` for uv's ``transformers>=5.25.0`` (or ``==``) of the release asked for; else uv's
    own words (``transformers>=5.20``: every release from there)."""
    m = _SPEC.match(spec)
    if m and (releases.get(canonicalize_name(name)) == m.group("v") or spec.startswith("==")):
        return f"{name} {m.group('v')}"
    return f"{name}{spec}"


def conflict_line(message: str, releases: dict[str, str] | None = None) -> str:
    """One line from uv's resolver message: "A needs X; B requires Y", the moved package (a key of ``releases``,
    {package: release}) first; uv's first "Because ..." clause when the sentence has another shape."""
    releases = {canonicalize_name(p): v for p, v in (releases or {}).items()}
    m = _BOTH.search(message)
    if m:
        a = (m.group("a"), m.group("aspec"), m.group("areq"))
        b = (m.group("b"), m.group("bspec"), m.group("breq"))
        if canonicalize_name(b[0]) in releases and canonicalize_name(a[0]) not in releases:
            a, b = b, a
        return f"{_who(a[0], a[1], releases)} needs {a[2]}; {_who(b[0], b[1], releases)} requires {b[2]}"
    because = message.find("Because")
    if because >= 0:
        return message[because:].split(", we can conclude")[0].split(" | ")[0].strip()
    return message.split(" | ")[0].strip()


def resolve_command(row: Row, cfile: Path, ofile: Path) -> list[str]:
    cmd = [find_uv(bisect.BisectError), "pip", "compile", "-", "--python-version", row.python]
    cmd += ["--no-header", "--no-annotate", "-c", str(cfile), "--override", str(ofile)]
    if row.torch_backend != "pypi":
        cmd += ["--torch-backend", row.torch_backend]
    return cmd


def resolution_probe(
    row: Row, package: str, *, also: tuple[str, ...] = (), workdir: Path, run=None
) -> Callable[[str], bisect.Probe]:
    """A bisect probe that asks uv whether ``row`` installs with ``package==version`` (and ``also``): good when it
    resolves, bad on a resolver conflict (its one line in ``detail``), untestable otherwise; fatal when the index
    is unreachable. Each resolution's command and output land in ``workdir/<package>-<version>.log``; ``run``
    replaces subprocess.run (tests)."""

    def probe(version: str) -> bisect.Probe:
        t0 = time.monotonic()
        overrides = [f"{package}=={version}", *also]
        workdir.mkdir(parents=True, exist_ok=True)
        stem = f"{canonicalize_name(package)}-{version}" + "".join(
            f"-{canonicalize_name(a.replace('==', '-'))}" for a in also
        )
        cfile, ofile, logf = (workdir / f"{stem}.{k}" for k in ("constraints.txt", "overrides.txt", "log"))
        cfile.write_text(constraints_text(row, overrides))
        ofile.write_text("\n".join(overrides) + "\n")
        replaced = overridden_names(overrides)
        # the packages matrix.install_command installs: the row's pins (an overridden one by name) + this project
        reqs = [n if n in replaced else f"{n}=={v}" for n, v in row.pins.items()] + [f"-e {REPO}"]
        cmd = resolve_command(row, cfile, ofile)
        done = (run or subprocess.run)(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True, cwd=REPO)
        logf.write_text("$ " + " ".join(cmd) + "\n" + done.stdout + done.stderr)
        seconds = time.monotonic() - t0
        if done.returncode == 0:
            return bisect.Probe(version, bisect.GOOD, "installs (uv resolves it)", seconds=seconds)
        failure = classify_install(done.stderr or done.stdout).as_dict()
        if is_conflict(failure):
            line = conflict_line(failure["message"], {package: version})
            return bisect.Probe(version, bisect.BAD, f"cannot install: {line}", failure, seconds)
        fatal = failure["message"].startswith(UNREACHABLE)
        return bisect.Probe(
            version, bisect.UNTESTABLE, f"resolution failed: {failure['message']}", failure, seconds, fatal=fatal
        )

    return probe


def search(
    moved: dict[str, tuple[str | None, str]],
    row_id: str,
    probe_for: Callable[[str], Callable[[str], bisect.Probe]],
    candidates: Callable[[str, str, str], list[str]],
    should_stop: Callable[[], str | None],
    known: dict[str, bisect.Probe] | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """For a canary that cannot install: each moved package alone at its release (``known``: already measured,
    the canary itself when it moved one package), then, for each that cannot install alone, the first release
    from its pin on that cannot (``bisect.search`` over resolutions). ``installable``: {package: release} to run
    the tiers on instead (the newest release that installs of each package that cannot, the others as they
    were), None when there is none (a package none of whose releases installs, only-together, a stopped search)."""
    out: dict = {
        "row": row_id,
        "moved": {p: list(pv) for p, pv in moved.items()},
        "single": {},
        "bisect": {},
        "together": None,
        "installable": None,
        "stopped": None,
    }
    cannot = []
    for pkg, (_pin, new) in moved.items():
        p = (known or {}).get(pkg)
        if p is None:
            if why := should_stop():
                out["stopped"] = why
                return out
            log(f"[install] {pkg} {new} alone on {row_id}: resolving")
            p = probe_for(pkg)(new)
        out["single"][pkg] = {
            "version": new,
            "status": p.status,
            "detail": p.detail,
            "failure": p.failure,
            "seconds": round(p.seconds, 1),
        }
        if p.status == bisect.BAD:
            cannot.append(pkg)
    if not cannot:
        if len(moved) > 1 and all(s["status"] == bisect.GOOD for s in out["single"].values()):
            out["together"] = sorted(moved)
        return out
    fallback: dict[str, str] | None = {p: v for p, (_, v) in moved.items()}
    for pkg in cannot:
        pin, new = moved[pkg]
        if pin is None:
            out["bisect"][pkg] = {"outcome": "no-pin", "summary": [f"{pkg} has no pin in the row to search from"]}
            fallback = None
            continue
        try:
            cands = candidates(pkg, pin, new)
        except bisect.BisectError as exc:
            out["bisect"][pkg] = {"outcome": "error", "summary": [str(exc)]}
            fallback = None
            continue
        found = bisect.search(cands, probe_for(pkg), log=log, should_stop=should_stop, known={new: bisect.BAD})
        found.seconds = max(found.seconds, sum(p.seconds for p in found.probes))
        said = [
            ln.replace("first bad release", "first release that cannot install") for ln in bisect.describe(found, pkg)
        ]
        out["bisect"][pkg] = {**found.as_dict(), "summary": said}
        if found.outcome == "stopped":
            out["stopped"] = found.stopped
            return out
        if found.outcome == "found" and found.last_good:
            if fallback is not None:
                fallback[pkg] = found.last_good
        else:
            fallback = None
    out["installable"] = fallback
    return out


def lines(s: dict) -> list[str]:
    """The install answer, a few lines."""
    row, out = s["row"], []
    for pkg, one in s["single"].items():
        if one["status"] == bisect.BAD:
            out.append(
                f"CANNOT INSTALL: {pkg} {one['version']} on {row}: {one['detail'].removeprefix('cannot install: ')}"
            )
        else:
            out.append(f"{pkg} {one['version']} alone on {row}: {one['detail'] or one['status']}")
    for pkg, b in s["bisect"].items():
        pin = s["moved"][pkg][0]
        if b.get("outcome") == "found":
            out.append(
                f"first release that cannot install: {pkg} {b['first_bad']} (newest that installs: "
                f"{b['last_good']}; resolution only, {len(b['probes'])} resolution(s) over "
                f"{len(b['candidates'])} release(s) in {b['seconds']:.0f} s)"
            )
        elif b.get("outcome") == "good-fails":
            out.append(f"{row} cannot install at its own pin {pkg} {pin} either: no release to search the tiers on")
        else:
            out += [f"  {ln}" for ln in b.get("summary") or []]
    if s.get("together"):
        out.append(f"{' + '.join(s['together'])} install each alone on {row}, not together: no release to blame")
    if s.get("stopped"):
        out.append(f"install search stopped: {s['stopped']} (resume with --resume to go on)")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the canary's side (real resolutions and installs; culprit.run_canary calls these)
# ---------------------------------------------------------------------------------------------------------------


def record_seconds(record: dict) -> float:
    """A row's own install + suite time (what a resumed canary reads back instead of timing the read)."""
    return round(sum((record.get(k) or {}).get("seconds") or 0.0 for k in ("install", "suite")), 1)


def canary_search(
    res: Resolution,
    record: dict,
    opts: matrix.Options,
    probes_run: str,
    should_stop: Callable[[], str | None],
    log: Callable[[str], None] = print,
) -> dict:
    """``search`` for a canary whose install failed on a resolver conflict (``record``: its row record). A canary
    that moved one package is that package's resolution at its release (with no ``--with`` of the user's beside
    it); resolutions are logged under ``results/<probes_run>/resolutions/``."""
    c = res.canary
    failure = (record.get("install") or {}).get("failure") or {}
    known = {}
    if len(res.moved) == 1 and not opts.overrides:
        ((pkg, (_, new)),) = res.moved.items()
        line = conflict_line(failure.get("message") or "", {pkg: new})
        known[pkg] = bisect.Probe(new, bisect.BAD, f"cannot install: {line}", failure, record_seconds(record))
    workdir = Path(opts.results) / probes_run / "resolutions"

    def probe_for(pkg: str) -> Callable[[str], bisect.Probe]:
        return resolution_probe(c.base, pkg, workdir=workdir)

    def said(line: str) -> None:  # bisect.search's lines, told apart from the tier search's that follow
        log(line.replace("[bisect]", "[install]", 1))

    return search(res.moved, c.base.id, probe_for, bisect.candidates, should_stop, known=known, log=said)


def installable_id(res: Resolution, fallback: dict[str, str]) -> str:
    """``sglang-0.5.17-transformers-at-transformers-5.24.0``: the canary at the releases that install."""
    moved = [f"{canonicalize_name(p)}-{v}" for p, v in fallback.items() if v != res.versions.get(p)]
    return f"{res.canary.id}-at-{'-'.join(moved)}"


def run_installable(
    res: Resolution,
    fallback: dict[str, str],
    opts: matrix.Options,
    repo: Path,
    log: Callable[[str], None] = print,
) -> tuple[Resolution, dict, matrix.Options, dict]:
    """Run the canary at ``fallback`` (the newest releases that install) as a row of the run, planned in its
    manifest, filed as ``installable_id`` (``--resume``: its finished record is read back). Returns the resolution
    it ran, its record, its options and what canary.json keeps of it."""
    c = res.canary
    versions = {**res.versions, **fallback}
    res2 = Resolution(c, versions, {p: (c.base.pins.get(p), v) for p, v in versions.items() if c.base.pins.get(p) != v})
    rid = installable_id(res, fallback)
    store = RunStore(opts.results, opts.run_id)
    row = dataclasses.replace(canary_row(res2, store.row_dir(rid) / "resolved"), id=rid)
    copts = matrix.Options(
        **{
            **opts.__dict__,
            "overrides": [*opts.overrides, *(res2.overrides if c.override else [])],
            "record_extra": {"canary": {**res2.as_dict(), "retry_of": c.id, "installable_of": dict(res.versions)}},
        }
    )
    manifest.ensure(
        store.path,
        opts.run_id,
        {rid: manifest.planned_row(row.as_dict(), row.path.read_text(), copts.overrides)},
        plan.invocation(copts),
        fingerprint.describe(),
    )
    if opts.resume and store.finished(rid):
        record = store.load_row(rid)
        log(f"[{rid}] reusing its finished row record (--resume)")
    else:
        log(f"[{c.id}] the tiers at the newest releases that install: {', '.join(res2.overrides) or 'the pins'}")
        record = matrix.run_row(row, bisect.make_venv(row, repo / ".nox" / f"canary-{c.id}"), copts, log=log)
    kept = {
        "id": rid,
        "versions": fallback,
        "verdict": record["verdict"],
        "record": str(store.row_dir(rid) / ROW_FILE),
        "seconds": record_seconds(record),
    }
    return res2, record, copts, kept
