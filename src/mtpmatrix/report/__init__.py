"""The matrix report: one run (``results/<run-id>/``) as Markdown, one self-contained HTML page and JSON.

    python -m mtpmatrix report [RUN_ID] [--results DIR] [--baseline RUN_ID] [--out DIR]

writes ``summary.md``, ``report.html`` and ``summary.json`` into ``results/<run-id>/report/`` (or ``--out``) and
appends summary.md to ``$GITHUB_STEP_SUMMARY`` when that is set.

The verdict says what was proven. A run QUALIFIES only when every tier ran and passed in every row; a run whose
CPU tiers passed on a machine without a GPU says so ("CPU checks pass; smoke and gsm8k not run (no GPU)"). Failures
listed in known_upstream.json are shown as "known upstream" next to their row and do not fail it. Exit status
(EXIT_*): 0 nothing failed and every --require'd tier ran; 1 a row failed, errored or is unfinished; 2 bad input
(no such run, no rows, unknown tier), one line; 3 nothing failed but not proven: a --require'd tier did not run in
every row, or nothing ran at all.

Besides the rows x tiers table the report holds, for every failing row, the closest passing row (fewest packages
that differ in freeze.txt, ties broken towards the same sglang) with the differing versions; GSM8K per-question
paired comparisons between rows (McNemar exact p) where per-question records exist; and with ``--baseline`` a
run-to-run diff (new failures, fixed ones, metric deltas).

Standard library only: the package is installed next to sglang's pins.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import html
import json
import math
import os
import re
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix import schema, stats
from mtpmatrix.runner.rows import RowError, parse_override
from mtpmatrix.schema import GPU_TIERS, KNOWN_UPSTREAM
from mtpmatrix.runner.store import (TIERS, VERDICTS, atomic_write_json, atomic_write_text, is_matrix_run, latest_run_id,
                             parse_freeze, read_json, row_verdict)

REPORT_DIR = "report"
LOG_FILES = ("install.log", "pytest.log", "freeze.txt", "check.txt", "junit.xml")
SYMBOLS = {"passed": "✅", "failed": "❌", "error": "💥", "skipped": "⏭️", "pending": "⏳",
           KNOWN_UPSTREAM: "⚠️", None: "—"}
# The HTML page uses plain glyphs that every font has (emoji need a color-emoji font the viewer may lack).
GLYPHS = {"passed": "✓", "failed": "✗", "error": "!", "skipped": "–", "pending": "…", KNOWN_UPSTREAM: "⚠",
          None: "—"}
BAD = ("failed", "error")
RAN = ("passed", KNOWN_UPSTREAM)  # a tier that ran without failing sglang
MAIN_PACKAGES = ("sglang", "transformers", "torch")
# Metrics shown in their own columns (schema.py names); the rest lands in "other", shortened.
COLUMN_METRICS = (schema.SCORE, schema.WILSON95, schema.NUM_EXAMPLES, schema.ACCEPT_LENGTH, schema.SPEEDUP,
                  schema.RECORDS)
ALPHA = 0.05
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NOT_PROVEN = 0, 1, 2, 3


class ReportError(ValueError):
    """Bad input for the report (no such run, no rows); the message is one line."""


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n."""
    return stats.wilson_interval(k, n)


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p for b and c discordant pairs."""
    return stats.mcnemar(b, c)


# ---------------------------------------------------------------------------------------------------------------
# reading a run
# ---------------------------------------------------------------------------------------------------------------

def resolve_run(results: Path, run_id: str | None) -> Path:
    results = Path(results)
    if run_id is None:
        run_id = latest_run_id(results)
        if run_id is None:
            raise ReportError(f"no runs under {results}/ (run the matrix first: nox -s gemma4_mtp)")
    run_dir = results / run_id
    if not run_dir.is_dir():
        known = sorted(p.name for p in results.iterdir() if is_matrix_run(p))[-5:] if results.is_dir() else []
        raise ReportError(f"no such run {run_id!r} under {results}/" + (f" (latest: {', '.join(known)})" if known
                                                                           else ""))
    if not any(run_dir.glob("*/row.json")):
        raise ReportError(f"run {run_id!r} ({run_dir}) has no rows (no */row.json)")
    return run_dir


def _pins_of(record: dict) -> dict[str, str]:
    """What a row asked for (its pins with --with overrides applied): the fallback when no freeze.txt exists."""
    pins = {canonicalize_name(k): v for k, v in (record.get("row") or {}).get("pins", {}).items()}
    for spec in record.get("overrides") or []:
        try:
            req = parse_override(spec)
        except RowError:
            continue
        exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if len(exact) == 1 and len(req.specifier) == 1:  # only an exact override names a version
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def _records_file(value, row_dir: Path) -> Path | None:
    """The per-question file a RECORDS metric names (row-relative, schema.gsm8k_records), if it is there."""
    if not isinstance(value, str) or Path(value).is_absolute() or ".." in Path(value).parts:
        return None
    path = row_dir / value
    return path if path.is_file() else None


def read_question_records(path: Path) -> dict[int, bool]:
    """Per-question correctness from a JSONL file whose lines carry ``index`` and ``correct``."""
    out: dict[int, bool] = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "index" in rec and "correct" in rec:
                out[int(rec["index"])] = bool(rec["correct"])
    return out


def short_check(check_id: str) -> str:
    """``tests/tiers/test_gsm8k.py::test_accuracy[E4B-topk1]`` -> ``test_accuracy[E4B-topk1]``."""
    return check_id.split("::", 1)[1] if "::" in check_id else check_id


def case_of(check_id: str) -> str:
    """What a check ran on: its parameter (``E4B-topk1``, a smoke server's name), else the check's name."""
    short = short_check(check_id)
    return short[short.index("[") + 1:-1] if short.endswith("]") and "[" in short else short


def question_records(record: dict, row_dir: Path) -> dict[str, dict]:
    """{case: {"path", "questions": {index: correct}}} for every GSM8K case of a row whose check names its
    per-question file (schema.RECORDS)."""
    out: dict[str, dict] = {}
    for chk in ((record.get("tiers") or {}).get("gsm8k") or {}).get("checks") or []:
        path = _records_file((chk.get("metrics") or {}).get(schema.RECORDS), row_dir)
        if path is None:
            continue
        qs = read_question_records(path)
        if qs:
            out[case_of(chk["id"])] = {"path": str(path), "questions": qs}
    return out


def paired_comparison(a: dict[int, bool], b: dict[int, bool]) -> dict:
    """McNemar on the questions both sides answered. b_count: right in A, wrong in B; c_count: the reverse."""
    common = sorted(set(a) & set(b))
    a_only = [i for i in common if a[i] and not b[i]]
    b_only = [i for i in common if b[i] and not a[i]]
    n = len(common)
    return {
        "n": n,
        "a_correct": sum(a[i] for i in common),
        "b_correct": sum(b[i] for i in common),
        "right_in_a_only": len(a_only),
        "right_in_b_only": len(b_only),
        "p_value": mcnemar_p(len(a_only), len(b_only)),
        "flipped_to_wrong": a_only,  # A right, B wrong
        "flipped_to_right": b_only,  # A wrong, B right
    }


# ---------------------------------------------------------------------------------------------------------------
# the summary (what summary.json holds; the renderers read only this)
# ---------------------------------------------------------------------------------------------------------------

def _first_frame(failure: dict) -> str | None:
    return failure.get("frame") or failure.get("raised_at")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _metric_rows(record: dict, qrecords: dict[str, dict]) -> list[dict]:
    """One row per (tier, case) with the metrics of all its checks: a GSM8K case's score and interval (test_accuracy)
    sit next to its accept length (test_acceptance)."""
    groups: dict[tuple[str, str], dict] = {}
    for tier_name in TIERS:
        for chk in ((record.get("tiers") or {}).get(tier_name) or {}).get("checks") or []:
            metrics = chk.get("metrics") or {}
            if not metrics:
                continue
            key = (tier_name, case_of(chk["id"]))
            g = groups.setdefault(key, {"tier": tier_name, "case": key[1], "checks": [], "outcome": "passed",
                                        "metrics": {}})
            g["checks"].append(chk["id"])
            if chk.get("outcome") in BAD:
                g["outcome"] = chk["outcome"]
            g["metrics"].update(metrics)
    return [_metric_row(g, qrecords) for g in groups.values()]


def _metric_row(group: dict, qrecords: dict[str, dict]) -> dict:
    metrics = group["metrics"]
    out: dict = {"check": group["checks"][0], "checks": group["checks"], "short": group["case"],
                 "tier": group["tier"], "outcome": group["outcome"]}
    score = metrics.get(schema.SCORE)
    qs = qrecords.get(group["case"], {}).get("questions") if group["tier"] == "gsm8k" else None
    if _is_number(score):
        out["score"] = float(score)
        n = metrics.get(schema.NUM_EXAMPLES)
        n = int(n) if _is_number(n) else (len(qs) if qs else None)
        if n:
            out["n"] = n
        ci = metrics.get(schema.WILSON95)
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_is_number(x) for x in ci):
            out["ci"] = [float(ci[0]), float(ci[1])]
        elif qs:
            out["ci"] = list(wilson(sum(qs.values()), len(qs)))
    for name, key_out in ((schema.ACCEPT_LENGTH, "accept_length"), (schema.SPEEDUP, "speedup")):
        if _is_number(metrics.get(name)):
            out[key_out] = float(metrics[name])
    if isinstance(metrics.get(schema.RECORDS), str):
        out["records"] = metrics[schema.RECORDS]
    other = {k: v for k, v in metrics.items() if k not in COLUMN_METRICS}
    if other:
        out["other"] = other
    out["known"] = any(k in out for k in ("score", "accept_length", "speedup"))
    return out


def _relaunched(record: dict) -> list[dict]:
    """Servers that failed while launched beside others and passed or failed again alone (one entry per log)."""
    seen: dict[str, dict] = {}
    for tier_name, tier in (record.get("tiers") or {}).items():
        for chk in tier.get("checks") or []:
            m = chk.get("metrics") or {}
            if m.get("first_attempt_error"):
                log = Path(str(m.get("server_log") or chk["id"])).name
                seen.setdefault(log, {"tier": tier_name, "server_log": log, "error": m["first_attempt_error"]})
    return list(seen.values())


def _tier_summary(tier: dict) -> dict:
    checks = tier.get("checks") or []
    counts: dict[str, int] = {}
    for c in checks:
        counts[c.get("outcome", "?")] = counts.get(c.get("outcome", "?"), 0) + 1
    failures = []
    for c in checks:
        if c.get("outcome") in BAD and not c.get("known_upstream"):  # known upstream bugs are listed apart
            f = c.get("failure") or {}
            failures.append({"check": c["id"], "short": short_check(c["id"]), "outcome": c["outcome"],
                             "kind": f.get("kind"), "type": f.get("type"), "message": f.get("message"),
                             "frame": f.get("frame"), "raised_at": f.get("raised_at")})
    if tier.get("verdict") in BAD and not failures:  # e.g. pytest died before writing results
        failures.append({"check": None, "short": None, "outcome": tier.get("verdict"),
                         "kind": (tier.get("failure_kinds") or [None])[0], "type": None,
                         "message": tier.get("reason"), "frame": None, "raised_at": None})
    kinds = tier.get("failure_kinds") or sorted({f["kind"] for f in failures if f["kind"]})
    groups = group_failures(failures)
    skipped_checks = [{"check": c["id"], "reason": c.get("reason", "")} for c in checks
                      if c.get("outcome") == "skipped"]
    return {"verdict": tier.get("verdict"), "reason": tier.get("reason"), "seconds": tier.get("seconds"),
            "counts": counts, "failure_kinds": list(kinds), "failures": failures, "failure_groups": groups,
            "skipped_checks": skipped_checks, "known_upstream": tier.get("known_upstream", []),
            "stale_known_upstream": tier.get("stale_known_upstream", [])}


def group_failures(failures: list[dict]) -> list[dict]:
    """Failures of the same kind and exception type raised at the same place are one finding (one bug seen from N
    checks); the first one's message and frame stand for the group."""
    groups: dict[tuple, dict] = {}
    for f in failures:
        key = (f.get("kind"), f.get("type"), f.get("raised_at") or f.get("frame"), f.get("outcome"))
        g = groups.setdefault(key, dict(f, shorts=[]))
        if f.get("short"):
            g["shorts"].append(f["short"])
    return list(groups.values())


def _versions(record: dict) -> tuple[dict, bool]:
    """(versions, whether they were installed): freeze/tiers versions, else the pins the row asked for."""
    v = dict(record.get("versions") or {})
    installed = bool(v)
    pins = _pins_of(record)
    for p in MAIN_PACKAGES:
        v.setdefault(p, pins.get(p))
    v.setdefault("python", (record.get("row") or {}).get("python"))
    return v, installed


def _row_summary(run_dir: Path, row_id: str, record: dict, out_dir: Path) -> dict:
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
        "description": row.get("description", ""),
        "tags": row.get("tags", []),
        "torch_backend": row.get("torch_backend"),
        "versions": versions,
        "versions_installed": installed,
        "overrides": list(record.get("overrides") or []),
        "install": {"verdict": install.get("verdict"), "seconds": install.get("seconds"),
                    "failure": install.get("failure"), "check_ok": check.get("ok"),
                    "check_output": check.get("output", [])},
        "tiers": tiers,
        "metrics": metrics,
        "gsm8k_records": {k: {"path": v["path"], "n": len(v["questions"]),
                              "correct": sum(v["questions"].values())} for k, v in qrecords.items()},
        "logs": logs,
        "started": record.get("started"),
        "finished": record.get("finished"),
        "host": record.get("host"),
        "gpus": record.get("gpus"),
    }


def closest_passing(target: dict[str, str], candidates: dict[str, dict[str, str]], *, target_sglang: str | None,
                    sglang_of: dict[str, str | None], keys_only: bool = False) -> dict | None:
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
    return {"row": rid, "distance": len(diff),
            "differences": [{"package": n, "this": target.get(n), "other": candidates[rid].get(n)} for n in diff]}


def _freeze_of(row_dir: Path) -> dict[str, str] | None:
    f = row_dir / "freeze.txt"
    return parse_freeze(f.read_text()) if f.exists() else None


def _closest_passing_rows(run_dir: Path, rows: dict[str, dict], summaries: dict[str, dict],
                          baseline_dir: Path | None = None) -> None:
    """Attach to every failing row the closest passing row: from this run, and, with a baseline, from the
    baseline run too (an upgrade probe re-runs one row, so its nearest good neighbour is usually the baseline's)."""
    freezes = {rid: _freeze_of(run_dir / rid) for rid in rows}
    passing = {rid: (freezes[rid] if freezes[rid] else _pins_of(rows[rid]))
               for rid, s in summaries.items() if s["verdict"] == "passed"}
    sglang_of = {rid: summaries[rid]["versions"].get("sglang") for rid in summaries}
    if baseline_dir is not None:
        for rid, rec in load_rows(baseline_dir).items():
            if row_verdict(rec) == "passed":
                key = f"{rid} @ {Path(baseline_dir).name}"
                passing[key] = _freeze_of(Path(baseline_dir) / rid) or _pins_of(rec)
                sglang_of[key] = (rec.get("versions") or {}).get("sglang")
    for rid, s in summaries.items():
        if s["verdict"] not in BAD:
            continue
        if not passing:
            s["closest_passing"] = None
            continue
        source = "freeze" if freezes[rid] else "pins"
        target = freezes[rid] if freezes[rid] else _pins_of(rows[rid])
        best = closest_passing(target, passing, target_sglang=sglang_of.get(rid), sglang_of=sglang_of,
                               keys_only=source == "pins")
        if best:
            best["source"] = source
        s["closest_passing"] = best


def _skip_groups(summaries: dict[str, dict]) -> list[dict]:
    """Skip reasons, one line each: identical reasons across rows and tiers grouped together."""
    groups: dict[str, dict] = {}

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


def _paired_across_rows(run_dir: Path, rows: dict[str, dict]) -> list[dict]:
    """Per-question comparisons: the same case in two rows, and within a row each MTP case against the no-MTP case
    of its pair (key ``E4B-nomtp → E4B-topk1``, row A = row B)."""
    per_row = {rid: question_records(rec, run_dir / rid) for rid, rec in rows.items()}
    keys = sorted({k for qs in per_row.values() for k in qs})
    out = []
    for key in keys:
        have = [rid for rid in sorted(per_row) if key in per_row[rid]]
        for i, a in enumerate(have):
            for b in have[i + 1:]:
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
        return ("worse", "new row, failing") if after in BAD else ("same", "new row")
    if after is None:
        return "same", "not in this run"
    rank = {"passed": 2, KNOWN_UPSTREAM: 2, "skipped": 1, "pending": 1, "failed": 0, "error": 0}
    rb, ra = rank.get(before, 1), rank.get(after, 1)
    if before == after or (rb == ra == 0):
        return "same", "still failing" if ra == 0 else "same"
    if ra == 0:
        return "worse", "new failure"
    if rb == 0:
        return "better", "fixed" if ra == 2 else "no longer fails (not run)"
    if ra == 2:
        return "better", "now runs and passes"
    if rb == 2:
        return "worse", "no longer runs"
    return "same", "same"


def compare_runs(cur_dir: Path, cur_rows: dict[str, dict], base_dir: Path, base_rows: dict[str, dict]) -> dict:
    """Row-, tier- and check-level changes between a baseline run and this run, plus metric deltas."""
    rows_out, new_failures, fixed, deltas, paired = [], [], [], [], []
    for rid in sorted(set(cur_rows) | set(base_rows)):
        cur, base = cur_rows.get(rid), base_rows.get(rid)
        vb = base.get("verdict") if base else None
        va = cur.get("verdict") if cur else None
        direction, label = _change(vb, va)
        entry = {"row": rid, "before": vb, "after": va, "change": direction, "label": label, "tiers": {}}
        ctiers, btiers = (cur or {}).get("tiers") or {}, (base or {}).get("tiers") or {}
        if cur and (cur.get("install") or {}).get("verdict") == "failed":
            ib = ((base or {}).get("install") or {}).get("verdict")
            d, lab = _change(ib, "failed")
            entry["tiers"]["install"] = {"before": ib, "after": "failed", "change": d,
                                         "label": "install fails" if d == "worse" else lab}
        for tier in [t for t in TIERS if t in ctiers or t in btiers]:
            tb, ta = (btiers.get(tier) or {}).get("verdict"), (ctiers.get(tier) or {}).get("verdict")
            d, lab = _change(tb, ta)
            entry["tiers"][tier] = {"before": tb, "after": ta, "change": d, "label": lab}
            bchecks = {c["id"]: c for c in (btiers.get(tier) or {}).get("checks") or []}
            for c in (ctiers.get(tier) or {}).get("checks") or []:
                old = bchecks.get(c["id"])
                ob, oa = (old or {}).get("outcome"), c.get("outcome")
                f = c.get("failure") or {}
                item = {"row": rid, "tier": tier, "check": c["id"], "before": ob, "after": oa,
                        "kind": f.get("kind"), "message": f.get("message"), "frame": _first_frame(f)}
                if oa in BAD and ob not in BAD and not c.get("known_upstream"):
                    new_failures.append(item)
                elif ob in BAD and oa == "passed":
                    fixed.append(item)
                if old:
                    mb, ma = old.get("metrics") or {}, c.get("metrics") or {}
                    for name in sorted(set(mb) & set(ma), key=lambda n: (n not in COLUMN_METRICS, n)):
                        if not (_is_number(mb[name]) and _is_number(ma[name])):
                            continue
                        if mb[name] != ma[name]:
                            deltas.append({"row": rid, "tier": tier, "check": c["id"], "metric": name,
                                           "before": mb[name], "after": ma[name], "delta": ma[name] - mb[name]})
        if cur and (cur.get("install") or {}).get("verdict") == "failed" and (
                (base or {}).get("install") or {}).get("verdict") != "failed":
            f = cur["install"].get("failure") or {}
            new_failures.append({"row": rid, "tier": "install", "check": None, "before": "passed" if base else None,
                                 "after": "failed", "kind": "install", "message": f.get("message"), "frame": None})
        if cur and base:
            qa = question_records(base, base_dir / rid)
            qb = question_records(cur, cur_dir / rid)
            for key in sorted(set(qa) & set(qb)):
                cmp = paired_comparison(qa[key]["questions"], qb[key]["questions"])
                paired.append({"row": rid, "key": key, **cmp})
        rows_out.append(entry)
    return {"rows": rows_out, "new_failures": new_failures, "fixed": fixed, "metric_deltas": deltas,
            "paired": paired,
            "new_rows": sorted(set(cur_rows) - set(base_rows)), "missing_rows": sorted(set(base_rows) - set(cur_rows))}


def load_rows(run_dir: Path) -> dict[str, dict]:
    out = {}
    for f in sorted(Path(run_dir).glob("*/row.json")):
        try:
            out[f.parent.name] = read_json(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ReportError(f"{f}: unreadable row record ({exc})") from None
    return out


def _tier_status(summaries: dict[str, dict], tiers: list[str], skips: list[dict]) -> dict[str, dict]:
    """Per tier over all rows: which rows ran it (passed or known upstream), which did not, and one short reason
    for the ones that did not ('no GPU' when every skip of the tier says a GPU is missing)."""
    out = {}
    for tier in tiers:
        ran = [rid for rid, s in summaries.items() if (s["tiers"].get(tier) or {}).get("verdict") in RAN]
        not_run = [rid for rid, s in summaries.items() if (s["tiers"].get(tier) or {}).get("verdict") in
                   ("skipped", None) and s["install"]["verdict"] != "failed"]
        reasons = [g["reason"] for g in skips if tier in g["tiers"] and set(g["rows"]) & set(not_run)
                   and not g["checks"]]
        if reasons and all("GPU" in r for r in reasons):
            why = "no GPU"
        elif reasons and all("not selected" in r for r in reasons):
            why = "not selected"
        else:
            why = reasons[0] if reasons else ""
        out[tier] = {"ran": ran, "not_run": not_run, "why": why}
    return out


def _verdict(summary: dict, require: list[str]) -> tuple[str, int]:
    """(state, exit status): 'qualifies' (every tier ran and passed everywhere), 'partial' (nothing failed, some
    tiers did not run), 'not-proven' (a --require'd tier did not run everywhere, or nothing ran), 'fails'."""
    if summary["failing_rows"] or summary["incomplete_rows"]:
        return "fails", EXIT_FAILED
    if summary["nothing_ran"]:
        return "not-proven", EXIT_NOT_PROVEN
    status = summary["tier_status"]
    if any(status.get(t, {}).get("not_run") or t not in status for t in require):
        return "not-proven", EXIT_NOT_PROVEN
    if all(not st["not_run"] for st in status.values()) and set(status) == set(TIERS):
        return "qualifies", EXIT_OK
    return "partial", EXIT_OK


def build_summary(run_dir: Path, *, baseline_dir: Path | None = None, out_dir: Path | None = None,
                  require: list[str] | tuple[str, ...] = ()) -> dict:
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / REPORT_DIR
    rows = load_rows(run_dir)
    if not rows:
        raise ReportError(f"run {run_dir.name!r} ({run_dir}) has no rows (no */row.json)")
    summaries = {rid: _row_summary(run_dir, rid, rec, out_dir) for rid, rec in rows.items()}
    _closest_passing_rows(run_dir, rows, summaries, baseline_dir)
    counts = {v: 0 for v in VERDICTS}
    for s in summaries.values():
        counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    failing = [rid for rid, s in summaries.items() if s["verdict"] in BAD]
    incomplete = [rid for rid, s in summaries.items() if s["verdict"] in (None, "pending")]
    tiers = [t for t in TIERS if any(t in s["tiers"] for s in summaries.values())] or list(TIERS)
    ran_any = any(t["verdict"] in RAN for s in summaries.values() for t in s["tiers"].values())
    skips = _skip_groups(summaries)
    known = [dict(k, row=rid, tier=t) for rid, s in summaries.items() for t, tv in s["tiers"].items()
             for k in tv["known_upstream"]]
    stale = [dict(k, row=rid, tier=t) for rid, s in summaries.items() for t, tv in s["tiers"].items()
             for k in tv["stale_known_upstream"]]
    summary = {
        "schema": schema.SCHEMA,
        "run_id": run_dir.name,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "required_tiers": list(require),
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
        "paired": _paired_across_rows(run_dir, rows),
        "baseline": None,
        "regressions": [],
    }
    summary["verdict"], summary["exit_status"] = _verdict(summary, list(require))
    # True only when every tier ran and passed in every row: a CPU-only run never 'qualifies' a release.
    summary["qualifies"] = summary["verdict"] == "qualifies"
    if baseline_dir is not None:
        base = compare_runs(run_dir, rows, Path(baseline_dir), load_rows(baseline_dir))
        base["run_id"] = Path(baseline_dir).name
        summary["baseline"] = base
        regressions = [dict(r, why="new failure") for r in base["new_failures"]]
        regressions += [{"row": p["row"], "tier": "gsm8k", "check": p["key"], "why": "significant accuracy drop",
                         "before": p["a_correct"] / p["n"], "after": p["b_correct"] / p["n"], "p_value": p["p_value"]}
                        for p in base["paired"]
                        if p["n"] and p["p_value"] < ALPHA and p["b_correct"] < p["a_correct"]]
        summary["regressions"] = regressions
    return summary


# ---------------------------------------------------------------------------------------------------------------
# rendering helpers
# ---------------------------------------------------------------------------------------------------------------

def _fmt_num(v, digits: int = 3) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.3g}"
    return str(v)


def _fmt_other(v, limit: int = 60) -> str:
    if isinstance(v, (list, tuple)):
        nums = [x for x in v if _is_number(x)]
        if nums and len(nums) == len(v):
            return f"{len(v)} values, mean {_fmt_num(sum(nums) / len(nums))}"
        return f"{len(v)} items"
    if isinstance(v, dict):
        inner = ", ".join(f"{k} {len(x) if isinstance(x, (list, tuple)) else _fmt_other(x, 24)}"
                          for k, x in v.items()
                          if _is_number(x) or isinstance(x, (str, bool, list, tuple)) or x is None)
        if not inner:
            return f"{{{len(v)} keys}}"
        return inner if len(inner) <= limit else inner[: limit - 1] + "…"
    s = _fmt_num(v) if _is_number(v) or isinstance(v, bool) else str(v)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _score_text(m: dict) -> str:
    if "score" not in m:
        return ""
    s = f"{m['score']:.3f}"
    if "ci" in m:
        s += f" [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}]"
    if m.get("n"):
        s += f" (n={m['n']})"
    return s


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _tier_cell_text(t: dict | None) -> str:
    if t is None:
        return "—"
    v = t["verdict"]
    text = f"{SYMBOLS.get(v, '?')} {v}"
    if v in BAD and t["failure_kinds"]:
        text += " · " + ",".join(t["failure_kinds"])
    if v == KNOWN_UPSTREAM:
        text += " · " + ", ".join(f"{k['package']} {k['version']}" for k in t["known_upstream"])
    return text


# Headline marks: proven, nothing failed but not everything proven, not qualified.
MARKS = {"qualifies": "✅", "partial": "🟡", "not-proven": "❌", "fails": "❌"}
BANNERS = {"qualifies": ("ok", "✓"), "partial": ("partial", "~"), "not-proven": ("bad", "✗"),
           "fails": ("bad", "✗")}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _proven_text(summary: dict) -> str:
    """'CPU checks pass; smoke and gsm8k not run (no GPU)': which tiers ran and passed, which did not run, why."""
    status, n = summary["tier_status"], len(summary["rows"])
    full = [t for t in summary["tiers"] if status[t]["ran"] and not status[t]["not_run"]]
    some = [t for t in summary["tiers"] if status[t]["ran"] and status[t]["not_run"]]
    none = [t for t in summary["tiers"] if not status[t]["ran"]]
    parts = []
    if full:
        parts.append("CPU checks pass" if full == [t for t in TIERS if t not in GPU_TIERS]
                     else f"{_and(full)} pass{'es' if len(full) == 1 else ''}")
    for t in some:
        parts.append(f"{t} ran in {len(status[t]['ran'])} of {n} rows")
    by_why: dict[str, list[str]] = {}
    for t in none:
        by_why.setdefault(status[t]["why"], []).append(t)
    for why, ts in by_why.items():
        parts.append(f"{_and(ts)} not run" + (f" ({why})" if why else ""))
    return "; ".join(parts)


def _known_text(summary: dict) -> str:
    k = summary.get("known_upstream") or []
    if not k:
        return ""
    where = sorted({f"{x['row']} {x['tier']}" for x in k})
    return f"; {len({x['id'] for x in k})} known upstream issue(s), not sglang: {', '.join(where)}"


def _headline(summary: dict) -> str:
    rows = summary["rows"]
    n = len(rows)
    c = summary["verdict_counts"]
    counts = ", ".join(f"{c[v]} {v}" for v in VERDICTS if c.get(v))
    state = summary.get("verdict")
    if state == "qualifies":
        return f"QUALIFIES — every tier ran and passed in all {n} rows{_known_text(summary)} ({counts})"
    if state == "partial":
        return f"{_proven_text(summary)}{_known_text(summary)} ({n} rows: {counts})"
    if state == "not-proven":
        if summary.get("nothing_ran"):
            return f"NOT QUALIFIED — nothing ran: every tier of every row was skipped ({counts})"
        missing = [t for t in summary["required_tiers"] if summary["tier_status"].get(t, {}).get("not_run")
                   or t not in summary["tier_status"]]
        return (f"NOT QUALIFIED — required tier(s) not run in every row: {', '.join(missing)}; "
                f"{_proven_text(summary)}{_known_text(summary)} ({counts})")
    why = []
    if summary["failing_rows"]:
        why.append(f"{len(summary['failing_rows'])} of {n} rows failing: {', '.join(summary['failing_rows'])}")
    if summary["incomplete_rows"]:
        why.append(f"unfinished: {', '.join(summary['incomplete_rows'])}")
    return f"DOES NOT QUALIFY — {'; '.join(why)} ({counts})"


def _md_escape(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------------------------

def _skip_where(group: dict, verb: str) -> str:
    """'smoke/gsm8k in 3 rows (2 checks)' for one group of identical skip reasons."""
    rows = len(group["rows"])
    where = f"{'/'.join(group['tiers'])} {verb} {rows} row{'s' if rows != 1 else ''}"
    if group["checks"]:
        where += f" ({group['checks']} check{'s' if group['checks'] != 1 else ''})"
    return where


def render_markdown(summary: dict) -> str:
    tiers = summary["tiers"]
    mark = MARKS[summary["verdict"]]
    out = [f"# Gemma 4 MTP matrix — run `{summary['run_id']}`", "", f"**{mark} {_headline(summary)}**", ""]
    head = ["row", "sglang", "transformers", "torch", "python", "overrides", *tiers, "verdict"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in summary["rows"]:
        v = r["versions"]
        vers = [v.get(p) or "?" for p in (*MAIN_PACKAGES, "python")]
        if not r["versions_installed"]:
            vers = [f"{x} (pin)" if x != "?" else x for x in vers]
        ov = ", ".join(f"`{o}`" for o in r["overrides"]) or "—"
        if r["install"]["verdict"] == "failed":
            cells = ["❌ install"] + ["—"] * (len(tiers) - 1)
        else:
            cells = [_tier_cell_text(r["tiers"].get(t)) for t in tiers]
        out.append("| " + " | ".join(_md_escape(x) for x in [f"**{r['id']}**", *vers, ov, *cells,
                                                                f"{SYMBOLS.get(r['verdict'], '?')} {r['verdict']}"])
                   + " |")
    out += ["", "Legend: ✅ passed · ❌ failed · 💥 error (harness/setup) · ⚠️ known-upstream (fails only on a known "
            "upstream bug; the row passes) · ⏭️ skipped · ⏳ pending · — not run", ""]
    if summary["skips"]:
        out.append("**Skipped**")
        for g in summary["skips"]:
            out.append(f"- {_skip_where(g, 'in')}: {_md_escape(g['reason'])}")
        out.append("")
    if summary.get("known_upstream") or summary.get("stale_known_upstream"):
        out.append("**Known upstream** (listed in known_upstream.json: a library's bugs and known sglang deviations "
                   "from transformers; they do not fail the row)")
        for k in summary.get("known_upstream") or []:
            fixed = f", fixed in {k['fixed_in']}" if k.get("fixed_in") else ""
            where = " · serving path" if k.get("serving_path") else ""
            out.append(f"- ⚠️ **{k['row']}** {k['tier']} · {k['package']} {k['version']}{where} · `{k['id']}` "
                       f"({len(k['checks'])} checks): {_md_escape(k['summary'])} {k['upstream']}{fixed}")
        for k in summary.get("stale_known_upstream") or []:
            out.append(f"- 🧹 entry `{k['id']}` can go: with {k['package']} {k['version']} in its range, "
                       f"{len(k['checks'])} of its checks pass in {k['row']} {k['tier']} "
                       f"({_md_escape(', '.join(short_check(c) for c in k['checks'][:3]))})")
        out.append("")

    if summary.get("relaunched"):
        out.append("**Relaunched alone** (failed beside other servers; the verdict is from the relaunch)")
        for x in summary["relaunched"]:
            out.append(f"- {x['row']} · {x['tier']} · `{x['server_log']}`: {_md_escape(x['error'])}")
        out.append("")

    failing = [r for r in summary["rows"] if r["verdict"] in BAD]
    if failing:
        out += ["## Failures", ""]
        for r in failing:
            out.append(f"### {SYMBOLS[r['verdict']]} {r['id']}")
            if r["install"]["verdict"] == "failed":
                f = r["install"].get("failure") or {}
                out.append(f"- **install** · `install` · {_md_escape(f.get('message', 'install failed'))}")
            for tier in tiers:
                t = r["tiers"].get(tier)
                for f in (t or {}).get("failure_groups", []):
                    where = (f" — first frame `{f['frame']}`" if f.get("frame") else
                             f" — raised at `{f['raised_at']}`" if f.get("raised_at") else "")
                    shorts = f.get("shorts") or []
                    what = (f" ({shorts[0]})" if len(shorts) == 1 else
                            f" ({len(shorts)} checks: {', '.join(shorts[:4])}{', …' if len(shorts) > 4 else ''})"
                            if shorts else "")
                    typ = f"{f['type']}: " if f.get("type") else ""
                    out.append(f"- **{tier}** · `{f.get('kind') or '?'}`{what} · "
                               f"{_md_escape(typ + (f.get('message') or ''))}{where}")
            cp = r.get("closest_passing")
            if cp:
                diffs = cp["differences"]
                shown = ", ".join(f"{d['package']} {d['this'] or '–'} → {d['other'] or '–'}" for d in diffs[:12])
                more = f", … {len(diffs) - 12} more" if len(diffs) > 12 else ""
                src = " (from pins: this row never installed)" if cp.get("source") == "pins" else ""
                out.append(f"- closest passing row: **{cp['row']}**, {cp['distance']} package(s) differ{src}: "
                           f"{shown or 'none'}{more}")
            elif r.get("closest_passing") is None and "closest_passing" in r:
                out.append("- closest passing row: none (no row passed)")
            out.append("")

    metric_rows = [(r["id"], m) for r in summary["rows"] for m in r["metrics"] if m.get("known")]
    other_rows = [(r["id"], m) for r in summary["rows"] for m in r["metrics"] if not m.get("known")]
    if metric_rows:
        out += ["## Metrics", "", "| row | tier | case | score [95% CI] | accept length | speedup | other |",
                "|---|---|---|---|---|---|---|"]
        for rid, m in metric_rows:
            other = "; ".join(f"{k}={_fmt_other(v, 40)}" for k, v in (m.get("other") or {}).items())
            out.append("| " + " | ".join(_md_escape(x) for x in [
                rid, m["tier"], m["short"], _score_text(m),
                _fmt_num(m["accept_length"]) if "accept_length" in m else "",
                f"{_fmt_num(m['speedup'], 2)}×" if "speedup" in m else "", other]) + " |")
        out.append("")
    if other_rows:
        out += ["<details><summary>Other recorded metrics</summary>", ""]
        for rid, m in other_rows:
            other = "; ".join(f"{k}={_fmt_other(v, 40)}" for k, v in (m.get("other") or {}).items())
            out.append(f"- {rid} {m['tier']} `{m['short']}`: {_md_escape(other)}")
        out += ["", "</details>", ""]

    if summary["paired"]:
        out += ["## GSM8K per question (paired)", "",
                "| check | row A | row B | n | A right | B right | A✓ B✗ | A✗ B✓ | McNemar p |",
                "|---|---|---|---|---|---|---|---|---|"]
        for p in summary["paired"]:
            out.append(f"| {_md_escape(p['key'])} | {p['row_a']} | {p['row_b']} | {p['n']} | {p['a_correct']} | "
                       f"{p['b_correct']} | {p['right_in_a_only']} | {p['right_in_b_only']} | "
                       f"{_fmt_p(p['p_value'])}{' **' if p['p_value'] < ALPHA else ''} |")
        out.append("")
        for p in summary["paired"]:
            if p["flipped_to_wrong"] or p["flipped_to_right"]:
                out.append(f"- {p['key']} {p['row_a']} → {p['row_b']}: now wrong {_idx(p['flipped_to_wrong'])}; "
                           f"now right {_idx(p['flipped_to_right'])}")
        out.append("")

    base = summary.get("baseline")
    if base:
        out += _md_baseline(base)
    out.append(f"<sub>generated {summary['generated']} by mtpmatrix report</sub>")
    return "\n".join(out) + "\n"


def _idx(items: list[int], limit: int = 20) -> str:
    if not items:
        return "none"
    s = ", ".join(f"#{i}" for i in items[:limit])
    return s + (f" … (+{len(items) - limit})" if len(items) > limit else "")


def _md_baseline(base: dict) -> list[str]:
    out = [f"## Compared with baseline `{base['run_id']}`", ""]
    nf, fx = base["new_failures"], base["fixed"]
    out.append(f"{len(nf)} new failure(s), {len(fx)} fixed"
               + (f"; new rows: {', '.join(base['new_rows'])}" if base["new_rows"] else "")
               + (f"; rows missing from this run: {', '.join(base['missing_rows'])}" if base["missing_rows"] else ""))
    out.append("")
    changed = [(r, t, tv) for r in base["rows"] for t, tv in r["tiers"].items() if tv.get("change") not in (None, "same")]
    if changed:
        out += ["| row | tier | before | after | change |", "|---|---|---|---|---|"]
        for r, t, tv in changed:
            arrow = "🔺 better" if tv["change"] == "better" else "🔻 worse"
            out.append(f"| {r['row']} | {t} | {SYMBOLS.get(tv['before'], '—')} {tv['before'] or '—'} | "
                       f"{SYMBOLS.get(tv['after'], '—')} {tv['after'] or '—'} | {arrow} ({tv['label']}) |")
        out.append("")
    same = sum(1 for r in base["rows"] for tv in r["tiers"].values() if tv.get("change") == "same")
    out.append(f"{same} row×tier cell(s) unchanged.")
    out.append("")
    for item in nf:
        where = f" at `{item['frame']}`" if item.get("frame") else ""
        out.append(f"- 🔻 new failure **{item['row']}** {item['tier']} {short_check(item['check'] or '')}: "
                   f"`{item.get('kind') or '?'}` {_md_escape(item.get('message') or '')}{where}")
    for item in fx:
        out.append(f"- 🔺 fixed **{item['row']}** {item['tier']} {short_check(item['check'] or '')}")
    if nf or fx:
        out.append("")
    if base["metric_deltas"]:
        out += ["| row | check | metric | before | after | Δ |", "|---|---|---|---|---|---|"]
        for d in base["metric_deltas"]:
            out.append(f"| {d['row']} | {_md_escape(short_check(d['check']))} | {d['metric']} | {_fmt_num(d['before'])} | "
                       f"{_fmt_num(d['after'])} | {d['delta']:+.3f} |")
        out.append("")
    changed_p = [p for p in base["paired"] if p["right_in_a_only"] or p["right_in_b_only"]]
    if base["paired"]:
        out.append(f"GSM8K per question against the baseline: {len(base['paired']) - len(changed_p)} of "
                   f"{len(base['paired'])} check(s) answered identically.")
    for p in changed_p:
        out.append(f"- {p['row']} {p['key']}: {p['a_correct']}/{p['n']} → {p['b_correct']}/{p['n']}, "
                   f"{p['right_in_a_only']} now wrong {_idx(p['flipped_to_wrong'], 10)}, {p['right_in_b_only']} now "
                   f"right, McNemar p={_fmt_p(p['p_value'])}{' **' if p['p_value'] < ALPHA else ''}")
    if base["paired"]:
        out.append("")
    return out


# ---------------------------------------------------------------------------------------------------------------
# HTML (one self-contained page)
# ---------------------------------------------------------------------------------------------------------------

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;color:#1f2328;
 margin:0;padding:20px 28px;background:#f6f8fa}
h1{font-size:20px;margin:0 0 10px}
h2{font-size:16px;margin:26px 0 8px;padding-bottom:4px;border-bottom:1px solid #d0d7de}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.banner{padding:12px 16px;border-radius:6px;font-size:16px;font-weight:600;margin-bottom:14px}
.banner.ok{background:#dafbe1;color:#116329;border:1px solid #4ac26b}
.banner.bad{background:#ffebe9;color:#a40e26;border:1px solid #ff8182}
.banner.partial{background:#fff8c5;color:#7d4e00;border:1px solid #d4a72c}
.meta{color:#59636e;font-size:12.5px;margin-bottom:12px}
table{border-collapse:collapse;background:#fff;border:1px solid #d0d7de;width:100%}
th,td{border:1px solid #d0d7de;padding:6px 9px;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600;font-size:12.5px}
td.v{text-align:center;font-weight:600;min-width:96px}
.passed{background:#dafbe1;color:#116329}.failed{background:#ffcecb;color:#a40e26}
.error{background:#ffe2b8;color:#953800}.skipped{background:#eef1f4;color:#656d76;font-weight:400}
.pending{background:#fff8c5;color:#7d4e00}.none{background:#fff;color:#8c959f;font-weight:400}
.known-upstream{background:#fff1e5;color:#7d4e00}
.small{font-size:12px;color:#59636e;font-weight:400}
.kind{display:inline-block;font-size:11.5px;padding:0 6px;border-radius:10px;background:rgba(0,0,0,.08);margin-top:2px}
.rowid{font-weight:600;white-space:nowrap}
td.row{max-width:250px}td.row .small{display:block;white-space:normal;margin-top:2px}
.vers{font-size:12px;color:#424a53;white-space:nowrap}
.ovr{display:inline-block;font-size:11.5px;background:#ddf4ff;color:#0550ae;border-radius:10px;padding:0 7px;margin:2px 0}
.logs a,.logs span{display:block;font-size:12px;white-space:nowrap}.logs span{color:#afb8c1}
.inline .logs a,.inline .logs span{display:inline;margin-right:10px}
details{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:8px 0;padding:0 12px}
details[open]{padding-bottom:10px}
summary{cursor:pointer;padding:8px 0;font-weight:600}
.fail{border-left:3px solid #cf222e;padding:4px 10px;margin:6px 0;background:#fff5f5}
.fail.err{border-left-color:#bc4c00;background:#fff8f0}
.msg{white-space:pre-wrap;word-break:break-word}
ul.skips{margin:6px 0;padding-left:20px;color:#59636e}
.better{color:#116329;font-weight:600}.worse{color:#a40e26;font-weight:600}
.sig{font-weight:700;color:#a40e26}
.legend span{display:inline-block;padding:1px 8px;border-radius:4px;margin-right:6px;font-size:12px}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _cell_html(t: dict | None) -> str:
    if t is None:
        return '<td class="v none">—</td>'
    v = t["verdict"]
    inner = f"{GLYPHS.get(v, '?')} {_e(v)}"
    title = ""
    if v in BAD:
        if t["failure_kinds"]:
            inner += "<br>" + " ".join(f'<span class="kind">{_e(k)}</span>' for k in t["failure_kinds"])
        f0 = next((f for f in t["failures"] if f.get("message")), None)
        if f0:
            title = f0["message"]
        n_bad = sum(t["counts"].get(k, 0) for k in BAD)
        n_all = sum(t["counts"].values())
        if n_all:
            inner += f'<br><span class="small">{n_bad}/{n_all} failed</span>'
    elif v == KNOWN_UPSTREAM:
        title = "; ".join(k["summary"] for k in t["known_upstream"])
        inner += "".join(f'<br><span class="small">{_e(k["package"])} {_e(k["version"])}</span>'
                         for k in t["known_upstream"])
    elif v == "skipped":
        title = t.get("reason") or ""
    elif v == "passed":
        n_all = sum(t["counts"].values())
        n_skip = t["counts"].get("skipped", 0)
        extra = _plural(n_all - n_skip, "check") + (f", {n_skip} skipped" if n_skip else "")
        if t.get("seconds") is not None:
            extra += f", {_fmt_dur(t['seconds'])}"
        inner += f'<br><span class="small">{_e(extra)}</span>'
    return f'<td class="v {_e(v)}" title="{_e(title)}">{inner}</td>'


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_dur(s) -> str:
    if not _is_number(s):
        return "?"
    s = float(s)
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _logs_html(r: dict) -> str:
    parts = []
    for name in ("install.log", "pytest.log", "freeze.txt", "junit.xml"):
        rel = r["logs"].get(name)
        parts.append(f'<a href="{_e(rel)}">{_e(name)}</a>' if rel else f"<span>{_e(name)}</span>")
    return '<div class="logs">' + "".join(parts) + "</div>"


def render_html(summary: dict) -> str:
    tiers = summary["tiers"]
    cls, glyph = BANNERS[summary["verdict"]]
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>MTP matrix {_e(summary['run_id'])}: {_e(summary['verdict'])}</title>",
         f"<style>{_CSS}</style></head><body>",
         f"<h1>Gemma 4 MTP qualification matrix — run <code>{_e(summary['run_id'])}</code></h1>",
         f'<div class="banner {cls}">{glyph} {_e(_headline(summary))}</div>']
    hosts = sorted({(r.get("host") or {}).get("hostname", "") for r in summary["rows"]} - {""})
    gpus = sorted({r.get("gpus") for r in summary["rows"] if r.get("gpus") is not None})
    meta = [f"generated {_e(summary['generated'])}"]
    if hosts:
        meta.append("host " + _e(", ".join(hosts)))
    if gpus:
        meta.append("GPUs " + _e(", ".join(str(g) for g in gpus)))
    if summary.get("baseline"):
        meta.append(f"baseline <code>{_e(summary['baseline']['run_id'])}</code>")
    h.append(f'<div class="meta">{" · ".join(meta)}</div>')

    # the matrix
    h.append("<table><thead><tr><th>row</th><th>versions</th>"
             + "".join(f"<th>{_e(t)}</th>" for t in tiers) + "<th>row verdict</th><th>logs</th></tr></thead><tbody>")
    for r in summary["rows"]:
        v = r["versions"]
        pin = "" if r["versions_installed"] else ' <span class="small">(pinned; not installed)</span>'
        vers = "<br>".join(f"{p} <b>{_e(v.get(p) or '?')}</b>" for p in (*MAIN_PACKAGES, "python"))
        ovr = "".join(f'<br><span class="ovr">--with {_e(o)}</span>' for o in r["overrides"])
        desc = f'<span class="small">{_e(r["description"])}</span>' if r["description"] else ""
        h.append(f'<tr><td class="row"><span class="rowid">{_e(r["id"])}</span>{ovr}{desc}</td>'
                 f'<td class="vers">{vers}{pin}</td>')
        if r["install"]["verdict"] == "failed":
            msg = (r["install"].get("failure") or {}).get("message", "install failed")
            h.append(f'<td class="v failed" colspan="{len(tiers)}" title="{_e(msg)}">✗ install failed'
                     f'<br><span class="small mono">{_e(_fmt_other(msg, 140))}</span></td>')
        else:
            h.extend(_cell_html(r["tiers"].get(t)) for t in tiers)
        h.append(f'<td class="v {_e(r["verdict"])}">{GLYPHS.get(r["verdict"], "?")} {_e(r["verdict"])}</td>'
                 f"<td>{_logs_html(r)}</td></tr>")
    h.append("</tbody></table>")
    h.append('<div class="legend meta" style="margin-top:6px">'
             + "".join(f'<span class="{v}">{GLYPHS[v]} {v}</span>' for v in VERDICTS)
             + " hover a cell for the first failure message or the skip reason</div>")
    if summary["skips"]:
        h.append('<ul class="skips">')
        for g in summary["skips"]:
            h.append(f"<li><b>{_e(_skip_where(g, 'skipped in'))}</b>: {_e(g['reason'])}</li>")
        h.append("</ul>")
    if summary.get("known_upstream") or summary.get("stale_known_upstream"):
        h.append("<p><b>Known upstream</b> (listed in known_upstream.json: a library's bugs and known sglang "
                 "deviations from transformers; they do not fail the row)</p><ul>")
        for k in summary.get("known_upstream") or []:
            fixed = f", fixed in {k['fixed_in']}" if k.get("fixed_in") else ""
            h.append(f'<li class="known-upstream">{GLYPHS[KNOWN_UPSTREAM]} <b>{_e(k["row"])}</b> {_e(k["tier"])} · '
                     f'{_e(k["package"])} {_e(k["version"])}{" · serving path" if k.get("serving_path") else ""} · '
                     f'<code>{_e(k["id"])}</code> ({len(k["checks"])} '
                     f'checks): {_e(k["summary"])} <a href="{_e(k["upstream"])}">{_e(k["upstream"])}</a>'
                     f"{_e(fixed)}</li>")
        for k in summary.get("stale_known_upstream") or []:
            h.append(f"<li>entry <code>{_e(k['id'])}</code> can go: with {_e(k['package'])} {_e(k['version'])} in "
                     f"its range, {len(k['checks'])} of its checks pass in {_e(k['row'])} {_e(k['tier'])}</li>")
        h.append("</ul>")

    if summary.get("relaunched"):
        h.append("<p><b>Relaunched alone</b> (failed beside other servers; the verdict is from the relaunch)</p><ul>")
        for x in summary["relaunched"]:
            h.append(f'<li>{_e(x["row"])} · {_e(x["tier"])} · <code>{_e(x["server_log"])}</code>: '
                     f'<span class="mono">{_e(x["error"])}</span></li>')
        h.append("</ul>")

    # failures
    failing = [r for r in summary["rows"] if r["verdict"] in BAD]
    if failing:
        h.append("<h2>Failures</h2>")
        for r in failing:
            kinds = sorted({k for t in r["tiers"].values() for k in t["failure_kinds"]}
                           | ({"install"} if r["install"]["verdict"] == "failed" else set()))
            h.append(f'<details open><summary>{GLYPHS[r["verdict"]]} {_e(r["id"])} — '
                     f'{_e(", ".join(kinds) or r["verdict"])}</summary>')
            if r["install"]["verdict"] == "failed":
                f = r["install"].get("failure") or {}
                h.append(f'<div class="fail"><b>install</b> <span class="kind">install</span>'
                         f'<div class="msg mono">{_e(f.get("message"))}</div></div>')
            for tier in tiers:
                for f in (r["tiers"].get(tier) or {}).get("failure_groups", []):
                    cls = "fail err" if f["outcome"] == "error" else "fail"
                    shorts = f.get("shorts") or []
                    label = shorts[0] if len(shorts) == 1 else (f"{len(shorts)} checks" if shorts else "")
                    h.append(f'<div class="{cls}"><b>{_e(tier)}</b> <span class="kind">{_e(f.get("kind") or "?")}</span> '
                             f'<span class="mono" title="{_e(", ".join(shorts))}">{_e(label)}</span>'
                             f'<div class="msg mono">{_e((f["type"] + ": ") if f.get("type") else "")}'
                             f'{_e(f.get("message"))}</div>')
                    if f.get("frame"):
                        h.append(f'<div class="small">first library frame <code>{_e(f["frame"])}</code></div>')
                    if f.get("raised_at") and f.get("raised_at") != f.get("frame"):
                        h.append(f'<div class="small">raised at <code>{_e(f["raised_at"])}</code></div>')
                    h.append("</div>")
            cp = r.get("closest_passing")
            if cp:
                src = " (compared on pins: this row never installed)" if cp.get("source") == "pins" else ""
                h.append(f'<p><b>Closest passing row: {_e(cp["row"])}</b> — {cp["distance"]} package(s) differ{src}</p>')
                if cp["differences"]:
                    h.append(f"<table style=\"width:auto\"><tr><th>package</th><th>{_e(r['id'])}</th>"
                             f"<th>{_e(cp['row'])}</th></tr>")
                    for d in cp["differences"]:
                        h.append(f"<tr><td>{_e(d['package'])}</td><td class=\"mono\">{_e(d['this'] or '–')}</td>"
                                 f"<td class=\"mono\">{_e(d['other'] or '–')}</td></tr>")
                    h.append("</table>")
            elif "closest_passing" in r:
                h.append("<p>No passing row to compare with.</p>")
            h.append(f'<div class="inline">{_logs_html(r)}</div></details>')

    # metrics
    metric_rows = [(r["id"], m) for r in summary["rows"] for m in r["metrics"] if m.get("known")]
    other_rows = [(r["id"], m) for r in summary["rows"] for m in r["metrics"] if not m.get("known")]
    if metric_rows:
        h.append("<h2>Metrics</h2><table><thead><tr><th>row</th><th>tier</th><th>case</th><th>GSM8K score [95% CI]</th>"
                 "<th>accept length</th><th>speedup</th><th>other</th></tr></thead><tbody>")
        for rid, m in metric_rows:
            other = "<br>".join(f"{_e(k)} = <span class=\"mono\">{_e(_fmt_other(v))}</span>"
                                for k, v in (m.get("other") or {}).items())
            cls = m.get("outcome") if m.get("outcome") in BAD else ""
            h.append(f'<tr><td class="rowid">{_e(rid)}</td><td>{_e(m["tier"])}</td>'
                     f'<td class="mono {cls}">{_e(m["short"])}</td><td>{_e(_score_text(m))}</td>'
                     f"<td>{_e(_fmt_num(m['accept_length'])) if 'accept_length' in m else ''}</td>"
                     f"<td>{_e(_fmt_num(m['speedup'], 2) + '×') if 'speedup' in m else ''}</td>"
                     f'<td class="small">{other}</td></tr>')
        h.append("</tbody></table>")
    if other_rows:
        h.append('<details><summary>Other recorded metrics</summary><table><thead><tr><th>row</th><th>tier</th>'
                 "<th>case</th><th>metrics</th></tr></thead><tbody>")
        for rid, m in other_rows:
            other = "<br>".join(f"{_e(k)} = <span class=\"mono\">{_e(_fmt_other(v, 120))}</span>"
                                for k, v in (m.get("other") or {}).items())
            h.append(f'<tr><td class="rowid">{_e(rid)}</td><td>{_e(m["tier"])}</td>'
                     f'<td class="mono">{_e(m["short"])}</td><td class="small">{other}</td></tr>')
        h.append("</tbody></table></details>")

    if summary["paired"]:
        h.append("<h2>GSM8K per question, row against row (McNemar exact)</h2><table><thead><tr><th>check</th>"
                 "<th>row A</th><th>row B</th><th>n</th><th>A right</th><th>B right</th><th>A✓ B✗</th>"
                 "<th>A✗ B✓</th><th>p</th><th>flipped questions</th></tr></thead><tbody>")
        for p in summary["paired"]:
            sig = ' class="sig"' if p["p_value"] < ALPHA else ""
            flips = (f"now wrong: {_e(_idx(p['flipped_to_wrong'], 12))}<br>now right: "
                     f"{_e(_idx(p['flipped_to_right'], 12))}")
            h.append(f'<tr><td class="mono">{_e(p["key"])}</td><td>{_e(p["row_a"])}</td><td>{_e(p["row_b"])}</td>'
                     f"<td>{p['n']}</td><td>{p['a_correct']}</td><td>{p['b_correct']}</td>"
                     f"<td>{p['right_in_a_only']}</td><td>{p['right_in_b_only']}</td>"
                     f"<td{sig}>{_e(_fmt_p(p['p_value']))}</td><td class=\"small\">{flips}</td></tr>")
        h.append("</tbody></table>")

    if summary.get("baseline"):
        h.append(_html_baseline(summary["baseline"]))

    h.append(f'<p class="meta">summary.md and summary.json next to this page hold the same data · run '
             f"{_e(summary['run_id'])}</p></body></html>")
    return "\n".join(h) + "\n"


def _html_baseline(base: dict) -> str:
    h = [f"<h2>Compared with baseline <code>{_e(base['run_id'])}</code></h2>"]
    nf, fx = base["new_failures"], base["fixed"]
    line = f'<p><span class="worse">{len(nf)} new failure(s)</span> · <span class="better">{len(fx)} fixed</span>'
    if base["new_rows"]:
        line += f" · new rows: {_e(', '.join(base['new_rows']))}"
    if base["missing_rows"]:
        line += f" · not in this run: {_e(', '.join(base['missing_rows']))}"
    h.append(line + "</p>")
    tiers = [t for t in ("install", *TIERS) if any(t in r["tiers"] for r in base["rows"])]
    h.append("<table><thead><tr><th>row</th>" + "".join(f"<th>{_e(t)}</th>" for t in tiers)
             + "<th>row</th></tr></thead><tbody>")
    for r in base["rows"]:
        h.append(f'<tr><td class="rowid">{_e(r["row"])}</td>')
        for t in tiers:
            tv = r["tiers"].get(t)
            if not tv:
                h.append('<td class="v none">—</td>')
                continue
            ch = tv.get("change", "same")
            cls = tv["after"] if ch != "same" else "none"
            arrow = {"better": "▲ ", "worse": "▼ "}.get(ch, "")
            h.append(f'<td class="v {_e(cls)}" title="{_e(tv.get("label", ""))}">{arrow}{GLYPHS.get(tv["before"], "—")} → '
                     f'{GLYPHS.get(tv["after"], "—")}<br><span class="small">{_e(tv.get("label", ""))}</span></td>')
        arrow = {"better": "▲ ", "worse": "▼ "}.get(r["change"], "")
        h.append(f'<td class="v {"none" if r["change"] == "same" else _e(r["after"])}">{arrow}{_e(r["before"] or "—")} → '
                 f'{_e(r["after"] or "—")}</td></tr>')
    h.append("</tbody></table>")
    if nf or fx:
        h.append("<ul>")
        for i in nf:
            where = f" at <code>{_e(i['frame'])}</code>" if i.get("frame") else ""
            h.append(f'<li><span class="worse">new failure</span> <b>{_e(i["row"])}</b> {_e(i["tier"])} '
                     f'<span class="mono">{_e(short_check(i["check"] or ""))}</span> '
                     f'<span class="kind">{_e(i.get("kind") or "?")}</span> {_e(i.get("message") or "")}{where}</li>')
        for i in fx:
            h.append(f'<li><span class="better">fixed</span> <b>{_e(i["row"])}</b> {_e(i["tier"])} '
                     f'<span class="mono">{_e(short_check(i["check"] or ""))}</span></li>')
        h.append("</ul>")
    if base["metric_deltas"]:
        h.append('<table style="width:auto"><thead><tr><th>row</th><th>check</th><th>metric</th><th>before</th>'
                 "<th>after</th><th>Δ</th></tr></thead><tbody>")
        for d in base["metric_deltas"]:
            cls = "better" if d["delta"] > 0 else "worse"
            h.append(f'<tr><td>{_e(d["row"])}</td><td class="mono">{_e(short_check(d["check"]))}</td>'
                     f'<td>{_e(d["metric"])}</td><td>{_e(_fmt_num(d["before"]))}</td><td>{_e(_fmt_num(d["after"]))}</td>'
                     f'<td class="{cls}">{d["delta"]:+.3f}</td></tr>')
        h.append("</tbody></table>")
    if base["paired"]:
        changed_p = [p for p in base["paired"] if p["right_in_a_only"] or p["right_in_b_only"]]
        h.append(f"<p>GSM8K per question against the baseline: {len(base['paired']) - len(changed_p)} of "
                 f"{len(base['paired'])} check(s) answered identically.</p><ul>")
        for p in changed_p:
            sig = ' class="sig"' if p["p_value"] < ALPHA else ""
            h.append(f"<li><b>{_e(p['row'])}</b> <span class=\"mono\">{_e(p['key'])}</span>: "
                     f"{p['a_correct']}/{p['n']} → {p['b_correct']}/{p['n']}; {p['right_in_a_only']} now wrong "
                     f"({_e(_idx(p['flipped_to_wrong'], 12))}), {p['right_in_b_only']} now right; "
                     f"<span{sig}>McNemar p = {_e(_fmt_p(p['p_value']))}</span></li>")
        h.append("</ul>")
    return "\n".join(h)


# ---------------------------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------------------------

def parse_require(text: str | None) -> list[str]:
    """``--require smoke,gsm8k`` -> ["smoke", "gsm8k"]; ReportError (one line) for an unknown tier."""
    tiers = [t.strip() for t in (text or "").split(",") if t.strip()]
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise ReportError(f"--require: unknown tier(s) {', '.join(bad)}; known: {', '.join(TIERS)}")
    return tiers


def write_report(results: Path, run_id: str | None = None, *, baseline: str | None = None,
                 out: Path | None = None, require: list[str] | tuple[str, ...] = ()) -> tuple[dict, dict[str, Path]]:
    """Build and write the report; returns (summary, {"md": ..., "html": ..., "json": ...})."""
    run_dir = resolve_run(results, run_id)
    base_dir = resolve_run(results, baseline) if baseline else None
    if base_dir is not None and base_dir.resolve() == run_dir.resolve():
        raise ReportError(f"--baseline {baseline} is the run being reported")
    out_dir = Path(out) if out else run_dir / REPORT_DIR
    summary = build_summary(run_dir, baseline_dir=base_dir, out_dir=out_dir, require=require)
    md = render_markdown(summary)
    paths = {"md": out_dir / "summary.md", "html": out_dir / "report.html", "json": out_dir / "summary.json"}
    atomic_write_text(paths["md"], md)
    atomic_write_text(paths["html"], render_html(summary))
    atomic_write_json(paths["json"], summary)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        with open(step, "a") as fh:
            fh.write(md + "\n")
    return summary, paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="results/<RUN_ID>/ (default: the latest run)")
    p.add_argument("--results", type=Path, default=Path(os.environ.get("MTPMATRIX_RESULTS_ROOT", "results")),
                   help="results root (default: results, env MTPMATRIX_RESULTS_ROOT)")
    p.add_argument("--baseline", metavar="RUN_ID", help="compare with this earlier run")
    p.add_argument("--out", type=Path, help="write here instead of results/<RUN_ID>/report/")
    p.add_argument("--require", metavar="TIERS", default="",
                   help="release gate: exit 3 unless these tiers ran (and passed) in every row, e.g. smoke,gsm8k")


def run(ns: argparse.Namespace) -> int:
    try:
        summary, paths = write_report(ns.results, ns.run_id, baseline=ns.baseline, out=ns.out,
                                      require=parse_require(ns.require))
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{MARKS[summary['verdict']]} {_headline(summary)}")
    for r in summary["rows"]:
        cells = ", ".join(f"{t}={r['tiers'][t]['verdict']}" for t in summary["tiers"] if t in r["tiers"])
        if r["install"]["verdict"] == "failed":
            cells = "install failed"
        print(f"  {GLYPHS.get(r['verdict'], '?')} {r['id']}: {r['verdict']} ({cells})")
    if summary.get("baseline"):
        b = summary["baseline"]
        print(f"  vs {b['run_id']}: {len(b['new_failures'])} new failure(s), {len(b['fixed'])} fixed")
    print(f"report: {paths['html']}\n        {paths['md']}\n        {paths['json']}")
    return summary["exit_status"]
