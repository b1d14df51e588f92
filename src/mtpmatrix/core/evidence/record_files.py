"""The files beside a row's record, judged: tiers.json (what the plugin wrote) and junit.xml (what pytest wrote) say
the same outcome for every check as row.json (junit.xml's xfail, how the suite writes a known-upstream failure, is a
failure's), and row.json tells the same story as tiers.json: the suite, the versions, the selection, the session,
the GPUs and each check's metrics."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from mtpmatrix.core import schema
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.record_types import Problem, RowRecord, problem
from mtpmatrix.core.schema import short_check_id

_JUNIT_RANK = {"skipped": 0, "passed": 1, "xfailed": 2, "failed": 3, "error": 4}
XFAILED = "xfailed"  # pytest's <skipped type="pytest.xfail">: how the suite writes a known-upstream failure
_SAYS_FAILED: dict[str, tuple[str, ...]] = {
    "failed": (XFAILED,),
    "error": (XFAILED,),
}  # what junit.xml may say of a record's failure besides it


def junit_outcomes(path: Path) -> dict[str, str]:
    """{check id: outcome} of a junit.xml (``file::name``, as pytest's node ids); ValueError when unreadable. A
    known-upstream failure is ``xfailed`` (the plugin reports it as pytest's xfail: known_failures.py)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise ValueError(str(exc)) from None
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        f, name = case.get("file"), case.get("name")
        if not f or not name:
            continue
        tags = {child.tag for child in case}
        xfail = any(child.tag == "skipped" and child.get("type") == "pytest.xfail" for child in case)
        outcome = (
            "error"
            if "error" in tags
            else "failed"
            if "failure" in tags
            else XFAILED
            if xfail
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        cid = f"{f}::{name}"
        # a second entry for the same test (a teardown error; the side-by-side processes' parts, where the process
        # that does not run a check skips it): the one that says most stands
        if _JUNIT_RANK[outcome] > _JUNIT_RANK.get(out.get(cid, ""), -1):
            out[cid] = outcome
    return out


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _same_story(record: RowRecord, written: dict[str, Any]) -> list[Problem]:
    """What row.json says of the session against what the plugin wrote in tiers.json: the suite, the versions it
    saw, the selection (args, knobs, collected) and each check's metrics."""
    out = []
    here, there = (record.get("fingerprint") or {}), (written.get("fingerprint") or {})
    if isinstance(there, dict) and here.get("suite") != there.get("suite"):
        out.append(
            problem(
                None,
                f"row.json names suite {str(here.get('suite'))[:12]}, {schema.TIERS_FILE} "
                f"{str(there.get('suite'))[:12]}",
            )
        )
    versions = written.get("versions")
    seen = versions if isinstance(versions, dict) else {}
    mine = record.get("versions") or {}
    differ = sorted(k for k, v in seen.items() if v and mine.get(k) != v)
    if differ:
        out.append(
            problem(None, f"row.json's versions of {', '.join(differ)} are not the ones {schema.TIERS_FILE} recorded")
        )
    if _dumps(record.get("selection")) != _dumps(written.get("selection")):
        out.append(problem(None, f"row.json's selection (args, knobs, collected checks) is not {schema.TIERS_FILE}'s"))
    for key in (*schema.SESSION_FIELDS, "gpus"):
        if key in written and _dumps(record.get(key)) != _dumps(written.get(key)):
            out.append(problem(None, f"row.json's {key} is not {schema.TIERS_FILE}'s"))
    metrics = {
        c.get("id"): c.get("metrics")
        for e in (written.get("tiers") or {}).values()
        if isinstance(e, dict)
        for c in e.get("checks") or []
        if isinstance(c, dict)
    }
    for tier, entry in (record.get("tiers") or {}).items():
        for chk in entry.get("checks") or []:
            if chk["id"] in metrics and _dumps(chk.get("metrics")) != _dumps(metrics[chk["id"]]):
                out.append(
                    problem(tier, f"row.json's metrics of {short_check_id(chk['id'])} are not {schema.TIERS_FILE}'s")
                )
    return out


def judge(record: RowRecord, row_dir: Path) -> list[Problem]:
    """Every disagreement between ``record`` and the files beside it in ``row_dir``."""
    checks = {
        c["id"]: (t, c.get("outcome")) for t, e in (record.get("tiers") or {}).items() for c in e.get("checks") or []
    }
    if not checks:
        return []
    out = []
    tiers_file = row_dir / schema.TIERS_FILE
    try:
        data = read_json(tiers_file)
        written = {
            c.get("id"): c.get("outcome")
            for e in (data.get("tiers") or {}).values()
            for c in e.get("checks") or []
            if isinstance(c, dict)
        }
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        out.append(problem(None, f"{schema.TIERS_FILE} beside the record is missing or unreadable ({exc})"))
        written = None
    if written is not None:
        for cid, (tier, outcome) in checks.items():
            if written.get(cid) != outcome:
                out.append(
                    problem(
                        tier,
                        f"row.json says {short_check_id(cid)} {outcome}, {schema.TIERS_FILE} says "
                        f"{written.get(cid) or 'nothing'}",
                    )
                )
        out += _same_story(record, data)
    try:
        junit = junit_outcomes(row_dir / schema.JUNIT_FILE)
    except ValueError as exc:
        return out + [problem(None, f"{schema.JUNIT_FILE} beside the record is missing or unreadable ({exc})")]
    for cid, (tier, outcome) in checks.items():
        if outcome == "skipped" and cid not in junit:
            continue  # deselected or not-selected checks may be absent from junit
        if junit.get(cid) != outcome and junit.get(cid) not in _SAYS_FAILED.get(outcome or "", ()):
            out.append(
                problem(
                    tier,
                    f"the record says {short_check_id(cid)} {outcome}, {schema.JUNIT_FILE} says "
                    f"{junit.get(cid) or 'nothing'}",
                )
            )
    return out
