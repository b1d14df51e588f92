"""The summary model: one run (``results/<run-id>/``, read through core.store) as the plain dict that
summary.json holds and both templates render: its rows (row_summary), each failing row's closest passing row
(closest), per tier over all rows what ran whole, in part or not at all, the skip reasons grouped, and the verdict.
Nothing here formats text.

The verdict says what was proven. Every tier verdict is derived again from the stored checks (expected.judge_tiers:
stored known-upstream tags and verdicts are never trusted). A run QUALIFIES only when every tier is complete -- its
whole expected set (mtpmatrix.core.expected) ran and passed -- in every row; a run where nothing failed but some tier is
not complete is 'partial', and 'not-proven' (exit 3) when a --require'd tier is not complete in every row. Failures
that match a known_upstream.json entry's signature are shown as "known upstream" next to their row and do not fail
it.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mtpmatrix.core import expected, schema
from mtpmatrix.core.evidence import records as record_shapes
from mtpmatrix.core.evidence import run as evidence_of_run
from mtpmatrix.core.record_types import RowRecord, RowSummary, Summary
from mtpmatrix.core.schema import KNOWN_UPSTREAM, PARTIAL, TIERS, UNPROVEN, VERDICTS
from mtpmatrix.core.store import read_run, reading_once
from mtpmatrix.report import canaries, candidates, compare
from mtpmatrix.report.closest import attach_closest_passing
from mtpmatrix.report.row_summary import row_summary

if TYPE_CHECKING:
    from mtpmatrix.core.known_upstream import KnownIssue

REPORT_DIR = "report"  # results/<run-id>/report/ unless --out says otherwise
RAN = ("passed", KNOWN_UPSTREAM, PARTIAL, UNPROVEN, "error")  # a tier where something ran and nothing failed sglang
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_PROVEN = 0, 1, 2, 3


class ReportError(ValueError):
    """Bad input for the report (a run without rows, an unknown tier, no jinja2); the message is one line. A run
    that cannot be found or read raises store.StoreError, also one line."""


# ---------------------------------------------------------------------------------------------------------------
# reading a run: every verdict derived again
# ---------------------------------------------------------------------------------------------------------------


def rejudge(record: RowRecord, issues: list[KnownIssue] | None = None) -> RowRecord:
    """expected.rejudge_record: the one re-judging of a row record, shared with bisect and the canary."""
    return expected.rejudge_record(record, issues)


def read_judged_run(run_dir: Path) -> dict[str, RowRecord]:
    """store.read_run with every row re-judged (``rejudge``): what the report and the baseline comparison read. A
    record whose shape is off (evidence.records) stands as a shell with no tiers and the reason, never a crash."""
    from mtpmatrix.core.evidence import checkout

    try:
        issues = checkout.known_issues()  # the commit's list when the checkout's differs: no uncommitted excuse
    except ValueError as exc:
        raise ReportError(f"known upstream issues: {exc}") from None
    out: dict[str, RowRecord] = {}
    for rid, rec in read_run(run_dir).items():
        problems = (
            rec.get("unreadable")
            if isinstance(rec, dict) and rec.get("unreadable")
            else record_shapes.shape_problems(rec)
        )
        out[rid] = record_shapes.shell(rid, problems) if problems else rejudge(rec, issues)
    return out


# ---------------------------------------------------------------------------------------------------------------
# across rows
# ---------------------------------------------------------------------------------------------------------------


def _skip_groups(summaries: dict[str, RowSummary]) -> list[dict[str, Any]]:
    """Skip reasons, one line each: identical reasons across rows and tiers grouped together."""
    groups: dict[str, dict[str, Any]] = {}

    def add(reason: str, row: str, tier: str, checks: int | None) -> None:
        reason = re.sub(rf"^{re.escape(tier)} tier:?\s*", "", (reason or "no reason given").strip())
        reason = reason.splitlines()[0] if reason else "no reason given"
        g = groups.setdefault(reason, {"reason": reason, "tiers": [], "rows": [], "checks": 0})
        if tier not in g["tiers"]:
            g["tiers"].append(tier)
        if row not in g["rows"]:
            g["rows"].append(row)
        g["checks"] += checks or 0

    for rid, s in summaries.items():
        for tier, t in s["tiers"].items():
            if t["verdict"] == "skipped":
                add(t.get("reason") or "", rid, tier, None)
            else:
                for sc in t["skipped_checks"]:
                    add(sc["reason"], rid, tier, 1)
    for g in groups.values():
        g["tiers"].sort(key=lambda t: TIERS.index(t) if t in TIERS else len(TIERS))
    return sorted(groups.values(), key=lambda g: (-len(g["rows"]), g["reason"]))


def _tier_status(
    summaries: dict[str, RowSummary], tiers: list[str], skips: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per tier over all rows: which rows ran it whole (complete: passed or known upstream), which ran part of it
    (partial, with what did not run), which did not run it, and one short reason for those ('no GPU' when every skip
    of the tier says a GPU is missing)."""
    out = {}
    for tier in tiers:
        verdict = {rid: s["tiers"][tier]["verdict"] if tier in s["tiers"] else None for rid, s in summaries.items()}
        complete = [rid for rid, v in verdict.items() if expected.complete(v)]
        partial = [rid for rid, v in verdict.items() if v == PARTIAL]
        # rows whose tier ran but proves nothing: its records cannot show it, or only the harness failed
        unproven = [
            rid
            for rid, s in summaries.items()
            if tier in s["tiers"]
            and rid not in partial
            and s["tiers"][tier]["state"] == expected.NOT_PROVEN
            and verdict[rid] not in ("skipped", None)
        ]
        not_run = [
            rid
            for rid, v in verdict.items()
            if v in ("skipped", None)
            and summaries[rid]["install"]["verdict"] != "failed"
            and summaries[rid]["verdict"] != UNPROVEN
        ]
        reasons = [
            g["reason"] for g in skips if tier in g["tiers"] and set(g["rows"]) & set(not_run) and not g["checks"]
        ]
        if reasons and all("GPU" in r for r in reasons):
            why = "no GPU"
        elif reasons and all("not selected" in r for r in reasons):
            why = "not selected"
        else:
            why = reasons[0] if reasons else ""
        out[tier] = {
            "complete": complete,
            "partial": partial,
            "not_run": not_run,
            "why": why,
            "unproven": unproven,
            "unproven_why": {
                rid: summaries[rid]["tiers"][tier]["unproven"]
                or [summaries[rid]["tiers"][tier].get("reason") or "the harness failed"]
                for rid in unproven
            },
            "missing": {rid: summaries[rid]["tiers"][tier]["missing_groups"] for rid in partial},
        }
    return out


def missing_required(summary: Summary, tiers: Iterable[str] | None = None) -> list[str]:
    """The --require'd tiers (``tiers``; all of them without --require) that are not proven -- their whole expected
    set ran and passed, on records that show it -- in every row."""
    status = summary["tier_status"]
    unproven_rows = [r["id"] for r in summary["rows"] if r["verdict"] == UNPROVEN]
    return [
        t
        for t in tiers or summary["required_tiers"] or TIERS
        if t not in status
        or status[t]["not_run"]
        or status[t]["partial"]
        or status[t]["unproven"]
        or any(rid not in status[t]["complete"] for rid in unproven_rows)
    ]


def _verdict(summary: Summary) -> tuple[str, int]:
    """(state, exit status): 'fails' (1) when a row broke on records that show it (a failure of sglang or its
    dependencies, listed upstream bugs aside); 'not-proven' (3) when the run's evidence does not hold (no manifest,
    another suite), a planned row did not run, or a required tier is not proven in every row (partial, skipped,
    interrupted, harness only, a record that cannot show what it claims); else 'qualifies' (0) when the required
    tiers are every tier, 'required-proven' (0) when --require named fewer."""
    if summary["failing_rows"]:
        return "fails", EXIT_FAILED
    if summary["nothing_ran"] or summary["evidence"]["run"] or missing_required(summary):
        return "not-proven", EXIT_NOT_PROVEN
    if not missing_required(summary, TIERS):
        return "qualifies", EXIT_OK
    return "required-proven", EXIT_OK


def build_summary(
    run_dir: Path,
    *,
    baseline_dir: Path | None = None,
    out_dir: Path | None = None,
    require: list[str] | tuple[str, ...] = (),
) -> Summary:
    """The summary of one run, from one judgement of its records, each file read once (store.reading_once): the
    headline, the tables, the canary section and summary.json all show the same verdicts."""
    with reading_once():
        return _build_summary(run_dir, baseline_dir=baseline_dir, out_dir=out_dir, require=require)


def _release_entries(
    summaries: dict[str, RowSummary], key: Literal["stale_known_upstream", "unshown_known_upstream"]
) -> list[dict[str, Any]]:
    """The known-upstream entries listed under ``key`` in the tiers of every row that is not a candidate, each with
    its row and tier."""
    return [
        dict(k, row=rid, tier=t)
        for rid, s in summaries.items()
        if not s["candidate"]
        for t, tv in s["tiers"].items()
        for k in tv[key]
    ]


def _build_summary(
    run_dir: Path,
    *,
    baseline_dir: Path | None,
    out_dir: Path | None,
    require: list[str] | tuple[str, ...],
) -> Summary:
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / REPORT_DIR
    rows = read_judged_run(run_dir)
    if not rows:
        raise ReportError(f"run {run_dir.name!r} ({run_dir}) has no rows (no */{schema.ROW_FILE})")
    found = evidence_of_run.judge_run(run_dir, rows)
    rows = dict(sorted(rows.items()))
    summaries = {rid: row_summary(run_dir, rid, rec, out_dir) for rid, rec in rows.items()}
    base_rows = read_judged_run(baseline_dir) if baseline_dir is not None else None
    attach_closest_passing(run_dir, rows, summaries, baseline_dir, base_rows)
    counts = {v: 0 for v in VERDICTS}
    for s in summaries.values():
        counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    failing = [rid for rid, s in summaries.items() if s["state"] == expected.BROKEN]
    incomplete = [rid for rid, s in summaries.items() if s["verdict"] in (None, "pending")]
    tiers = [t for t in TIERS if any(t in s["tiers"] for s in summaries.values())] or list(TIERS)
    ran_any = any(t["verdict"] in RAN for s in summaries.values() for t in s["tiers"].values())
    skips = _skip_groups(summaries)
    known = [
        dict(k, row=rid, tier=t)
        for rid, s in summaries.items()
        for t, tv in s["tiers"].items()
        for k in tv["known_upstream"]
    ]
    # a candidate that passes a known-upstream entry's checks fixes it; the release still has it (candidates.py)
    stale = _release_entries(summaries, "stale_known_upstream")
    # an entry whose bug shows only under a condition (shows_when) and did not: not stale, listed apart; a candidate
    # row's are in its own section (candidates.py), as its stale ones are
    unshown = _release_entries(summaries, "unshown_known_upstream")
    summary: Summary = {
        "schema": schema.SCHEMA,
        "run_id": run_dir.name,
        "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "required_tiers": list(require),
        "evidence": found,
        "verdict_counts": {k: v for k, v in counts.items() if v},
        "failing_rows": failing,
        "incomplete_rows": incomplete,
        "nothing_ran": not ran_any,
        "tiers": tiers,
        "tier_status": _tier_status(summaries, tiers, skips),
        "row_verdicts": {rid: s["verdict"] for rid, s in summaries.items()},
        "tier_verdicts": {rid: {t: tv["verdict"] for t, tv in s["tiers"].items()} for rid, s in summaries.items()},
        "rows": list(summaries.values()),
        "skips": skips,
        "known_upstream": known,
        "stale_known_upstream": stale,
        "unshown_known_upstream": unshown,
        "relaunched": [dict(x, row=rid) for rid, r in summaries.items() for x in r["relaunched"]],
        "paired": compare.paired_across_rows(run_dir, rows),
        "baseline": None,
        "regressions": [],
        "candidate_text": candidates.headline_text(rows),
    }
    summary["verdict"], summary["exit_status"] = _verdict(summary)
    # True only when every tier ran whole and passed in every planned row, on records that show it: a CPU-only run
    # never 'qualifies' a release.
    summary["qualifies"] = summary["verdict"] == "qualifies"
    if baseline_dir is not None and base_rows is not None:
        base = compare.compare_runs(run_dir, rows, Path(baseline_dir), base_rows)
        base["run_id"] = Path(baseline_dir).name
        summary["baseline"] = base
        summary["regressions"] = compare.regressions(base)
    summary["candidates"] = candidates.section(run_dir, rows, baseline_dir, base_rows)
    section = canaries.section(run_dir, rows)  # the judged records: the verdicts the table shows
    if section is not None:
        summary["canaries"] = section
    return summary
