"""One row's evidence, judged: does its record show which suite, which versions and which settings ran, in this run,
whole? Each answer that is "no" is a problem (``{"tier": tier or None for the whole row, "what": one line}``); a
tier with a problem proves nothing (the report makes it "not proven", whatever its checks say).

What is checked, each against something the record did not write itself:
  run and row     row.json's run id and row id are the folder's; the manifest plans the row, with the same pins
  suite           the record's fingerprint is the manifest's (and the manifest's is this checkout's: run-level)
  versions        the installed sglang, transformers, torch (and every other pin recorded) are the row's pins, with
                  exact --with overrides applied; the overrides are the manifest's
  settings        no MTPMATRIX_* knob that changes what is tested (KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED lists the
                  others; a smoke or pair knob set to its default is none); what the invocation asked (its pytest
                  args, its knobs) is what the session recorded
  served          a --server-url case was served by the row's sglang at its pair's TP; a TP-2 case that passed on
                  its own servers had the GPUs for it
  metrics         a passed check's numbers agree with its outcome: finite, within the case's threshold, counts that
                  add up to the per-question records
  files           tiers.json and junit.xml beside the record say the same outcome for every check (junit.xml's
                  xfail, how the suite writes a known-upstream failure, is a failure's)
  session         how the session ran (pytest's plugins, options, conftests; reruns; GPUs) and on which build
                  (Python, platform, torch's): evidence/session.py
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from mtpmatrix.core import schema, settings, stats
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.evidence import manifest as run_manifest
from mtpmatrix.core.record_types import CheckRecord, Manifest, Problem, RowRecord
from mtpmatrix.core.schema import TIERS, check_param, short_check_id
from mtpmatrix.core.smoke_servers import smoke_options

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

# Knobs that say where things go, how fast they run or which tiers run (a tier that does not run is 'partial' by
# itself), never what a check tests.
KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED = frozenset(
    {
        "MTPMATRIX_RUN_ID",
        "MTPMATRIX_RESULTS",
        "MTPMATRIX_RESULTS_ROOT",
        "MTPMATRIX_ROW",
        "MTPMATRIX_TINY_DIR",
        "MTPMATRIX_SIDE_BY_SIDE",
        "MTPMATRIX_PRECOMPILE",
        "MTPMATRIX_SUITE_PROCESS",
        "MTPMATRIX_IMPORTED_DIR",
        "MTPMATRIX_INVOCATION_ID",
        "MTPMATRIX_TIERS",
        "MTPMATRIX_MAX_GPUS",
        "MTPMATRIX_FORCE_NO_GPU",
        "MTPMATRIX_OFFLINE",
        "MTPMATRIX_GSM8K_DIR",  # the data is checked against its checksum wherever it comes from
        "MTPMATRIX_GSM8K_READY_TIMEOUT",
        "MTPMATRIX_GSM8K_BASELINE",  # adds no-MTP cases beside the seed cases
        "MTPMATRIX_SMOKE_PARALLEL",
        "MTPMATRIX_PROBE_DIR",
        "MTPMATRIX_PROBE_LIMIT",
        "MTPMATRIX_VERBOSE",  # the row's whole pytest output on the console, not only in pytest.log
    }
)
MAIN_PACKAGES = ("sglang", "transformers", "torch")
_ROUNDING = 1e-4  # the gsm8k tier records score and interval to 4 decimals


def problem(tier: str | None, what: str) -> Problem:
    return {"tier": tier, "what": what}


def _base(version: str | None) -> str | None:
    return version.split("+", 1)[0] if isinstance(version, str) else None


# ---------------------------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------------------------


def _pair_knob(name: str) -> str | None:
    """The pair a MTPMATRIX_<PAIR>_<WHAT> knob overrides, None when it is no pair knob."""
    for pair in settings.PAIRS:
        if any(name == settings.pair_env_key(pair, what) for what in ("TARGET", "ASSISTANT", "TP", "THRESHOLD")):
            return pair
    return None


def knob_effect(name: str, value: str) -> tuple[str, ...]:
    """The tiers whose checks ``name=value`` changes (empty: none)."""
    if name in KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED or not name.startswith("MTPMATRIX_"):
        return ()
    if name.startswith("MTPMATRIX_SMOKE_"):
        try:
            same = smoke_options({name: value}) == smoke_options({})
        except ValueError:
            same = False
        return () if same else ("smoke",)
    pair = _pair_knob(name)
    if pair is not None:
        try:
            same = settings.resolve_pair(pair, {name: value}) == settings.resolve_pair(pair, {})
        except (KeyError, ValueError):
            same = False
        return () if same else ("gsm8k",)
    if name.startswith("MTPMATRIX_GSM8K_") or name == "MTPMATRIX_SERVER_PAIR":
        return ("gsm8k",)
    return TIERS  # fault injection, or a knob this judge does not know: it may change anything


def candidate_knobs(record: RowRecord, knobs: dict) -> set[str]:
    """The knobs of ``knobs`` that are the record's candidate (runner/candidate.py), not settings: the patch the
    fault-injection hook served at import (tools/gpu_box.sh PATCH=) when its sha256 is the candidate's, and the
    draft phase the candidate declares. On any other record they are knobs this judge does not know."""
    cand = record.get("candidate") if isinstance(record.get("candidate"), dict) else None
    if cand is None:
        return set()
    out = set()
    if cand.get("kind") == "patch" and cand.get("sha256") and knobs.get(schema.PATCH_SHA256_ENV) == cand["sha256"]:
        out |= {schema.PATCH_ENV, schema.PATCH_SHA256_ENV}
    try:
        declared = int(knobs.get(schema.DRAFT_PHASE_ENV) or "")
    except ValueError:
        declared = None
    if declared is not None and declared == cand.get("draft_phase"):
        out.add(schema.DRAFT_PHASE_ENV)
    return out


def _settings(record: RowRecord) -> list[Problem]:
    out = []
    sel = record.get("selection") or {}
    asked = record.get("knobs") or {}
    ran = sel.get("knobs") or {}
    identity = candidate_knobs(record, asked) & candidate_knobs(record, ran) if asked else candidate_knobs(record, ran)
    for name, value in sorted({**asked, **ran}.items()):
        if name in identity:
            continue
        for tier in knob_effect(name, value or ""):
            out.append(problem(tier, f"{tier} ran with {name}={value}: not the qualification suite"))
    changing = {
        k for k in set(asked) | set(ran) if k not in identity and knob_effect(k, (asked.get(k) or ran.get(k) or ""))
    }
    differ = sorted(k for k in changing if asked.get(k) != ran.get(k))
    if record.get("selection") is not None and "knobs" in record and differ:
        out.append(problem(None, f"the session ran with other knobs than it was asked ({', '.join(differ)})"))
    for name, value in sorted((sel.get("sglang_env") or {}).items()):  # recorded since the review of issue #39
        out.append(
            problem(
                None, f"the session ran with {name}={value}: sglang reads it, the qualification suite does not set it"
            )
        )
    args = [str(a) for a in sel.get("args") or []]
    asked_args = record.get("pytest_args") or []
    it = iter(args)
    if record.get("selection") is not None and not all(any(a == b for b in it) for a in asked_args):
        out.append(problem(None, f"the session's pytest args do not hold what it was asked ({' '.join(asked_args)})"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------------------------------------------


def split_overrides(record: RowRecord) -> tuple[dict[str, str], dict[str, SpecifierSet]]:
    """A record's ``--with`` overrides as ({package: the one release it names}, {package: SpecifierSet of a range}),
    canonical names; a spec that does not parse is neither."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    exact: dict[str, str] = {}
    ranges: dict[str, SpecifierSet] = {}
    for spec in record.get("overrides") or []:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        named = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if len(named) == 1 and len(req.specifier) == 1:
            exact[name] = named[0]
        else:
            ranges[name] = req.specifier
    return exact, ranges


def pins_with_overrides(record: RowRecord) -> dict[str, str]:
    """The row's pins (canonical names) with every exact ``--with`` override applied."""
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {canonicalize_name(k): v for k, v in ((record.get("row") or {}).get("pins") or {}).items()}
    return {**pins, **split_overrides(record)[0]}


def expected_versions(record: RowRecord) -> dict[str, str]:
    """What the row must have installed: ``pins_with_overrides`` less the packages a ``--with`` range frees (judged
    against the range by ``_versions``). A wheel or checkout candidate's sglang is the candidate's version, not the
    pin (every other pin still holds)."""
    ranges = split_overrides(record)[1]
    pins = {k: v for k, v in pins_with_overrides(record).items() if k not in ranges}
    recorded = record.get("candidate")
    cand: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    if cand.get("kind") in ("wheel", "checkout"):
        pins["sglang"] = cand.get("version") or "(none recorded)"
    return pins


def _versions(record: RowRecord, ran: bool) -> list[Problem]:
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    want = expected_versions(record)
    got: dict[str, str | None] = {canonicalize_name(k): v for k, v in (record.get("versions") or {}).items()}
    out = []
    if ran:
        for name in MAIN_PACKAGES:
            if name in want and not got.get(name):
                out.append(problem(None, f"the record does not say which {name} ran"))
    for name, version in sorted(want.items()):
        have = got.get(name)
        if have and _base(have) != _base(version):
            cand = (record.get("candidate") or {}) if name == "sglang" else {}
            out.append(
                problem(
                    None,
                    f"{name} {have} ran, the candidate is {version}"
                    if cand.get("kind") in ("wheel", "checkout")
                    else f"{name} {have} ran, the row pins {version}",
                )
            )
    for name, spec in sorted(split_overrides(record)[1].items()):
        have = got.get(name)
        try:
            inside = have is not None and spec.contains(Version(str(_base(have))), prereleases=True)
        except InvalidVersion:
            inside = False
        if have and not inside:
            out.append(problem(None, f"{name} {have} ran, outside the override {name}{spec}"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# served cases, GPUs and metrics
# ---------------------------------------------------------------------------------------------------------------


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

    def bad(v) -> bool:
        if isinstance(v, float):
            return not math.isfinite(v)
        if isinstance(v, dict):
            return any(bad(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(bad(x) for x in v)
        return False

    return [f"metric {k} is not finite" for k, v in sorted((chk.get("metrics") or {}).items()) if bad(v)]


def _checks(record: RowRecord, row_dir: Path | None) -> list[Problem]:
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
                if sglang and _base(served.get("version")) != _base(sglang):
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


# ---------------------------------------------------------------------------------------------------------------
# the files beside the record
# ---------------------------------------------------------------------------------------------------------------

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


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _same_story(record: RowRecord, written: dict) -> list[Problem]:
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


def _files(record: RowRecord, row_dir: Path) -> list[Problem]:
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


# ---------------------------------------------------------------------------------------------------------------
# one row
# ---------------------------------------------------------------------------------------------------------------


def judge_row(
    row_id: str, record: RowRecord, *, run_id: str, manifest: Manifest | None, row_dir: Path | None = None
) -> list[Problem]:
    """Every problem with ``record`` (filed as ``run_id``/``row_id``) as evidence; [] when it shows what it claims.
    ``record`` must have a sound shape (evidence.records.shape_problems)."""
    out: list[Problem] = []
    row = record.get("row") or {}
    if row.get("id") != row_id:
        out.append(problem(None, f"row.json names row {row.get('id')!r}, filed as {row_id!r}"))
    fingerprinted = bool((record.get("fingerprint") or {}).get("suite"))
    if record.get("run_id") != run_id and (fingerprinted or record.get("run_id") is not None):
        # a record of this suite always names its run (store.save_row, import): one without is not bound to this one
        out.append(problem(None, f"row.json belongs to run {record.get('run_id')!r}, filed in run {run_id!r}"))
    ran = any(e.get("checks") for e in (record.get("tiers") or {}).values())
    if manifest is not None:
        planned = (manifest.get("rows") or {}).get(row_id)
        if planned is None:
            out.append(problem(None, "the run's manifest does not plan this row"))
        elif planned.get("pins") != row.get("pins"):
            out.append(problem(None, "the row's pins are not the ones the run planned"))
        elif planned.get("candidate") != run_manifest.candidate_identity(record.get("candidate")):
            out.append(problem(None, "the record's candidate is not the one the run planned"))
        asked = (planned or {}).get("overrides", ((manifest.get("invocation") or {}).get("overrides")) or [])
        if sorted(asked) != sorted(record.get("overrides") or []):
            out.append(problem(None, f"overrides {record.get('overrides') or []} are not the run's {asked}"))
        fp = (record.get("fingerprint") or {}).get("suite")
        if ran and fp and fp != (manifest.get("fingerprint") or {}).get("suite"):
            out.append(
                problem(
                    None,
                    f"written by suite {str(fp)[:12]}, the run planned suite "
                    f"{str((manifest.get('fingerprint') or {}).get('suite'))[:12]}",
                )
            )
    if ran and not (record.get("fingerprint") or {}).get("suite"):
        out.append(problem(None, "no suite fingerprint: the record cannot say which suite wrote it"))
    out += _versions(record, ran)
    out += _settings(record)
    out += _checks(record, row_dir)
    if ran:  # how the session ran and on which build (evidence/session.py)
        from mtpmatrix.core.evidence import session

        out += session.judge(record, ((manifest or {}).get("rows") or {}).get(row_id))
    if row_dir is not None and ran:
        out += _files(record, row_dir)
    seen: dict = {}
    for p in out:
        seen.setdefault((p["tier"], p["what"]), p)
    return list(seen.values())
