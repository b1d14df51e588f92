"""A run's evidence, judged and applied: the manifest read (merged), this checkout's suite compared with the run's,
each row judged (judge.judge_row) and every tier a problem touches made 'not-proven'; planned rows without a record
added as rows that did not run. The report reads a run through here (report/summary.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from mtpmatrix.core import paths
from mtpmatrix.core.evidence import checkout, expected_checks, fingerprint, judge, manifest, records, session
from mtpmatrix.core.record_types import EvidenceSummary, Fingerprint, Manifest, Problem, RowRecord, problem
from mtpmatrix.core.schema import UNPROVEN
from mtpmatrix.core.store import row_verdict


def judge_run(run_dir: Path, rows: dict[str, RowRecord]) -> EvidenceSummary:
    """What the run's records prove (evidence.judge), applied to ``rows`` in place: a tier with a problem becomes
    'not-proven' (``unproven``: why), a row with a problem of its own too; a planned row with no record is added as a
    'not-proven' row (not run). Returns ``{"run": [why], "rows": {row id: [problem]}}``."""
    run_dir = Path(run_dir)
    run_problems: list[str] = []
    try:
        plan = manifest.read(run_dir)
    except manifest.ManifestError as exc:
        plan = None
        run_problems.append(str(exc))
    else:
        if plan is None:
            run_problems.append(
                "the run has no manifest: it cannot show which rows it planned, with which pins and "
                "which suite (written before runs recorded their plan)"
            )
    try:
        here = fingerprint.describe()
    except fingerprint.FingerprintError as exc:
        here = None
        run_problems.append(f"this checkout cannot fingerprint its suite ({exc})")
    run_problems += [f"the run's plans disagree: {c}" for c in (plan.get("conflicts") or [] if plan else [])]
    planned_fp: Fingerprint | None = plan.get("fingerprint") if plan else None
    if plan is not None and here is not None and (planned_fp or {}).get("suite") != here["suite"]:
        run_problems.append(
            f"the run's suite {fingerprint.short(planned_fp)} is not this checkout's "
            f"{fingerprint.short(here)}: report it from the commit that ran it"
        )
    if os.environ.get(expected_checks.ENV):
        run_problems.append(
            f"judged under {expected_checks.ENV}={os.environ[expected_checks.ENV]}: not the project's expected checks"
        )
    by_row: dict[str, list[Problem]] = {}
    shared = session.shared_sessions(rows)  # one session filed as two rows proves neither
    for rid, rec in rows.items():
        if rec.get("unreadable"):
            found = [problem(None, f"unreadable record: {why}") for why in rec["unreadable"]]
        else:
            found = judge.judge_row(rid, rec, run_id=run_dir.name, manifest=plan, row_dir=run_dir / rid)
            found += stale(rid, rec, plan)
        if (run_dir / rid).is_symlink():  # another run's folder, linked in: not this run's record
            found.append(problem(None, "the row folder is a link to another folder"))
        found += shared.get(rid, [])
        by_row[rid] = found
        apply_problems(rec, found)
    planned = plan.get("rows") or {} if plan else {}
    for rid in sorted(set(planned) - set(rows)):
        why = (plan.get("not_run") or {} if plan else {}).get(rid) or "no record: the row's session never wrote one"
        rows[rid] = apply_problems(records.shell(rid, []), [problem(None, f"not run: {why}")])
        rows[rid]["row"]["pins"] = (planned[rid] or {}).get("pins") or {}
        by_row[rid] = [problem(None, f"not run: {why}")]
    here_state = checkout.state()
    if here_state["commit"] is None and here_state["distribution"] is None:
        run_problems.append(
            "judged by a checkout with no git commit and no installed distribution whose RECORD lists its files: its "
            "verdict-deciding files (the suite, the expected checks, settings.py, known_upstream.json) are not "
            "vouched for (judge from a git checkout)"
        )
    elif here_state["commit"] is None and here_state["changed"]:
        run_problems.append(
            f"judged by the installed {here_state['distribution']}, whose "
            f"{', '.join(here_state['changed'])} differ from its RECORD"
        )
    return {
        "run": run_problems,
        "rows": {rid: p for rid, p in by_row.items() if p},
        "suite": fingerprint.short(planned_fp) if planned_fp else None,
        # what differs from the commit, named in the headline: the judging checkout's files, and the run's suite's
        "checkout": {
            "commit": here_state["commit"],
            "changed": here_state["changed"],
            "distribution": here_state["distribution"],
            "run_commit": (planned_fp or {}).get("commit"),
            "run_changed": (planned_fp or {}).get("changed") or [],
        },
    }


def stale(row_id: str, record: RowRecord, plan: Manifest | None) -> list[Problem]:
    """A problem when the row's constraints file is no longer the one the run planned (manifest ``constraints_sha256``):
    the record shows what the row was, not what it is now. A canary's constraints are resolved into its own run, and a
    plan written before runs recorded the checksum has nothing to compare."""
    want = (((plan or {}).get("rows") or {}).get(row_id) or {}).get("constraints_sha256")
    if not want or record.get("canary"):
        return []
    name = str((record.get("row") or {}).get("constraints"))
    try:
        paths.single_name(name, "constraints file")
        text = (paths.CONSTRAINTS_DIR / name).read_text()  # as the plan read it (manifest.planned_row)
    except (paths.NameError_, OSError, ValueError) as exc:
        return [problem(None, f"the row's constraints file cannot be compared with the run's ({exc})")]
    if hashlib.sha256(text.encode()).hexdigest() != want:
        return [
            problem(
                None,
                f"constraints/{name} changed since the run: the record shows the row as it was, not as it is "
                "(run it again)",
            )
        ]
    return []


def apply_problems(record: RowRecord, problems: list[Problem]) -> RowRecord:
    """Make every tier a problem touches 'not-proven' (why under ``unproven``); a row-level problem touches every tier
    that ran and the row itself."""
    row_level = [p["what"] for p in problems if p["tier"] is None]
    for tier, entry in (record.get("tiers") or {}).items():
        whys = row_level if entry.get("checks") else []
        whys = whys + [p["what"] for p in problems if p["tier"] == tier]
        if whys:
            entry["unproven"] = whys
            entry["verdict"] = UNPROVEN
    if row_level:
        record["unproven"] = row_level
        record["verdict"] = UNPROVEN
    elif problems and record.get("verdict") not in (None, "pending"):
        record["verdict"] = row_verdict(record)
    return record
