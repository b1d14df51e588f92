"""What the report reads off the check records of a row (``tiers.<tier>.checks[]``, schema.py): check names, the
case a check ran on, numeric metrics and the per-question GSM8K records a check names. Shared by the summary
model and the baseline comparison."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeGuard

from mtpmatrix.core import schema
from mtpmatrix.core.record_types import Failure, RowRecord
from mtpmatrix.core.store import read_question_records, records_file

# Metrics shown in their own columns (schema.py names); the rest lands in "other", shortened.
COLUMN_METRICS = (
    schema.SCORE,
    schema.WILSON95,
    schema.NUM_EXAMPLES,
    schema.ACCEPT_LENGTH,
    schema.SPEEDUP,
    schema.RECORDS,
)


short_check = schema.short_check_id


def case_of(check_id: str) -> str:
    """What a check ran on: its parameter (``E4B-topk1``, a smoke server's name), else the check's name."""
    param = schema.check_param(check_id)
    return short_check(check_id) if param is None else param


def is_number(v: object) -> TypeGuard[float]:
    """A finite int or float (not a bool): what the report may show, compare or average."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def first_frame(failure: Failure) -> str | None:
    """Where a failure points: the first library frame, else where it was raised."""
    return failure.get("frame") or failure.get("raised_at")


def question_records(record: RowRecord, row_dir: Path) -> dict[str, dict[str, Any]]:
    """{case: {"path", "questions": {index: correct}}} for every GSM8K case of a row whose check names its
    per-question file (schema.RECORDS)."""
    out: dict[str, dict[str, Any]] = {}
    for chk in ((record.get("tiers") or {}).get("gsm8k") or {}).get("checks") or []:
        path = records_file((chk.get("metrics") or {}).get(schema.RECORDS), row_dir)
        if path is None:
            continue
        qs = read_question_records(path)
        if qs:
            out[case_of(chk["id"])] = {"path": str(path), "questions": qs}
    return out
