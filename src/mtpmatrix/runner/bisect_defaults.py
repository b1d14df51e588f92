"""What a bisect searches when the command line does not say: the row, the tier and the checks that break, read
from the store's past matrix runs (each record judged again, as the report reads it)."""

from __future__ import annotations

from pathlib import Path

from mtpmatrix.core import expected, paths
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.schema import FAILING, TIERS
from mtpmatrix.core.store import is_matrix_run, latest_run_id, row_files
from mtpmatrix.runner.probe import failing_checks, judged

CHEAPEST = ("reference", "contract", "smoke", "gsm8k")  # cheapest tier first
DEFAULT_TIER = "contract"
assert sorted(CHEAPEST) == sorted(TIERS)


def _row_records(results: Path, row_id: str):
    """(run id, row record) of each matrix run that finished the row, newest first."""
    results = Path(results)
    runs = (
        sorted((p for p in results.iterdir() if is_matrix_run(p)), key=lambda p: p.name, reverse=True)
        if results.is_dir()
        else []
    )
    for run in runs:
        f = run / row_id / "row.json"
        if not f.exists():
            continue
        rec = read_json(f)
        if rec.get("verdict") in (None, "pending"):  # unfinished there: look further back
            continue
        yield run.name, rec


def cheapest_failed_tier(results: Path, row_id: str) -> tuple[str, str | None]:
    """(tier, run id it came from): the cheapest tier broken (expected.tier_state of the record judged again) in
    the latest matrix run of the row."""
    for run, rec in _row_records(results, row_id):
        tiers = judged(rec).get("tiers") or {}
        failed = [t for t in CHEAPEST if expected.tier_state(tiers.get(t)) == expected.BROKEN]
        return (failed[0] if failed else DEFAULT_TIER), run
    return DEFAULT_TIER, None


def latest_failing_run(results: Path, row_id: str, tier: str) -> str | None:
    """The latest matrix run in which the row's ``tier`` is broken, judged again (None when there is none)."""
    for run, rec in _row_records(results, row_id):
        if expected.tier_state((judged(rec).get("tiers") or {}).get(tier)) == expected.BROKEN:
            return run
    return None


def default_row(results: Path, rows: list) -> str:
    """The first failing row of the latest matrix run, else the row tagged 'ci', else the first row."""
    latest = latest_run_id(results)
    if latest:
        for f in row_files(Path(results) / latest):
            if read_json(f).get("verdict") in FAILING and any(r.id == f.parent.name for r in rows):
                return f.parent.name
    ci = [r.id for r in rows if paths.CI_TAG in r.tags]
    return ci[0] if ci else rows[0].id


def breaking_checks(results: Path, run_id: str | None, row_id: str, tier: str) -> frozenset[str] | None:
    """``failing_checks`` of the row's record in ``run_id`` (None when there is none to read)."""
    f = Path(results) / run_id / row_id / "row.json" if run_id else None
    return failing_checks(read_json(f), tier) if f is not None and f.exists() else None
