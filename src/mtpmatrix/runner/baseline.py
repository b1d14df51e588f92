"""A canary's baseline: the pinned row's latest run that proves it passes the tiers the canary breaks.

A canary blames its moved packages for a tier only against a run of its pinned row that passed that tier: its
record judged again (expected.rejudge_record) reads PROVEN or KNOWN_ONLY there (expected.tier_state). Walking the
pinned row's finished, plain runs (no overrides, no canary) newest first, by the time each record says it ran:

  * a run that proved nothing for those tiers (a pytest usage error, a harness failure, partial, skipped) is passed
    over, and so is a run of another suite (both records carry a suite fingerprint and they differ);
  * a run that passed them all is the baseline;
  * a run that broke one of them ends the walk without a baseline: the latest evidence says the pinned row fails
    there too, and an older pass would blame the moved packages for it.

Without a baseline the culprit search takes no release as good: it probes the pinned row's own releases too, so
a pinned row that fails the tier itself is shown failing rather than assumed passing.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core import expected
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.schema import ROW_FILE
from mtpmatrix.core.store import is_matrix_run, recorded_time, run_time
from mtpmatrix.runner.bisect import CHEAPEST
from mtpmatrix.runner.probe import judged

PASSING = (expected.PROVEN, expected.KNOWN_ONLY)


def suite_fingerprint(record: dict) -> str | None:
    """The suite fingerprint a row record carries (``record["suite"]["fingerprint"]``); None when it has none (a
    record written before fingerprints, or by a runner that does not write one): unknown, never a mismatch."""
    suite = record.get("suite")
    fp = suite.get("fingerprint") if isinstance(suite, dict) else None
    return fp if isinstance(fp, str) and fp else None


def same_suite(a: dict, b: dict) -> bool:
    """Whether two row records may be compared: their suite fingerprints agree, or either is unknown."""
    fa, fb = suite_fingerprint(a), suite_fingerprint(b)
    return fa is None or fb is None or fa == fb


@dataclass
class Baseline:
    row: str
    run: str | None = None  # the run that passed every tier compared; None: no baseline
    tiers: dict = field(default_factory=dict)  # that run's judged tiers
    why: str = ""  # without a baseline: why none is complete, one line

    def as_dict(self) -> dict:
        return {
            "row": self.row,
            "run": self.run,
            "tiers": {t: v.get("verdict") for t, v in self.tiers.items()},
            "why": self.why or None,
        }


def _plain_runs(results: Path, row_id: str):
    """(run id, record) of each finished run of the row without overrides or a canary, the one that recorded its row
    last first (store.recorded_time: the record's own time, never its file's); an unreadable record is no run."""
    results = Path(results)
    never = _dt.datetime.min.replace(tzinfo=_dt.UTC)
    found = []
    for run in (p for p in results.iterdir() if is_matrix_run(p)) if results.is_dir() else ():
        f = run / row_id / ROW_FILE
        if not f.exists():
            continue
        try:
            rec = read_json(f)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            found.append((recorded_time(rec) or run_time(run) or never, run.name, rec))
    for _, name, rec in sorted(found, key=lambda x: x[:2], reverse=True):
        if rec.get("verdict") not in (None, "pending") and not rec.get("overrides") and not rec.get("canary"):
            yield name, rec


def pinned_baseline(results: Path, row_id: str, tiers: list[str], against: dict | None = None) -> Baseline:
    """The baseline of ``row_id`` for ``tiers`` (module docstring); ``against``: the canary's record, whose suite
    fingerprint a run must share when both carry one."""
    passed_over = 0
    for run, rec in _plain_runs(results, row_id):
        if against is not None and not same_suite(rec, against):
            passed_over += 1
            continue
        judged_tiers = judged(rec).get("tiers") or {}
        states = {t: expected.tier_state(judged_tiers.get(t)) for t in tiers}
        broken = [t for t, s in states.items() if s == expected.BROKEN]
        if broken:
            return Baseline(row_id, why=f"its latest run with a verdict on {', '.join(broken)} ({run}) breaks it")
        if all(s in PASSING for s in states.values()):
            return Baseline(row_id, run, {t: judged_tiers[t] for t in tiers})
        passed_over += 1
    if not passed_over:
        return Baseline(row_id, why="no finished run of it")
    return Baseline(row_id, why=f"no run of it proves {', '.join(tiers)}: {passed_over} passed over")


def broken_tiers(canary_tiers: dict) -> list[str]:
    """The tiers a canary breaks (judged tiers, expected.tier_state BROKEN), cheapest first: each needs a baseline
    to blame the moved packages; a harness failure or a partial run blames nothing."""
    return [t for t in CHEAPEST if expected.tier_state(canary_tiers.get(t)) == expected.BROKEN]
