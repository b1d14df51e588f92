"""One row of the summary (summary.json's ``rows[]``, record_types.RowSummary), from the row's judged record: its
versions (installed, else the pins it asked for), install, what it proves (``row_state``), each tier's counts and
failures (one finding per bug: ``group_failures``) and what did not run (``group_missing``), one metrics row per case,
servers relaunched alone, its logs and its candidate. Nothing here formats text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mtpmatrix.core import expected, schema, stats
from mtpmatrix.core.evidence.versions import MAIN_PACKAGES, pins_with_overrides
from mtpmatrix.core.record_types import Build, MissingRecord, RowRecord, RowSummary, TierRecord, TierSummary
from mtpmatrix.core.schema import FAILING, KNOWN_UPSTREAM, TIERS, UNPROVEN
from mtpmatrix.core.store import install_failed_by_machine, row_verdict
from mtpmatrix.report import candidates, figures
from mtpmatrix.report.checks import COLUMN_METRICS, case_of, is_number, question_records, short_check

LOG_FILES = (schema.INSTALL_LOG, schema.PYTEST_LOG, schema.FREEZE_FILE, schema.CHECK_FILE, schema.JUNIT_FILE)


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
        "unshown_known_upstream": tier.get("unshown_known_upstream", []),
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
    install = record.get("install") or {}
    if install.get("verdict") == "failed":
        return expected.NOT_PROVEN if install_failed_by_machine(install) else expected.BROKEN
    tiers = record.get("tiers") or {}
    return expected.worst_state(expected.tier_state(t) for t in tiers.values()) if tiers else expected.NOT_PROVEN


def row_summary(run_dir: Path, row_id: str, record: RowRecord, out_dir: Path) -> RowSummary:
    """The row ``row_id`` of the run in ``run_dir`` from its judged ``record``; log paths relative to ``out_dir``."""
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
