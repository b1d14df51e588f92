"""The summary model: one run (``results/<run-id>/``, read through core.store) as the plain dict that
summary.json holds and both templates render. Nothing here formats text.

The verdict says what was proven. Every tier verdict is derived again from the stored checks (expected.judge_tiers:
stored known-upstream tags and verdicts are never trusted). A run QUALIFIES only when every tier is complete -- its
whole expected set (mtpmatrix.core.expected) ran and passed -- in every row; a run where nothing failed but some tier is
not complete is 'partial', and 'not-proven' (exit 3) when a --require'd tier is not complete in every row. Failures
that match a known_upstream.json entry's signature are shown as "known upstream" next to their row and do not fail
it.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpmatrix.core import expected, schema, stats
from mtpmatrix.core.evidence import records as record_shapes
from mtpmatrix.core.evidence import run as evidence_of_run
from mtpmatrix.core.evidence.judge import pins_with_overrides
from mtpmatrix.core.record_types import (
    Build,
    MissingRecord,
    RowRecord,
    RowSummary,
    Summary,
    TierRecord,
    TierSummary,
)
from mtpmatrix.core.schema import FAILING, KNOWN_UPSTREAM, PARTIAL, TIERS, UNPROVEN, VERDICTS
from mtpmatrix.core.store import read_freeze, read_run, reading_once, row_verdict
from mtpmatrix.report import canaries, candidates, compare, figures
from mtpmatrix.report.checks import COLUMN_METRICS, case_of, is_number, question_records, short_check

if TYPE_CHECKING:
    from mtpmatrix.core.known_upstream import KnownIssue

REPORT_DIR = "report"  # results/<run-id>/report/ unless --out says otherwise
LOG_FILES = (schema.INSTALL_LOG, schema.PYTEST_LOG, schema.FREEZE_FILE, schema.CHECK_FILE, schema.JUNIT_FILE)
RAN = ("passed", KNOWN_UPSTREAM, PARTIAL, UNPROVEN, "error")  # a tier where something ran and nothing failed sglang
MAIN_PACKAGES = ("sglang", "transformers", "torch")
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
# one row
# ---------------------------------------------------------------------------------------------------------------


def _metric_rows(record: RowRecord, qrecords: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (tier, case) with the metrics of all its checks: a GSM8K case's score and interval (test_accuracy)
    sit next to its accept length (test_acceptance)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for tier_name in TIERS:
        for chk in ((record.get("tiers") or {}).get(tier_name) or {}).get("checks") or []:
            metrics = chk.get("metrics") or {}
            if not metrics:
                continue
            key = (tier_name, case_of(chk["id"]))
            g = groups.setdefault(
                key, {"tier": tier_name, "case": key[1], "checks": [], "outcome": "passed", "metrics": {}}
            )
            g["checks"].append(chk["id"])
            if chk.get("outcome") in FAILING and not chk.get("known_upstream"):
                g["outcome"] = chk["outcome"]
            elif chk.get("outcome") in FAILING and g["outcome"] not in FAILING:
                g["outcome"] = KNOWN_UPSTREAM  # fails only on a known upstream bug, as the tier's verdict words it
            g["metrics"].update(metrics)
            # how the check that recorded each metric ended (the figures colour a number by it)
            ended = KNOWN_UPSTREAM if chk.get("known_upstream") else chk.get("outcome")
            g.setdefault("ended", {}).update(dict.fromkeys(metrics, ended))
    return [_metric_row(g, qrecords) for g in groups.values()]


def _metric_row(group: dict[str, Any], qrecords: dict[str, dict[str, Any]]) -> dict[str, Any]:
    metrics = group["metrics"]
    out: dict[str, Any] = {
        "check": group["checks"][0],
        "checks": group["checks"],
        "short": group["case"],
        "tier": group["tier"],
        "outcome": group["outcome"],
        "ended": group["ended"],
    }
    score = metrics.get(schema.SCORE)
    qs = qrecords.get(group["case"], {}).get("questions") if group["tier"] == "gsm8k" else None
    if is_number(score):
        out["score"] = float(score)
        n = metrics.get(schema.NUM_EXAMPLES)
        n = int(n) if is_number(n) else (len(qs) if qs else None)
        if n:
            out["n"] = n
        ci = metrics.get(schema.WILSON95)
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(is_number(x) for x in ci):
            out["ci"] = [float(ci[0]), float(ci[1])]
        elif qs:
            out["ci"] = list(stats.wilson_interval(sum(qs.values()), len(qs)))
    for name, key_out in ((schema.ACCEPT_LENGTH, "accept_length"), (schema.SPEEDUP, "speedup")):
        if is_number(metrics.get(name)):
            out[key_out] = float(metrics[name])
    if isinstance(metrics.get(schema.RECORDS), str):
        out["records"] = metrics[schema.RECORDS]
    other = {k: v for k, v in metrics.items() if k not in COLUMN_METRICS}
    if other:
        out["other"] = other
    out["known"] = any(k in out for k in ("score", "accept_length", "speedup"))
    return out


def _relaunched(record: RowRecord) -> list[dict[str, Any]]:
    """Servers that failed while launched beside others and passed or failed again alone (one entry per log): the
    first error next to the server, the checks over it and how they ended alone ('failed' if any did)."""
    seen: dict[str, dict[str, Any]] = {}
    for tier_name, tier in (record.get("tiers") or {}).items():
        for chk in tier.get("checks") or []:
            m = chk.get("metrics") or {}
            if m.get("first_attempt_error"):
                log = Path(str(m.get(schema.SERVER_LOG) or chk["id"])).name
                entry = seen.setdefault(
                    log,
                    {
                        "tier": tier_name,
                        "server": case_of(chk["id"]),
                        "server_log": log,
                        "error": m["first_attempt_error"],
                        "checks": [],
                        "alone": "passed",
                    },
                )
                entry["checks"].append(short_check(chk["id"]).split("[", 1)[0])
                if chk.get("outcome") in FAILING:
                    entry["alone"] = "failed"
    return list(seen.values())


def _tier_summary(tier: TierRecord) -> TierSummary:
    checks = tier.get("checks") or []
    counts: dict[str, int] = {}
    for c in checks:
        counts[c.get("outcome", "?")] = counts.get(c.get("outcome", "?"), 0) + 1
    failures: list[dict[str, Any]] = []
    for c in checks:
        if c.get("outcome") in FAILING and not c.get("known_upstream"):  # known upstream bugs are listed apart
            f = c.get("failure") or {}
            failures.append(
                {
                    "check": c["id"],
                    "short": short_check(c["id"]),
                    "outcome": c["outcome"],
                    "kind": f.get("kind"),
                    "type": f.get("type"),
                    "message": f.get("message"),
                    "frame": f.get("frame"),
                    "raised_at": f.get("raised_at"),
                }
            )
    if tier.get("verdict") in FAILING and not failures:  # e.g. pytest died before writing results
        failures.append(
            {
                "check": None,
                "short": None,
                "outcome": tier.get("verdict"),
                "kind": next(iter(tier.get("failure_kinds") or []), None),
                "type": None,
                "message": tier.get("reason"),
                "frame": None,
                "raised_at": None,
            }
        )
    kinds = tier.get("failure_kinds") or sorted({f["kind"] for f in failures if f["kind"]})
    groups = group_failures(failures)
    skipped_checks = [
        {"check": c["id"], "reason": c.get("reason", "")} for c in checks if c.get("outcome") == "skipped"
    ]
    return {
        "verdict": tier.get("verdict"),
        "state": expected.tier_state(tier),
        "unproven": tier.get("unproven", []),
        "reason": tier.get("reason"),
        "seconds": tier.get("seconds"),
        "counts": counts,
        "failure_kinds": list(kinds),
        "failures": failures,
        "failure_groups": groups,
        "skipped_checks": skipped_checks,
        "known_upstream": tier.get("known_upstream", []),
        "stale_known_upstream": tier.get("stale_known_upstream", []),
        "missing": tier.get("missing", []),
        "missing_groups": group_missing(tier.get("missing", [])),
    }


def group_missing(missing: list[MissingRecord]) -> list[dict[str, Any]]:
    """What did not run, one entry per reason: ``{"why", "what": [...]}`` (four TP-2 cases skipped for one reason are
    one line)."""
    groups: dict[str, dict[str, Any]] = {}
    for m in missing:
        groups.setdefault(m["why"], {"why": m["why"], "what": []})["what"].append(m["what"])
    return list(groups.values())


def group_failures(failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failures of the same kind and exception type raised at the same place are one finding (one bug seen from N
    checks); the first one's message and frame stand for the group."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in failures:
        key = (f.get("kind"), f.get("type"), f.get("raised_at") or f.get("frame"), f.get("outcome"))
        g = groups.setdefault(key, dict(f, shorts=[]))
        if f.get("short"):
            g["shorts"].append(f["short"])
    return list(groups.values())


def _versions(record: RowRecord) -> tuple[dict[str, str | None], bool]:
    """(versions, whether they were installed): freeze/tiers versions, else the pins the row asked for."""
    v: dict[str, str | None] = dict(record.get("versions") or {})
    installed = bool(v)
    pins = pins_with_overrides(record)
    for p in MAIN_PACKAGES:
        v.setdefault(p, pins.get(p))
    v.setdefault("python", (record.get("row") or {}).get("python"))
    return v, installed


def row_state(record: RowRecord) -> str:
    """What a judged row proves (expected.STATES): not proven when its record cannot show it, broken when it did not
    install or a tier broke, else the worst of its tiers."""
    if record.get("verdict") == UNPROVEN:
        return expected.NOT_PROVEN
    if (record.get("install") or {}).get("verdict") == "failed":
        return expected.BROKEN
    tiers = record.get("tiers") or {}
    return expected.worst_state(expected.tier_state(t) for t in tiers.values()) if tiers else expected.NOT_PROVEN


def _row_summary(run_dir: Path, row_id: str, record: RowRecord, out_dir: Path) -> RowSummary:
    row_dir = run_dir / row_id
    row = record.get("row") or {}
    versions, installed = _versions(record)
    install = record.get("install") or {}
    qrecords = question_records(record, row_dir)
    tiers = {t: _tier_summary(tv) for t, tv in (record.get("tiers") or {}).items()}
    metrics = _metric_rows(record, qrecords)
    logs = {}
    for name in LOG_FILES:
        f = row_dir / name
        if f.exists():
            logs[name] = os.path.relpath(f, out_dir)
    check = install.get("check") or {}
    return {
        "id": row_id,
        "relaunched": _relaunched(record),
        "verdict": record.get("verdict") or row_verdict(record),
        "state": row_state(record),
        "unproven": list(record.get("unproven") or []),
        "description": row.get("description", ""),
        "tags": row.get("tags", []),
        "torch_backend": row.get("torch_backend"),
        "versions": versions,
        "versions_installed": installed,
        "overrides": list(record.get("overrides") or []),
        "install": {
            "verdict": install.get("verdict"),
            "seconds": install.get("seconds"),
            "failure": install.get("failure"),
            "check_ok": check.get("ok"),
            "check_output": check.get("output", []),
        },
        "tiers": tiers,
        "metrics": metrics,
        "gsm8k_records": {
            k: {"path": v["path"], "n": len(v["questions"]), "correct": sum(v["questions"].values())}
            for k, v in qrecords.items()
        },
        "logs": logs,
        "launch_budget": figures.read_launch_budget(row_dir),  # the smoke suite against its limit, when recorded
        "started": record.get("started"),
        "finished": record.get("finished"),
        "host": record.get("host"),
        "gpus": record.get("gpus"),
        "build": record.get("build") or Build(),  # Python, platform, torch's build (a dict: evidence.records)
        "candidate": candidates.candidate_of(record),
    }


# ---------------------------------------------------------------------------------------------------------------
# across rows
# ---------------------------------------------------------------------------------------------------------------


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


def _closest_passing_rows(
    run_dir: Path,
    rows: dict[str, RowRecord],
    summaries: dict[str, RowSummary],
    baseline_dir: Path | None = None,
    baseline_rows: dict[str, RowRecord] | None = None,
) -> None:
    """Attach to every failing row the closest passing row: from this run, and, with a baseline, from the
    baseline run too (an upgrade probe re-runs one row, so its nearest good neighbour is usually the baseline's)."""
    freezes = {rid: read_freeze(run_dir / rid) for rid in rows}
    passing = {
        rid: (freezes[rid] or pins_with_overrides(rows[rid]))
        for rid, s in summaries.items()
        if s["verdict"] in ("passed", PARTIAL)
    }
    sglang_of = {rid: summaries[rid]["versions"].get("sglang") for rid in summaries}
    if baseline_dir is not None:
        for rid, rec in (read_judged_run(baseline_dir) if baseline_rows is None else baseline_rows).items():
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
    summaries = {rid: _row_summary(run_dir, rid, rec, out_dir) for rid, rec in rows.items()}
    base_rows = read_judged_run(baseline_dir) if baseline_dir is not None else None
    _closest_passing_rows(run_dir, rows, summaries, baseline_dir, base_rows)
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
    stale = [
        dict(k, row=rid, tier=t)
        for rid, s in summaries.items()
        if not s["candidate"]
        for t, tv in s["tiers"].items()
        for k in tv["stale_known_upstream"]
    ]
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
