"""A row record's shape, checked before anything reads it: every reader (the report, import, bisect) may then take
the fields it needs without guarding each one, and a record whose shape is off -- a field edited by hand, a file cut
short, a record of another tool -- is "not proven" with the reason, never a traceback.

Outcomes are one closed set (OUTCOMES); a check id appears once in a row.
"""

from __future__ import annotations

from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.schema import TIERS

OUTCOMES = ("passed", "failed", "error", "skipped")
_TEXT_OR_NONE = (str, type(None))


def _is_text_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, _TEXT_OR_NONE) for k, v in value.items()
    )


def _check_problems(tier: str, i: int, chk: object, seen: set[str]) -> list[str]:
    where = f"tiers.{tier}.checks[{i}]"
    if not isinstance(chk, dict):
        return [f"{where} is not an object"]
    out = []
    cid = chk.get("id")
    if not isinstance(cid, str) or not cid:
        out.append(f"{where} has no id")
    elif cid in seen:
        out.append(f"check {cid} appears twice")
    else:
        seen.add(cid)
    if chk.get("outcome") not in OUTCOMES:
        out.append(f"{where} ({cid}): outcome {chk.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
    if "metrics" in chk and not isinstance(chk["metrics"], dict):
        out.append(f"{where} ({cid}): metrics is not an object")
    if "failure" in chk and not isinstance(chk["failure"], dict):
        out.append(f"{where} ({cid}): failure is not an object")
    elif isinstance(chk.get("failure"), dict):
        bad = sorted(
            k
            for k in ("kind", "type", "message", "frame", "raised_at")
            if not isinstance(chk["failure"].get(k), _TEXT_OR_NONE)
        )
        if bad:
            out.append(f"{where} ({cid}): failure {', '.join(bad)} not text")
    reruns = chk.get("reruns", 0)
    if not isinstance(reruns, int) or isinstance(reruns, bool) or reruns < 0:
        out.append(f"{where} ({cid}): reruns is not a whole number")
    if "reason" in chk and not isinstance(chk["reason"], str):
        out.append(f"{where} ({cid}): reason is not text")
    if "known_upstream" in chk and not isinstance(chk["known_upstream"], str):
        out.append(f"{where} ({cid}): known_upstream is not text")
    if "tier" in chk and chk["tier"] != tier:
        out.append(f"{where} ({cid}): filed under {tier} but says tier {chk['tier']!r}")
    return out


def tiers_problems(tiers: object) -> list[str]:
    """What is off in a ``tiers`` object (row.json's or tiers.json's)."""
    if not isinstance(tiers, dict):
        return ["tiers is not an object"]
    out = []
    seen: set[str] = set()
    for tier, entry in tiers.items():
        if tier not in TIERS:
            out.append(f"unknown tier {tier!r}")
            continue
        if not isinstance(entry, dict):
            out.append(f"tiers.{tier} is not an object")
            continue
        for key in ("verdict", "reason"):
            if not isinstance(entry.get(key), _TEXT_OR_NONE):
                out.append(f"tiers.{tier}.{key} is not text")
        if not isinstance(entry.get("seconds", 0), (int, float)) or isinstance(entry.get("seconds"), bool):
            out.append(f"tiers.{tier}.seconds is not a number")
        checks = entry.get("checks", [])
        if not isinstance(checks, list):
            out.append(f"tiers.{tier}.checks is not a list")
            continue
        for i, chk in enumerate(checks):
            out.extend(_check_problems(tier, i, chk, seen))
        for key in ("missing", "known_upstream", "stale_known_upstream", "unshown_known_upstream", "failure_kinds"):
            if key in entry and not isinstance(entry[key], list):
                out.append(f"tiers.{tier}.{key} is not a list")
    return out


def _candidate_problems(cand: object) -> list[str]:
    """What is off in row.json's ``candidate`` (runner/candidate.py: its identity names the row's folder and the
    report's headline)."""
    if cand is None:
        return []
    if not isinstance(cand, dict):
        return ["candidate is not an object"]
    out = []
    bad = sorted(
        k
        for k in ("kind", "path", "sha256", "commit", "version", "base_row")
        if not isinstance(cand.get(k), _TEXT_OR_NONE)
    )
    if bad:
        out.append(f"candidate {', '.join(bad)} not text")
    if cand.get("dirty") is not None and not isinstance(cand["dirty"], bool):
        out.append("candidate dirty is not true or false")
    phase = cand.get("draft_phase")
    if phase is not None and (not isinstance(phase, int) or isinstance(phase, bool)):
        out.append("candidate draft_phase is not a whole number")
    if "files" in cand and not (isinstance(cand["files"], list) and all(isinstance(x, str) for x in cand["files"])):
        out.append("candidate files is not a list of text")
    return out


def shape_problems(record: object) -> list[str]:
    """Everything about ``record`` (a row.json) that a reader cannot take as it is; [] when its shape is sound."""
    if not isinstance(record, dict):
        return [f"row.json holds a {type(record).__name__}, not a row record"]
    out = []
    row = record.get("row")
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        out.append("row.json has no row id (row.id)")
    elif not _is_text_map(row.get("pins", {})):
        out.append("row.pins is not a map of package to version")
    for key in ("versions", "knobs"):
        if key in record and not _is_text_map(record[key]):
            out.append(f"{key} is not a map of names to text")
    for key in ("overrides", "pytest_args"):
        if key in record and not (isinstance(record[key], list) and all(isinstance(x, str) for x in record[key])):
            out.append(f"{key} is not a list of text")
    install = record.get("install", {})
    if not isinstance(install, dict):
        out.append("install is not an object")
    else:
        for key in ("failure", "check"):
            if key in install and not isinstance(install[key], dict):
                out.append(f"install.{key} is not an object")
    for key in ("selection", "fingerprint", "host", "suite", "pytest", "build"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            out.append(f"{key} is not an object")
    sel = record.get("selection")
    if isinstance(sel, dict):
        for k in ("collected", "knobs", "sglang_env", "torch_env"):
            if not isinstance(sel.get(k, {}), dict):
                out.append(f"selection.{k} is not an object")
        if not isinstance(sel.get("args", []), list) or not isinstance(sel.get("paths", []), list):
            out.append("selection.args / selection.paths is not a list")
    out.extend(_candidate_problems(record.get("candidate")))
    if not isinstance(record.get("verdict"), _TEXT_OR_NONE):
        out.append("verdict is not text")
    if not isinstance(record.get("gpus", 0), int) or isinstance(record.get("gpus"), bool):
        out.append("gpus is not a whole number")
    if "gpu_names" in record and not (
        isinstance(record["gpu_names"], list) and all(isinstance(n, str) for n in record["gpu_names"])
    ):
        out.append("gpu_names is not a list of text")
    pt = record.get("pytest")
    if isinstance(pt, dict) and not (
        isinstance(pt.get("plugins", []), list)
        and isinstance(pt.get("conftests", []), list)
        and isinstance(pt.get("override_ini", []), list)
    ):
        out.append("pytest.plugins / pytest.conftests / pytest.override_ini is not a list")
    if "tiers" in record:
        out.extend(tiers_problems(record["tiers"]))
    return out


def shell(row_id: str, problems: list[str]) -> RowRecord:
    """What stands in for a record that cannot be read as one: the row with no tiers, and why."""
    return {"row": {"id": row_id, "pins": {}}, "verdict": "error", "tiers": {}, "unreadable": list(problems)}
