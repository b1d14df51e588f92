"""The closest passing row of each failing row: the passing row (of this run, or of the baseline run) with the
fewest packages that differ from it -- in freeze.txt, or in the pins when the failing row never installed -- ties
broken towards the same sglang, with the differing versions. Nothing here formats text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpmatrix.core.evidence.versions import MAIN_PACKAGES, pins_with_overrides
from mtpmatrix.core.record_types import RowRecord, RowSummary
from mtpmatrix.core.schema import FAILING, PARTIAL
from mtpmatrix.core.store import read_freeze


def closest_passing(
    target: dict[str, str],
    candidates: dict[str, dict[str, str]],
    *,
    target_sglang: str | None,
    sglang_of: dict[str, str | None],
    keys_only: bool = False,
) -> dict[str, Any] | None:
    """The candidate with the fewest differing packages; ties go to the same sglang, then to the row id.

    ``keys_only``: compare only the packages ``target`` names (the failing row never installed, so only its pins
    are known).
    """
    best = None
    for rid, pkgs in candidates.items():
        names = set(target) if keys_only else set(target) | set(pkgs)
        diff = sorted(n for n in names if target.get(n) != pkgs.get(n))
        key = (len(diff), sglang_of.get(rid) != target_sglang, rid)
        if best is None or key < best[0]:
            best = (key, rid, diff)
    if best is None:
        return None
    _, rid, diff = best
    diff.sort(key=lambda n: (MAIN_PACKAGES.index(n) if n in MAIN_PACKAGES else len(MAIN_PACKAGES), n))
    return {
        "row": rid,
        "distance": len(diff),
        "differences": [{"package": n, "this": target.get(n), "other": candidates[rid].get(n)} for n in diff],
    }


def attach_closest_passing(
    run_dir: Path,
    rows: dict[str, RowRecord],
    summaries: dict[str, RowSummary],
    baseline_dir: Path | None = None,
    baseline_rows: dict[str, RowRecord] | None = None,
) -> None:
    """Attach to every failing row the closest passing row: from this run, and, with a baseline (its folder and its
    judged records, summary.read_judged_run), from the baseline run too (an upgrade probe re-runs one row, so its
    nearest good neighbour is usually the baseline's)."""
    freezes = {rid: read_freeze(run_dir / rid) for rid in rows}
    passing = {
        rid: (freezes[rid] or pins_with_overrides(rows[rid]))
        for rid, s in summaries.items()
        if s["verdict"] in ("passed", PARTIAL)
    }
    sglang_of = {rid: summaries[rid]["versions"].get("sglang") for rid in summaries}
    if baseline_dir is not None and baseline_rows is not None:
        for rid, rec in baseline_rows.items():
            if rec.get("verdict") in ("passed", PARTIAL):
                key = f"{rid} @ {Path(baseline_dir).name}"
                passing[key] = read_freeze(Path(baseline_dir) / rid) or pins_with_overrides(rec)
                sglang_of[key] = (rec.get("versions") or {}).get("sglang")
    for rid, s in summaries.items():
        if s["verdict"] not in FAILING:
            continue
        if not passing:
            s["closest_passing"] = None
            continue
        source = "freeze" if freezes[rid] else "pins"
        target = freezes[rid] or pins_with_overrides(rows[rid])
        best = closest_passing(
            target, passing, target_sglang=sglang_of.get(rid), sglang_of=sglang_of, keys_only=source == "pins"
        )
        if best:
            best["source"] = source
        s["closest_passing"] = best
