"""Comparisons: GSM8K per question between rows of one run, and a run against a baseline run (``--baseline``):
row-, tier- and check-level changes, metric deltas, per-question flips and the regressions they add up to.

The per-question statistics are stats.paired_compare (exact McNemar); this module only names its numbers the way
summary.json has always named them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpmatrix.core import stats
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.schema import FAILING, KNOWN_UPSTREAM, PARTIAL, TIERS
from mtpmatrix.report.checks import COLUMN_METRICS, first_frame, is_number, question_records

ALPHA = 0.05  # McNemar p below this is a significant change (bold in the report; a drop is a regression)


def paired_comparison(a: dict[int, bool], b: dict[int, bool]) -> dict[str, Any]:
    """McNemar on the questions both sides answered. right_in_a_only: right in A, wrong in B; right_in_b_only: the
    reverse."""
    cmp = stats.paired_compare(a, b)
    return {
        "n": cmp.n,
        "a_correct": cmp.correct_a,
        "b_correct": cmp.correct_b,
        "right_in_a_only": len(cmp.only_a),
        "right_in_b_only": len(cmp.only_b),
        "p_value": cmp.p_value,
        "flipped_to_wrong": cmp.only_a,  # A right, B wrong
        "flipped_to_right": cmp.only_b,  # A wrong, B right
    }


def paired_across_rows(run_dir: Path, rows: dict[str, RowRecord]) -> list[dict[str, Any]]:
    """Per-question comparisons: the same case in two rows, and within a row each MTP case against the no-MTP case
    of its pair (key ``E4B-nomtp → E4B-topk1``, row A = row B)."""
    per_row = {rid: question_records(rec, run_dir / rid) for rid, rec in rows.items()}
    keys = sorted({k for qs in per_row.values() for k in qs})
    out = []
    for key in keys:
        have = [rid for rid in sorted(per_row) if key in per_row[rid]]
        for i, a in enumerate(have):
            for b in have[i + 1 :]:
                cmp = paired_comparison(per_row[a][key]["questions"], per_row[b][key]["questions"])
                out.append({"key": key, "row_a": a, "row_b": b, **cmp})
    for rid in sorted(per_row):
        qs = per_row[rid]
        for key in sorted(qs):
            base = key.rsplit("-", 1)[0] + "-nomtp"
            if key != base and base in qs:
                cmp = paired_comparison(qs[base]["questions"], qs[key]["questions"])
                out.append({"key": f"{base} → {key}", "row_a": rid, "row_b": rid, **cmp})
    return out


def _change(before: str | None, after: str | None) -> tuple[str, str]:
    """(direction better/worse/same, label) for a verdict going from ``before`` to ``after``."""
    if before is None and after is None:
        return "same", "absent"
    if before is None:
        return ("worse", "new row, failing") if after in FAILING else ("same", "new row")
    if after is None:
        return "same", "not in this run"
    rank = {"passed": 2, KNOWN_UPSTREAM: 2, PARTIAL: 1, "skipped": 1, "pending": 1, "failed": 0, "error": 0}
    rb, ra = rank.get(before, 1), rank.get(after, 1)
    if before == after or (rb == ra == 0):
        return "same", "still failing" if ra == 0 else "same"
    if ra == 0:
        return "worse", "new failure"
    if rb == 0:
        return "better", "fixed" if ra == 2 else "no longer fails (not run)"
    if ra == 2:
        return "better", "now runs whole and passes"
    if rb == 2:
        return "worse", "now partial" if after == PARTIAL else "no longer runs"
    return "same", "same"


def compare_row(
    rid: str, cur: RowRecord | None, base: RowRecord | None, cur_dir: Path, base_dir: Path
) -> dict[str, Any]:
    """One row against its baseline record (``cur_dir``/``base_dir``: their row folders): the row's and each tier's
    change, the checks that now fail (``new_failures``) or now pass (``fixed``), metric deltas and per-question
    comparisons. ``rid`` names the row in what it returns (a candidate compared with its base release keeps its own
    id)."""
    new_failures: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    deltas: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    vb = base.get("verdict") if base else None
    va = cur.get("verdict") if cur else None
    direction, label = _change(vb, va)
    tier_changes: dict[str, dict[str, Any]] = {}
    entry = {"row": rid, "before": vb, "after": va, "change": direction, "label": label, "tiers": tier_changes}
    ctiers, btiers = (cur or {}).get("tiers") or {}, (base or {}).get("tiers") or {}
    if cur and (cur.get("install") or {}).get("verdict") == "failed":
        ib = ((base or {}).get("install") or {}).get("verdict")
        d, lab = _change(ib, "failed")
        tier_changes["install"] = {
            "before": ib,
            "after": "failed",
            "change": d,
            "label": "install fails" if d == "worse" else lab,
        }
    for tier in [t for t in TIERS if t in ctiers or t in btiers]:
        tb, ta = (btiers.get(tier) or {}).get("verdict"), (ctiers.get(tier) or {}).get("verdict")
        d, lab = _change(tb, ta)
        tier_changes[tier] = {"before": tb, "after": ta, "change": d, "label": lab}
        bchecks = {c["id"]: c for c in (btiers.get(tier) or {}).get("checks") or []}
        for c in (ctiers.get(tier) or {}).get("checks") or []:
            old = bchecks.get(c["id"])
            ob, oa = (old or {}).get("outcome"), c.get("outcome")
            f = c.get("failure") or {}
            item = {
                "row": rid,
                "tier": tier,
                "check": c["id"],
                "before": ob,
                "after": oa,
                "before_known_upstream": (old or {}).get("known_upstream"),
                "kind": f.get("kind"),
                "message": f.get("message"),
                "frame": first_frame(f),
            }
            if oa in FAILING and ob not in FAILING and not c.get("known_upstream"):
                new_failures.append(item)
            elif ob in FAILING and oa == "passed":
                fixed.append(item)
            if old:
                deltas += _metric_deltas(rid, tier, c["id"], old.get("metrics") or {}, c.get("metrics") or {})
    if (
        cur
        and (cur.get("install") or {}).get("verdict") == "failed"
        and ((base or {}).get("install") or {}).get("verdict") != "failed"
    ):
        f = cur["install"].get("failure") or {}
        new_failures.append(
            {
                "row": rid,
                "tier": "install",
                "check": None,
                "before": "passed" if base else None,
                "after": "failed",
                "kind": "install",
                "message": f.get("message"),
                "frame": None,
            }
        )
    if cur and base:
        qa = question_records(base, base_dir)
        qb = question_records(cur, cur_dir)
        for key in sorted(set(qa) & set(qb)):
            cmp = paired_comparison(qa[key]["questions"], qb[key]["questions"])
            paired.append({"row": rid, "key": key, **cmp})
    return {"entry": entry, "new_failures": new_failures, "fixed": fixed, "metric_deltas": deltas, "paired": paired}


def base_row_of(rid: str, record: RowRecord | None, base_rows: dict[str, RowRecord]) -> str | None:
    """The baseline row ``rid`` is compared with: its own id, or for a candidate without one, its base release's
    (row.json's ``candidate.base_row``)."""
    if rid in base_rows:
        return rid
    base = ((record or {}).get("candidate") or {}).get("base_row") if isinstance(record, dict) else None
    return base if isinstance(base, str) and base in base_rows else None


def compare_runs(
    cur_dir: Path, cur_rows: dict[str, RowRecord], base_dir: Path, base_rows: dict[str, RowRecord]
) -> dict[str, Any]:
    """Row-, tier- and check-level changes between a baseline run and this run, plus metric deltas. A candidate
    row the baseline lacks is compared with its base release's row there."""
    rows_out: list[dict[str, Any]] = []
    new_failures: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    deltas: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    matched = {rid: base_row_of(rid, rec, base_rows) for rid, rec in cur_rows.items()}
    used = set(matched.values())
    for rid in sorted(set(cur_rows) | (set(base_rows) - used)):
        bid = matched.get(rid, rid)
        one = compare_row(
            rid,
            cur_rows.get(rid),
            base_rows.get(bid) if bid else None,
            Path(cur_dir) / rid,
            Path(base_dir) / (bid or rid),
        )
        if bid not in (None, rid):
            one["entry"]["base_row"] = bid
        rows_out.append(one["entry"])
        new_failures += one["new_failures"]
        fixed += one["fixed"]
        deltas += one["metric_deltas"]
        paired += one["paired"]
    return {
        "rows": rows_out,
        "new_failures": new_failures,
        "fixed": fixed,
        "metric_deltas": deltas,
        "paired": paired,
        "new_rows": sorted(rid for rid, bid in matched.items() if bid is None),
        "missing_rows": sorted(set(base_rows) - used - set(cur_rows)),
    }


def _metric_deltas(
    rid: str, tier: str, check: str, before: dict[str, Any], after: dict[str, Any]
) -> list[dict[str, Any]]:
    """Numeric metrics of one check that changed, the column metrics first."""
    out = []
    for name in sorted(set(before) & set(after), key=lambda n: (n not in COLUMN_METRICS, n)):
        if is_number(before[name]) and is_number(after[name]) and before[name] != after[name]:
            out.append(
                {
                    "row": rid,
                    "tier": tier,
                    "check": check,
                    "metric": name,
                    "before": before[name],
                    "after": after[name],
                    "delta": after[name] - before[name],
                }
            )
    return out


def regressions(base: dict[str, Any]) -> list[dict[str, Any]]:
    """What a baseline comparison holds against this run: new failures, and GSM8K cases whose accuracy dropped
    significantly (McNemar p < ALPHA) on the same questions."""
    out = [dict(r, why="new failure") for r in base["new_failures"]]
    out += [
        {
            "row": p["row"],
            "tier": "gsm8k",
            "check": p["key"],
            "why": "significant accuracy drop",
            "before": p["a_correct"] / p["n"],
            "after": p["b_correct"] / p["n"],
            "p_value": p["p_value"],
        }
        for p in base["paired"]
        if p["n"] and p["p_value"] < ALPHA and p["b_correct"] < p["a_correct"]
    ]
    return out
