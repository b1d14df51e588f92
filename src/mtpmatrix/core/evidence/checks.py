"""Each check's record, judged: what served it (a --server-url case by the row's sglang at its pair's TP; a TP-2 case
that passed on its own servers had the GPUs for it) and whether a passed check's numbers agree with its outcome:
finite, within the case's threshold, counts that add up to the per-question records, no classified failure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeGuard

from mtpmatrix.core import schema, settings, stats
from mtpmatrix.core.evidence.versions import base_version, expected_versions
from mtpmatrix.core.record_types import CheckRecord, Problem, RowRecord, problem
from mtpmatrix.core.schema import check_param, short_check_id

_ROUNDING = 1e-4  # the gsm8k tier records score and interval to 4 decimals


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _accuracy(chk: CheckRecord, row_dir: Path | None) -> list[str]:
    m = chk.get("metrics") or {}
    score, n, correct, thr = (
        m.get(k) for k in (schema.SCORE, schema.NUM_EXAMPLES, schema.NUM_CORRECT, schema.THRESHOLD)
    )
    if not (_finite(score) and _whole(n) and n > 0 and _whole(correct) and correct <= n):
        return [f"score {score!r}, {correct!r} of {n!r} questions: not a score"]
    out = []
    if abs(score - correct / n) > _ROUNDING:
        out.append(f"score {score} is not {correct}/{n}")
    if thr is not None and (not _finite(thr) or score < thr):
        out.append(f"passed with score {score} against threshold {thr}")
    ci = m.get(schema.WILSON95)
    if ci is not None:
        lo, hi = stats.wilson_interval(correct, n)
        if not (
            isinstance(ci, list)
            and len(ci) == 2
            and all(_finite(x) for x in ci)
            and abs(ci[0] - lo) <= _ROUNDING
            and abs(ci[1] - hi) <= _ROUNDING
        ):
            out.append(f"interval {ci!r} is not the Wilson interval of {correct}/{n}")
    rel = m.get(schema.RECORDS)
    if row_dir is not None:
        from mtpmatrix.core.store import read_question_records, records_file

        path = records_file(rel, row_dir)
        if path is None:
            out.append(f"no per-question records ({rel or 'none named'})")
        else:
            try:
                qs = read_question_records(path)
            except (OSError, ValueError) as exc:
                qs = None
                out.append(f"per-question records unreadable ({exc})")
            if qs is not None and (len(qs) != n or sum(qs.values()) != correct):
                out.append(
                    f"{len(qs)} per-question records with {sum(qs.values())} correct, the check claims {correct} of {n}"
                )
    return out


def _acceptance(chk: CheckRecord) -> list[str]:
    m = chk.get("metrics") or {}
    avg, floor = m.get(schema.ACCEPT_LENGTH), m.get(schema.MIN_ACCEPT_LENGTH)
    if not _finite(avg) or not _finite(floor):
        return [f"accept length {avg!r} against floor {floor!r}: not numbers"]
    if floor < settings.MIN_ACCEPT_LENGTH:
        return [f"gated at accept length {floor}, below the seed floor {settings.MIN_ACCEPT_LENGTH}"]
    return [f"passed with accept length {avg} under its floor {floor}"] if avg < floor else []


def _non_finite(chk: CheckRecord) -> list[str]:
    """The metrics of ``chk`` that hold a NaN or an infinity anywhere inside them."""

    def bad(v: object) -> bool:
        if isinstance(v, float):
            return not math.isfinite(v)
        if isinstance(v, dict):
            return any(bad(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(bad(x) for x in v)
        return False

    return [f"metric {k} is not finite" for k, v in sorted((chk.get("metrics") or {}).items()) if bad(v)]


def judge(record: RowRecord, row_dir: Path | None) -> list[Problem]:
    """Every problem with ``record``'s checks (``row_dir``: its folder, for the per-question records)."""
    out = []
    gpus = record.get("gpus") or 0
    sglang = expected_versions(record).get("sglang")
    cases = {
        settings.gsm8k_case_id(name, k): pair for name, pair in settings.PAIRS.items() for k in (*settings.TOPKS, None)
    }
    for tier, entry in (record.get("tiers") or {}).items():
        for chk in entry.get("checks") or []:
            cid, fn = chk["id"], short_check_id(chk["id"]).split("[", 1)[0]
            m = chk.get("metrics") or {}
            served = m.get(schema.SERVED)
            pair = cases.get(check_param(cid) or "")
            if isinstance(served, dict):
                if sglang and base_version(served.get("version")) != base_version(sglang):
                    out.append(
                        problem(
                            tier,
                            f"{short_check_id(cid)}: served by sglang {served.get('version')}, "
                            f"the row is sglang {sglang}",
                        )
                    )
                if pair is not None and served.get("tp_size") != pair.tp:
                    out.append(
                        problem(
                            tier,
                            f"{short_check_id(cid)}: served at TP {served.get('tp_size')}, the "
                            f"seed case is TP {pair.tp}",
                        )
                    )
            elif tier == "gsm8k" and pair is not None and chk.get("outcome") == "passed" and gpus < pair.tp:
                out.append(problem(tier, f"{short_check_id(cid)} passed at TP {pair.tp} on a box with {gpus} GPU(s)"))
            if chk.get("outcome") != "passed":
                continue
            found = _non_finite(chk)
            failure = chk.get("failure")
            if failure:  # the plugin classifies only a failed or errored check: a pass with one is two stories
                kind = failure.get("kind") if isinstance(failure, dict) else None
                found.append(f"recorded passed, yet carries a {kind or 'classified'} failure")
            if tier == "gsm8k" and fn == "test_accuracy":
                found += _accuracy(chk, row_dir)
            elif tier == "gsm8k" and fn == "test_acceptance":
                found += _acceptance(chk)
            out.extend(problem(tier, f"{short_check_id(cid)}: {f}") for f in found)
    return out
