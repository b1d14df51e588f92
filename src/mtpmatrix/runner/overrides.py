"""What an override drags along, and what it must not (``--with``, canary-override rows, bisect probes: they all
install through ``matrix.run_row``).

An override replaces every requirement on its package, so uv is free to move whatever depends on it. The rules:

- **held**: a package sglang pins exactly stays at sglang's pin unless the user overrides it too, even when its own
  requirement on an overridden package is now unmet. Moving it (sglang-kernel 0.4.10 -> 0.4.6.post1 under torch
  2.15.0) tests a kernel sglang does not ship: its failure is a false red.
- **companions**: other packages whose requirement the override strands follow it (``matrix.resolve_companions``:
  torchvision follows torch).
- **moved**: every package that differs from what the row alone resolves to is recorded, with why.
- **blocking pins**: a held pin, or any other package sglang pins exactly and nobody moved, that a failing check
  names (torchaudio 2.11.0 refusing torch 2.15.0's CUDA 13.2 at import) is reported as its own finding; a canary
  then retries with that companion moved too (``runner/canary.py``).

Installed metadata is read from the venv's ``*.dist-info`` folders (no import, nothing run in the venv).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mtpmatrix.core.paths import REPO
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import REQUIRED_PINS
from mtpmatrix.core.schema import FAILING
from mtpmatrix.runner.uv_install import constraints_text, venv_python

UNDER_TEST = REQUIRED_PINS  # the packages a row is about (each row pins them): never a "blocking companion"
PINNER = "sglang"


@dataclass
class Dist:
    name: str  # canonical
    version: str
    requires: list[str] = field(default_factory=list)  # Requires-Dist lines
    modules: set[str] = field(default_factory=set)  # top-level import names (from RECORD)


def site_packages(venv: Path) -> Path | None:
    found = sorted(Path(venv).glob("lib/python3*/site-packages")) or sorted(Path(venv).glob("Lib/site-packages"))
    return found[0] if found else None


def installed(venv: Path) -> dict[str, Dist]:
    """Every distribution installed in ``venv``, by canonical name."""
    sp = site_packages(venv)
    out: dict[str, Dist] = {}
    if sp is None:
        return out
    for info in sp.glob("*.dist-info"):
        meta_file = info / "METADATA"
        if not meta_file.is_file():
            continue
        meta = HeaderParser().parsestr(meta_file.read_text(errors="replace"))
        name = canonicalize_name(meta.get("Name", ""))
        if not name:
            continue
        modules = set()
        record = info / "RECORD"
        if record.is_file():
            for line in record.read_text(errors="replace").splitlines():
                top = line.split(",", 1)[0].split("/", 1)[0]
                if top and not top.endswith((".dist-info", ".data", ".pth")) and top != "..":
                    modules.add(top[:-3] if top.endswith(".py") else top)
        out[name] = Dist(name, meta.get("Version", ""), meta.get_all("Requires-Dist") or [], modules)
    return out


def _applies(req: Requirement, env: dict) -> bool:
    return req.marker is None or req.marker.evaluate({**env, "extra": ""})


def _requirements(dist: Dist) -> Iterable[Requirement]:
    """``dist``'s requirements that apply on this platform, extras left out (unparsable lines skipped)."""
    env = default_environment()
    for line in dist.requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if _applies(req, env):
            yield req


def exact_pins(dists: dict[str, Dist], of: str = PINNER) -> dict[str, str]:
    """{package: version} that ``of`` (sglang) pins with ``==`` for this platform, extras left out."""
    dist = dists.get(canonicalize_name(of))
    if dist is None:
        return {}
    pins = {}
    for req in _requirements(dist):
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            pins[canonicalize_name(req.name)] = specs[0].version
    return pins


def requirement_on(dist: Dist, target: str) -> str | None:
    """``dist``'s own requirement line on ``target`` (``torch==2.14.1``), if it has one."""
    return next(
        (
            f"{req.name}{req.specifier}"
            for req in _requirements(dist)
            if canonicalize_name(req.name) == canonicalize_name(target)
        ),
        None,
    )


def split_stranded(stranded: Iterable[str], pins: dict[str, str], asked: Iterable[str]) -> tuple[list[str], list[str]]:
    """(companions to move, packages held at sglang's exact pin) among the packages an override strands."""
    asked = {canonicalize_name(a) for a in asked}
    movable, held = [], []
    for name in stranded:
        (held if canonicalize_name(name) in pins and canonicalize_name(name) not in asked else movable).append(name)
    return sorted(movable), sorted(held)


def held_records(held: list[str], dists: dict[str, Dist], overrides: list[str]) -> list[dict]:
    """One record per held package: its version, who pins it, the requirement the override leaves unmet."""
    pinner = dists.get(PINNER)
    out = []
    for name in held:
        d = dists.get(name)
        pairs = [(o, r) for o in overrides if d and (r := requirement_on(d, Requirement(o).name))]
        unmet = [r for _, r in pairs]
        out.append(
            {
                "package": name,
                "version": d.version if d else None,
                "pinned_by": f"{PINNER} {pinner.version}" if pinner else PINNER,
                "requires": unmet,
                "why": f"kept at {PINNER}'s exact pin; its own requirement {', '.join(unmet) or '?'} is left "
                f"unmet by {', '.join(o for o, _ in pairs) or ', '.join(overrides)}",
            }
        )
    return out


def resolve_baseline(
    uv: str,
    python: Path,
    constraints_text: str,
    requirements: list[str],
    workdir: Path,
    env: dict | None = None,
    torch_backend: str = "pypi",
) -> dict[str, str] | None:
    """What the row alone resolves to (``uv pip compile``, no overrides): {package: version}; None when uv fails
    (the moved list is then left out, never guessed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfile = workdir / "baseline-constraints.txt"
    cfile.write_text(constraints_text)
    cmd = [uv, "pip", "compile", "-", "--python", str(python), "--no-header", "--no-annotate", "-c", str(cfile)]
    if torch_backend != "pypi":
        cmd += ["--torch-backend", torch_backend]
    done = subprocess.run(cmd, input="\n".join(requirements) + "\n", capture_output=True, text=True, env=env)
    (workdir / "baseline.log").write_text("$ " + " ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        return None
    return compiled_versions(done.stdout)


def compiled_versions(text: str) -> dict[str, str]:
    """``uv pip compile``'s output as {canonical name: version} (its ``name==version`` lines)."""
    out = {}
    for line in text.splitlines():
        body = line.split("#", 1)[0].strip()
        if "==" in body:
            name, ver = body.split("==", 1)
            out[canonicalize_name(name)] = ver.strip()
    return out


def moved(
    baseline: dict[str, str],
    now: dict[str, str],
    *,
    asked: Iterable[str],
    companions: Iterable[str] = (),
    held: Iterable[str] = (),
    dists: dict[str, Dist] | None = None,
) -> list[dict]:
    """Every package whose version differs from the row alone (or that appeared / went), with why."""
    asked = {canonicalize_name(a) for a in asked}
    companions = {canonicalize_name(c.split("==", 1)[0]) for c in companions}
    dists = dists or {}
    out = []
    for name in sorted(set(baseline) | set(now)):
        before, after = baseline.get(name), now.get(name)
        if before == after or name in ("gemma4-mtp-matrix", "mtpmatrix"):
            continue
        if name in asked:
            why = "asked for"
        elif name in companions:
            why = "companion: follows the override (its own requirement on the overridden package)"
        else:
            why = "re-resolved by uv under the override" + _because(name, before, dists)
        out.append({"package": name, "from": before, "to": after, "why": why})
    return out


def _because(name: str, before: str | None, dists: dict[str, Dist]) -> str:
    """Which installed package's requirement rules out the version the row alone would have (else who requires
    the package at all)."""
    reqs = [(d, r) for d in dists.values() if d.name != name and (r := requirement_on(d, name))]
    if before:
        for d, r in sorted(reqs, key=lambda x: x[0].name):
            spec = Requirement(r).specifier
            if spec and not spec.contains(before, prereleases=True):
                return f": {d.name} {d.version} requires {r}, which {before} does not satisfy"
    by = sorted(d.name for d, _ in reqs)
    return f"; required by {', '.join(by[:4])}" if by else ""


def _names(dist_name: str, dists: dict[str, Dist]) -> set[str]:
    d = dists.get(dist_name)
    names = {dist_name, dist_name.replace("-", "_")}
    if d:
        names |= {m for m in d.modules if len(m) > 3 and not m.startswith(("_", "."))}
    return names


def blocking_pins(
    tiers: dict,
    pins: dict[str, str],
    *,
    moved_names: Iterable[str],
    dists: dict[str, Dist],
    pinner_version: str | None = None,
) -> list[dict]:
    """Packages sglang pins exactly, that nobody moved, named by a failing check's failure (message or frames):
    the pin, not the upgrade under test, is what refuses (torchaudio 2.11.0 under torch 2.15.0)."""
    skip = {canonicalize_name(m) for m in moved_names} | set(UNDER_TEST)
    candidates = {p: v for p, v in pins.items() if p not in skip}
    found: dict[str, dict] = {}
    for tier, t in (tiers or {}).items():
        for check in t.get("checks") or []:
            if check.get("outcome") not in FAILING:
                continue
            f = check.get("failure") or {}
            text = " ".join(str(f.get(k) or "") for k in ("message", "raised_at", "frame"))
            for pkg, ver in candidates.items():
                if pkg in found:
                    continue
                if any(
                    re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text, re.I)
                    for n in _names(pkg, dists)
                ):
                    found[pkg] = {
                        "package": pkg,
                        "version": ver,
                        "pinned_by": f"{PINNER} {pinner_version}" if pinner_version else PINNER,
                        "tier": tier,
                        "check": check.get("id") or check.get("name"),
                        "kind": f.get("kind"),
                        "message": (f.get("message") or "")[:400],
                    }
    return [found[k] for k in sorted(found)]


# ---------------------------------------------------------------------------------------------------------------
# the hooks matrix.run_row calls (one each: hold, account, blame)
# ---------------------------------------------------------------------------------------------------------------


def _asked(overrides: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(o).name) for o in overrides}


def hold_sglang_pins(record: RowRecord, venv: Path, overrides: list[str], stranded: list[str], log=print) -> list[str]:
    """The stranded packages that may follow the overrides; the ones sglang pins exactly are held (recorded in
    ``install.held``) unless asked for."""
    dists = installed(venv)
    movable, held = split_stranded(stranded, exact_pins(dists), _asked(overrides))
    if held:
        record["install"]["held"] = held_records(held, dists, overrides)
        for h in record["install"]["held"]:
            log(f"{h['package']} {h['version']} {h['why']}")
    return movable


def moved_by_overrides(
    row,
    venv: Path,
    overrides: list[str],
    record: RowRecord,
    freeze: str,
    uv: str,
    out: Path,
    env: dict | None,
) -> list[dict] | None:
    """``moved`` against what the row alone resolves to (its constraints, no overrides, with the venv's Python and
    this checkout installed editable as in the row); None when that resolution fails."""
    from mtpmatrix.core.store import parse_freeze

    base = resolve_baseline(
        uv,
        venv_python(venv),
        constraints_text(row, []),
        [f"{n}=={v}" for n, v in row.pins.items()] + [f"-e {REPO}"],
        out / "baseline",
        env=env,
        torch_backend=row.torch_backend,
    )
    if base is None:
        return None
    install = record.get("install") or {}
    return moved(
        base,
        parse_freeze(freeze),
        asked=_asked(overrides),
        companions=install.get("companions") or (),
        held=[h["package"] for h in install.get("held") or ()],
        dists=installed(venv),
    )


def blocking_pins_of(record: RowRecord, venv: Path, overrides: list[str]) -> list[dict]:
    dists = installed(venv)
    moved_names = {m["package"] for m in (record.get("install") or {}).get("moved") or ()} | _asked(overrides)
    pinner = dists.get(PINNER)
    return blocking_pins(
        record.get("tiers") or {},
        exact_pins(dists),
        moved_names=moved_names,
        dists=dists,
        pinner_version=pinner.version if pinner else None,
    )
