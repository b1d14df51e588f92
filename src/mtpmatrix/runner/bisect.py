"""Culprit bisection: the first release of a package that breaks a tier of a row.

    python -m mtpmatrix bisect PACKAGE GOOD BAD [--row ROW] [--tier TIER] [--known ID] [--run-id RUN_ID]

lists PACKAGE's releases GOOD <= v <= BAD on the index, then binary-searches them. Each probe is a fresh uv venv
(``.cache/bisect/<row>/<version>``, the row's Python) with the row installed exactly as the matrix installs it
(``matrix.install_command``) plus ``--with PACKAGE==version``, and the chosen tier run exactly as the matrix runs it
(``matrix.run_row``); each probe's record lands in ``results/bisect-<timestamp>/<row>-<package>-<version>/``.
Releases that do not install are reported and skipped; the search goes on over the others.

A probe's record is judged again and read as the report reads it (runner/probe.py): bad where sglang or a dependency
fails, good where the tier passed (or failed only on listed upstream issues, or ran in part) with every check that
breaks at the bad end run and passed, untestable where it proved nothing, known-only where it failed only on listed
upstream issues without showing the break absent. The checks that break come from the row's latest run where the
tier broke; without one, BAD is probed first and its failures are the break searched (a BAD that fails only on
listed issues has no new break to search). ``--known ID`` searches instead where known-upstream entry ID began.

The search itself (:func:`search`) takes the probe as a function, so it is tested without installing anything.
It does not trust the endpoints: if BAD passes the answer is "no bad release", if GOOD already fails it is GOOD.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from mtpmatrix.runner import venvs
from mtpmatrix.runner.bisect_defaults import (  # noqa: F401  (read here by the canary's search and the tests)
    CHEAPEST,
    DEFAULT_TIER,
    breaking_checks,
    cheapest_failed_tier,
    default_row,
    latest_failing_run,
)
from mtpmatrix.runner.probe import (  # noqa: F401
    BAD,
    GOOD,
    KNOWN_ONLY,
    UNTESTABLE,
    Probe,
    classify_for_known,
    classify_record,
    failing_checks,
    judged,
)


class BisectError(RuntimeError):
    """Bad input or a broken environment (not a property of one release); the message is one line."""


@dataclass
class BisectResult:
    candidates: list[str]
    probes: list[Probe] = field(default_factory=list)
    first_bad: str | None = None
    last_good: str | None = None
    ambiguous: list[str] = field(default_factory=list)  # releases set aside (untestable, known-only) between
    #                                                     last_good and first_bad
    outcome: str = "inconclusive"  # found | good-fails | no-bad | known-only | inconclusive | stopped
    seconds: float = 0.0
    stopped: str | None = None  # why the search stopped early (--budget spent); first_bad/last_good: where it got

    def probe_of(self, version: str | None) -> Probe | None:
        return next((p for p in self.probes if p.version == version), None)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------------------------------------


def search(
    candidates: list[str],
    probe: Callable[[str], Probe],
    log: Callable[[str], None] = print,
    should_stop: Callable[[], str | None] | None = None,
    known: dict[str, str] | None = None,
) -> BisectResult:
    """Binary search for the first bad release in ``candidates`` (sorted oldest first).

    Assumes monotonicity (once bad, bad after). Both ends are unknown at the start (virtual good below the list,
    virtual bad above it), so a passing BAD or a failing GOOD is found rather than assumed away; this costs at most
    one probe more than trusting the ends. Untestable and known-only releases (neither good nor bad) are set aside
    and the search continues over the rest.

    ``known``: {release: good|bad} already measured (a canary's single-package probe), taken without probing.
    ``should_stop``: asked before each probe; a reason (a spent ``--budget``) ends the search cleanly with outcome
    ``stopped`` and the interval it got to (``last_good`` .. ``first_bad`` so far).
    """
    t0 = time.monotonic()
    res = BisectResult(candidates=list(candidates))
    n = len(candidates)
    lo, hi = -1, n  # candidates[lo] is known good, candidates[hi] known bad (virtual at -1 and n)
    for v, status in (known or {}).items():
        if v in candidates and status == BAD:
            hi = min(hi, candidates.index(v))
        elif v in candidates and status == GOOD:
            lo = max(lo, candidates.index(v))
    untestable: set[int] = set()
    step = 0
    while True:
        remaining = [i for i in range(lo + 1, hi) if i not in untestable]
        if not remaining:
            break
        reason = should_stop() if should_stop else None
        if reason:
            res.stopped = reason
            break
        i = remaining[(len(remaining) - 1) // 2]
        step += 1
        left = max(1, len(remaining) - 1).bit_length()
        log(f"[bisect] probe {step}: {candidates[i]} ({len(remaining)} candidate(s) left, ~{left} more probe(s))")
        p = probe(candidates[i])
        res.probes.append(p)
        if p.fatal:
            raise BisectError(f"{candidates[i]}: {p.detail} — no release can be tested here, stopping")
        log(
            f"[bisect] {candidates[i]}: {p.status.upper()}"
            + (f" — {p.detail}" if p.detail else "")
            + f" ({p.seconds:.0f} s)"
        )
        if p.status == GOOD:
            lo = i
        elif p.status == BAD:
            hi = i
        elif p.status in (UNTESTABLE, KNOWN_ONLY):  # neither good nor bad: set aside, the search goes on
            untestable.add(i)
        else:
            raise ValueError(f"probe returned unknown status {p.status!r}")
    res.last_good = candidates[lo] if lo >= 0 else None
    if res.stopped:
        res.first_bad = candidates[hi] if hi < n else None
        res.outcome = "stopped"
    elif hi < n:
        res.first_bad = candidates[hi]
        res.ambiguous = [candidates[i] for i in sorted(untestable) if lo < i < hi]
        res.outcome = "good-fails" if hi == 0 else "found"
    else:
        res.outcome = "no-bad" if lo >= 0 else "inconclusive"
    res.seconds = time.monotonic() - t0
    return res


def describe(res: BisectResult, package: str, tier: str | None = None) -> list[str]:
    """The human answer, a few lines."""
    out = []
    for p in res.probes:
        if p.status == UNTESTABLE:
            out.append(f"{package} {p.version}: {p.detail or 'untestable'} (skipped)")
        elif p.status == KNOWN_ONLY and res.outcome != "known-only":  # that outcome's own line says it
            out.append(f"{package} {p.version}: {p.detail} (neither good nor bad)")
    status = {p.version: p.status for p in res.probes}
    listed = sorted({k for p in res.probes if p.status == KNOWN_ONLY for k in p.known_upstream})
    if res.outcome in ("found", "good-fails"):
        p = res.probe_of(res.first_bad)
        line = f"first bad release: {package} {res.first_bad}"
        if res.last_good:
            line += f" (last good: {res.last_good})"
        elif res.outcome == "good-fails":
            line += f" — GOOD {res.first_bad} itself fails: the break is older than the range"
        else:
            line += " — no release below it could be tested"
        out.append(line)
        untestable = [v for v in res.ambiguous if status.get(v) != KNOWN_ONLY]
        known_only = [v for v in res.ambiguous if status.get(v) == KNOWN_ONLY]
        if untestable:
            out.append(f"  or one of the untestable releases just before it: {', '.join(untestable)}")
        if known_only:
            out.append(
                "  or one of the releases just before it that fail only on listed upstream issues: "
                f"{', '.join(known_only)}"
            )
        if p is not None:
            f = p.failure or {}
            out.append(
                f"  error: [{f.get('kind') or '?'}] {f.get('type') + ': ' if f.get('type') else ''}"
                f"{f.get('message') or p.detail}"
            )
            if f.get("frame") or f.get("raised_at"):
                out.append(f"  first frame: {f.get('frame') or f.get('raised_at')}")
            if p.record:
                out.append(f"  record: {p.record}")
    elif res.outcome == "stopped":
        c = res.candidates
        a = c.index(res.last_good) + 1 if res.last_good in c else 0
        b = c.index(res.first_bad) if res.first_bad in c else len(c) - 1
        out.append(
            f"stopped ({res.stopped}): the first bad release{'' if res.first_bad else ', if any,'} is one "
            f"of {c[a]} .. {c[b]} ({b - a + 1} release(s))"
        )
    elif res.outcome == "no-bad":
        out.append(
            f"no bad release: every testable release passes, up to {res.last_good}"
            + (
                " (BAD passes here: is the break in another package or tier?)"
                if res.candidates and res.last_good == res.candidates[-1]
                else ""
            )
        )
    elif res.outcome == "known-only":
        p = res.probes[0]
        out.append(
            f"no new break to search: BAD {package} {p.version} fails {tier + ' ' if tier else ''}only on "
            f"listed upstream issues ({', '.join(p.known_upstream)})"
        )
    elif listed:
        out.append("inconclusive: no release in the range showed the break or its absence")
    else:
        out.append("inconclusive: no release in the range could be tested")
    if listed and res.outcome not in ("found", "good-fails"):
        out.append(
            f"  a listed upstream issue is not the break searched; where one began: --known {' | '.join(listed)}"
        )
    out.append(f"{len(res.probes)} probe(s) over {len(res.candidates)} release(s) in {_dur(res.seconds)}")
    return out


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# ---------------------------------------------------------------------------------------------------------------
# candidates (the defaults read from past runs: runner/bisect_defaults.py)
# ---------------------------------------------------------------------------------------------------------------


def candidates(package: str, good: str, bad: str, *, releases: Callable | None = None) -> list[str]:
    """Releases GOOD <= v <= BAD from the index (``releases`` is injectable for tests)."""
    from packaging.version import InvalidVersion, Version

    from mtpmatrix.runner import index

    try:
        g, b = Version(good), Version(bad)
    except InvalidVersion as exc:
        raise BisectError(str(exc)) from None
    if g > b:
        raise BisectError(f"GOOD {good} is newer than BAD {bad}")
    pre = g.is_prerelease or b.is_prerelease
    try:
        if releases is not None:
            found = [Version(str(v)) for v in releases(package)]
            got = sorted(v for v in found if g <= v <= b)
        elif g == b:
            got = [v for v in index.releases(package, include_prereleases=pre) if v == g]
        else:
            got = index.between(package, good, bad, include_prereleases=pre)
    except index.IndexError_ as exc:
        raise BisectError(str(exc)) from None
    if not got:
        raise BisectError(f"no release of {package} between {good} and {bad} on the index")
    return [str(v) for v in got]


def search_from_bad_end(
    cands: list[str], factory: Callable[..., Callable[[str], Probe]], log: Callable[[str], None] = print
) -> BisectResult:
    """``search`` for a new break when no recorded run says which checks break: BAD is probed first and what fails
    there (listed upstream issues and the harness aside) is the break searched, so a probe that ran part of the
    tier, or failed only on listed issues, can still be judged by it. A BAD that passes ends the search ('no-bad'),
    one that fails only on listed issues too ('known-only': no new break to search); an untestable BAD leaves the
    search to the releases below it. ``factory(breaking=...)`` makes the probe."""
    t0 = time.monotonic()
    bad = cands[-1]
    log(f"[bisect] probe 0: BAD {bad} (what fails there is the break searched)")
    end = factory(breaking=None)(bad)
    if end.fatal:
        raise BisectError(f"{bad}: {end.detail} — no release can be tested here, stopping")
    log(
        f"[bisect] {bad}: {end.status.upper()}" + (f" — {end.detail}" if end.detail else "") + f" ({end.seconds:.0f} s)"
    )
    if end.status == BAD:
        res = search(cands, factory(breaking=frozenset(end.breaks)), log=log, known={bad: BAD})
    elif end.status == UNTESTABLE and len(cands) > 1:
        res = search(cands[:-1], factory(breaking=None), log=log)
        res.candidates = list(cands)
    else:
        res = BisectResult(
            candidates=list(cands),
            last_good=bad if end.status == GOOD else None,
            outcome={GOOD: "no-bad", KNOWN_ONLY: "known-only"}.get(end.status, "inconclusive"),
        )
    res.probes.insert(0, end)
    res.seconds = time.monotonic() - t0
    return res


# ---------------------------------------------------------------------------------------------------------------
# the real probe: a fresh venv, the matrix's install and suite
# ---------------------------------------------------------------------------------------------------------------


def make_venv(row, venv: Path) -> Path:
    """A fresh, empty uv venv with the row's Python at ``venv``; BisectError (one line) when uv cannot make it."""
    return venvs.make_venv(row, venv, BisectError)


def probe_id(row_id: str, package: str, version: str, also: list[str] = ()) -> str:
    """The results folder of one probe: row, package, release, and any companion overrides it carries."""
    return "-".join(
        [row_id, canonicalize_name(package), version, *(canonicalize_name(a.replace("==", "-")) for a in also)]
    )


@dataclass(frozen=True)
class ProbeSpec:
    """What every probe of one search shares: ``row`` installed with ``package==version`` (plus the ``also``
    overrides, e.g. a companion a canary moved) into a fresh venv under ``cache``, ``tier`` run, the record filed in
    ``results/run_id``. ``keep_venvs``: the venvs stay; ``reuse``: a probe whose record already has a verdict in
    the run (a resumed canary) is read back instead of run again."""

    row: Any
    package: str
    tier: str
    run_id: str
    results: Path
    cache: Path
    also: tuple[str, ...] = ()
    keep_venvs: bool = False
    reuse: bool = False


def make_probe(
    spec: ProbeSpec,
    *,
    log: Callable[[str], None] = print,
    breaking: frozenset[str] | None = None,
    known_issue=None,
) -> Callable[[str], Probe]:
    """The probe of ``spec``, one release at a time. Its record is judged again and classified
    (probe.classify_record; ``breaking``: the checks that fail at the bad end); with ``known_issue``, for the search
    of where that known-upstream entry began (probe.classify_for_known)."""
    from mtpmatrix.core import known_upstream
    from mtpmatrix.core.store import RunStore
    from mtpmatrix.runner import matrix

    matrix.find_uv(BisectError)
    try:
        issues = known_upstream.load()  # once for every probe of the search
    except ValueError as exc:
        raise BisectError(f"known upstream issues: {exc}") from None

    row, package, tier, results = spec.row, spec.package, spec.tier, Path(spec.results)

    def classify(rec: dict, version: str, seconds: float, path: str) -> Probe:
        if known_issue is not None:
            return classify_for_known(rec, tier, version, seconds, path, known_issue, issues=issues)
        return classify_record(rec, tier, version, seconds, path, breaking=breaking, issues=issues)

    def probe(version: str) -> Probe:
        t0 = time.monotonic()
        pid = probe_id(row.id, package, version, list(spec.also))
        path = str(results / spec.run_id / pid / "row.json")
        store = RunStore(results, spec.run_id)
        if spec.reuse and store.finished(pid):
            log(f"[bisect] {package} {version}: reusing {path}")
            rec = store.load_row(pid)  # its own install + suite time, not the 0 s of reading it back
            spent = sum((rec.get(k) or {}).get("seconds") or 0.0 for k in ("install", "suite"))
            return classify(rec, version, spent, path)
        venv = make_venv(row, Path(spec.cache) / row.id / version)
        probe_row = dataclasses.replace(row, id=pid)
        opts = matrix.Options(
            overrides=[f"{package}=={version}", *spec.also], run_id=spec.run_id, results=results, tiers=tier
        )
        try:
            record = matrix.run_row(probe_row, venv, opts, log=log)
        finally:
            if not spec.keep_venvs:
                shutil.rmtree(venv, ignore_errors=True)
        return classify(record, version, time.monotonic() - t0, path)

    return probe
