"""known_upstream.py on the recorded CPU run of the 0.5.23 row (docs/runs): the transformers 5.19.0 assisted
generation crash is tagged, the row's sglang verdict passes, anything else still fails, stale entries are named."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from mtpmatrix.core import known_upstream
from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.core.schema import KNOWN_UPSTREAM
from mtpmatrix.core.smoke_servers import DEFAULT_SMOKE_SERVERS, SMOKE_SERVERS
from mtpmatrix.core.store import row_verdict
from mtpmatrix.runner import matrix

RUN = read_json_or_gzip(
    Path(__file__).resolve().parents[2] / "docs" / "runs" / "cpu-20261130-matrix1-sglang-0.5.23.json.gz"
)
ISSUE = "hf-assisted-generation-gemma4-candidate-generator"


@pytest.fixture
def record():
    rec = copy.deepcopy(RUN)
    for t in rec["tiers"].values():  # as the plugin writes them, before any tagging
        t.pop("known_upstream", None)
        t.pop("stale_known_upstream", None)
    return rec


def test_the_shipped_file_loads_and_names_real_checks():
    issues = {i.id: i for i in known_upstream.load()}
    assert ISSUE in issues
    tiers = Path(__file__).resolve().parents[2] / "tests" / "tiers"

    def tier_text(tier: str) -> str:  # a tier's checks: test_<tier>.py and its test_<tier>_*.py modules
        return "".join(f.read_text() for f in sorted(tiers.glob(f"test_{tier}*.py")))

    for issue in issues.values():
        for check in issue.checks:  # a renamed check would never be seen passing: the entry could not go stale
            func, _, case = check.rstrip("]").partition("[")
            assert f"def {func}(" in tier_text(issue.tier), (issue.id, check)
            if case and issue.tier == "smoke":  # a listed case names a smoke server (one on demand: measured there)
                assert any(case == s.name or case.startswith(s.name + "-") for s in SMOKE_SERVERS), check
        # a check the signature needs passed beside it must exist, or the entry could never match
        for beside in (issue.signature or {}).get("passed_beside", []):
            func, _, case = beside.rstrip("]").partition("[")
            assert f"def {func}(" in tier_text(issue.tier), (issue.id, beside)
            if issue.tier == "smoke":  # a default server, or one of its cases (test_x[server-label])
                assert any(case == s.name or case.startswith(s.name + "-") for s in DEFAULT_SMOKE_SERVERS), (
                    issue.id,
                    beside,
                )


def test_transformers_5_19_crash_is_known_upstream_and_does_not_fail_the_row(record):
    assert record["versions"]["transformers"] == "5.19.0" and row_verdict(record) == "failed"
    known_upstream.apply(record["tiers"], record["versions"])
    ref = record["tiers"]["reference"]
    assert ref["verdict"] == KNOWN_UPSTREAM
    tagged = [c for c in ref["checks"] if c.get("known_upstream") == ISSUE]
    assert len(tagged) == 9 and all(c["outcome"] == "failed" for c in tagged)  # outcomes are left as they were
    assert [k["id"] for k in ref["known_upstream"]] == [ISSUE]
    entry = ref["known_upstream"][0]
    assert entry["version"] == "5.19.0" and entry["upstream"].startswith("https://github.com/huggingface/")
    assert record["tiers"]["contract"]["verdict"] == "passed" and "stale_known_upstream" not in ref
    assert row_verdict(record) == "passed"
    line = matrix.summary_line(dict(record, verdict=row_verdict(record)))
    assert line.startswith("sglang-0.5.23: PASSED")
    assert f"reference=known-upstream (transformers 5.19.0: {ISSUE}" in line
    # applying twice (an imported run goes through it again) changes nothing
    before = json.dumps(record["tiers"], sort_keys=True)
    known_upstream.apply(record["tiers"], record["versions"])
    assert json.dumps(record["tiers"], sort_keys=True) == before


def test_outside_the_affected_range_or_another_message_it_still_fails(record):
    other = copy.deepcopy(record)
    known_upstream.apply(other["tiers"], dict(other["versions"], transformers="5.20.0"))
    assert other["tiers"]["reference"]["verdict"] == "failed" and row_verdict(other) == "failed"
    # one failure with a different message keeps the tier failed; the matching ones are still tagged
    chk = record["tiers"]["reference"]["checks"][6]
    chk["failure"] = dict(chk["failure"], message="e-series: prompt 'x': with assistant != without at new token 3")
    known_upstream.apply(record["tiers"], record["versions"])
    ref = record["tiers"]["reference"]
    assert ref["verdict"] == "failed" and "known_upstream" not in chk
    assert sum(bool(c.get("known_upstream")) for c in ref["checks"]) == 8


def test_a_listed_check_passing_in_range_makes_the_entry_stale(record):
    chk = record["tiers"]["reference"]["checks"][6]
    chk["outcome"] = "passed"
    chk.pop("failure")
    known_upstream.apply(record["tiers"], record["versions"])
    stale = record["tiers"]["reference"]["stale_known_upstream"]
    assert stale[0]["id"] == ISSUE and stale[0]["checks"] == [chk["id"]]
    assert "can go" in matrix.summary_line(dict(record, verdict="passed"))


def test_a_session_that_stopped_early_stays_an_error(record):
    ref = record["tiers"]["reference"]
    ref.update(verdict="error", incomplete=True, reason="pytest stopped early (exit 2)")
    known_upstream.apply(record["tiers"], record["versions"])
    assert ref["verdict"] == "error" and row_verdict(record) == "error"


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"id": "x"}, "missing package, affected, tier, component, kind, match, checks, summary, upstream"),
        (
            {
                "id": "x",
                "package": "transformers",
                "affected": "5.19",
                "tier": "reference",
                "match": "m",
                "checks": ["t"],
                "summary": "s",
                "upstream": "u",
                "component": "library",
                "kind": "crash",
            },
            "Invalid specifier",
        ),
        (
            {
                "id": "x",
                "package": "transformers",
                "affected": ">=1",
                "tier": "gpu",
                "match": "m",
                "checks": ["t"],
                "summary": "s",
                "upstream": "u",
                "component": "library",
                "kind": "crash",
            },
            "unknown tier 'gpu'",
        ),
        (
            {
                "id": "x",
                "package": "transformers",
                "affected": ">=1",
                "tier": "reference",
                "match": "m",
                "checks": ["t"],
                "summary": "s",
                "upstream": "u",
                "component": "hf",
                "kind": "crash",
            },
            "unknown component 'hf'",
        ),
        (
            {
                "id": "x",
                "package": "transformers",
                "affected": ">=1",
                "tier": "reference",
                "match": "m",
                "checks": ["t"],
                "summary": "s",
                "upstream": "u",
                "component": "library",
                "kind": "boom",
            },
            "unknown kind 'boom'",
        ),
        (
            {
                "id": "x",
                "package": "transformers",
                "affected": ">=1",
                "tier": "reference",
                "match": "(",
                "checks": ["t"],
                "summary": "s",
                "upstream": "u",
                "color": "red",
            },
            "unknown field(s) color",
        ),
    ],
)
def test_malformed_entries_are_one_line_errors(tmp_path, entry, words):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [entry]}))
    with pytest.raises(ValueError) as info:
        known_upstream.load(f)
    assert words in str(info.value) and "\n" not in str(info.value) and str(f) in str(info.value)


def test_transformers_5_23_assistant_config_rejection_is_known_upstream():
    """The recorded --with transformers==5.23.0 probe of the 0.5.23 row (reference tier, written before the entry
    existed): every assistant load fails in kv_sharing_modes; the entry tags all of it, 5.24.0 is out of range."""
    rec = read_json_or_gzip(
        Path(__file__).resolve().parents[2] / "docs" / "runs" / "cpu-20261130-probe-tf5230-sglang-0.5.23.json.gz"
    )
    assert rec["versions"]["transformers"] == "5.23.0" and rec["verdict"] == "failed"
    fresh = copy.deepcopy(rec)
    known_upstream.apply(rec["tiers"], rec["versions"])
    ref = rec["tiers"]["reference"]
    assert ref["verdict"] == KNOWN_UPSTREAM and row_verdict(rec) == "passed"
    assert [k["id"] for k in ref["known_upstream"]] == ["hf-gemma4-assistant-config-kv-sharing-modes"]
    assert len(ref["known_upstream"][0]["checks"]) == 10
    known_upstream.apply(fresh["tiers"], dict(fresh["versions"], transformers="5.24.0"))
    assert fresh["tiers"]["reference"]["verdict"] == "failed"
    # the same message raised anywhere else is not this bug
    chk = fresh["tiers"]["reference"]["checks"][6]
    chk["failure"]["raised_at"] = "tests/tiers/test_reference.py:141 in _run"
    fresh["tiers"]["reference"]["verdict"] = "failed"
    known_upstream.apply(fresh["tiers"], fresh["versions"])
    assert "known_upstream" not in chk and fresh["tiers"]["reference"]["verdict"] == "failed"


# --- an entry matches its own signature only: its checks, its failure kind, what the bug leaves in the record ------

SMOKE_RUN = read_json_or_gzip(
    Path(__file__).resolve().parents[2] / "docs" / "runs" / "2026-11-30d-h200-sglang-0.5.13-smoke-default.json.gz"
)
DRAFT_PHASE = "sglang-gemma4-mtp-draft-rope-phase"
FIRST_ROUND = "hf-gemma4-assistant-first-token-hidden-after-prefill"


def _smoke(mutate=None) -> dict:
    """The recorded default smoke suite on sglang 0.5.13 (H200), its stored tags stripped, optionally changed."""
    rec = copy.deepcopy(SMOKE_RUN)
    for t in rec["tiers"].values():
        t.pop("known_upstream", None)
        for c in t.get("checks") or []:
            c.pop("known_upstream", None)
    rec["tiers"]["smoke"]["verdict"] = "failed"
    checks = {c["id"].split("::", 1)[1]: c for c in rec["tiers"]["smoke"]["checks"]}
    if mutate:
        mutate(checks, rec["tiers"]["smoke"])
    return rec


def _phase_check(checks):
    return checks["test_draft_phase_matches_transformers[witness-transformers-phase-topk1]"]


def test_the_draft_phase_entry_matches_the_recorded_h200_run():
    rec = _smoke()
    known_upstream.apply(rec["tiers"], rec["versions"])
    assert rec["tiers"]["smoke"]["verdict"] == KNOWN_UPSTREAM
    assert [k["id"] for k in rec["tiers"]["smoke"]["known_upstream"]] == [DRAFT_PHASE]


def _fail_witness_gate(checks, tier):
    c = checks["test_spec_metrics[witness-mtp-topk1]"]
    c["outcome"] = "failed"
    c["failure"] = {
        "kind": "acceptance",
        "type": "CheckFailure",
        "message": "accept length 1.02 outside [5.0, 6]",
        "frame": None,
        "raised_at": "tests/tiers/test_smoke.py:130 in test_spec_metrics",
    }


def _drop_witness(checks, tier):
    tier["checks"] = [c for c in tier["checks"] if "[witness-mtp-topk1]" not in c["id"]]


def _accepts_3(checks, tier):
    _phase_check(checks)["metrics"]["accept_length_requests"] = 3.2


def _another_kind(checks, tier):
    _phase_check(checks)["failure"]["kind"] = "harness"


def _another_check(checks, tier):
    c = checks["test_spec_metrics[witness-transformers-phase-topk1]"]
    c["outcome"] = "failed"
    c["failure"] = dict(_phase_check(checks)["failure"], raised_at="tests/tiers/test_smoke.py:1 in test_spec_metrics")


@pytest.mark.parametrize(
    "mutate",
    [_fail_witness_gate, _drop_witness, _accepts_3, _another_kind, _another_check],
    ids=[
        "sglang-phase-witness-failed",
        "sglang-phase-witness-not-run",
        "transformers-phase-accepts-3.2",
        "kind-harness",
        "unlisted-check",
    ],
)
def test_the_draft_phase_entry_needs_its_signature(mutate):
    """The message prefix alone is not the bug: the sglang-phase witness beside it must have passed, the
    transformers-phase witness must have accepted near 1, the failure must be the listed check's 'acceptance'."""
    rec = _smoke(mutate)
    known_upstream.apply(rec["tiers"], rec["versions"])
    smoke = rec["tiers"]["smoke"]
    assert smoke["verdict"] == "failed"
    tagged = [c["id"].split("::")[1] for c in smoke["checks"] if c.get("known_upstream")]
    # the listed check keeps its tag only where its own signature still holds (the unlisted one never gets it)
    assert tagged == (
        ["test_draft_phase_matches_transformers[witness-transformers-phase-topk1]"] if mutate is _another_check else []
    )


def _reference_first_round(metrics: dict) -> dict:
    chk = {
        "id": "tests/tiers/test_reference.py::test_witness_drafts_at_transformers_phase[e-series]",
        "tier": "reference",
        "outcome": "failed",
        "seconds": 1.0,
        "metrics": metrics,
        "failure": {
            "kind": "acceptance",
            "type": "CheckFailure",
            "message": "e-series: transformers drafts the first round after prefill from the wrong hidden "
            "state: the reference witness accepts 0/0 drafts there, 1.0 of them after",
            "frame": None,
            "raised_at": "tests/tiers/test_reference.py:358 in test_witness_drafts_at_transformers_phase",
        },
    }
    return {"reference": {"verdict": "failed", "checks": [chk]}}


@pytest.mark.parametrize(
    "metrics, known",
    [
        (
            {"first_round_drafted": 40, "first_round_accepted": 0},
            True,
        ),  # the bug: a recorded first round, none accepted
        ({}, False),  # no first round recorded at all
        ({"first_round_drafted": 0, "first_round_accepted": 0}, False),  # a first round with nothing drafted
        ({"first_round_drafted": 40, "first_round_accepted": 12}, False),  # some accepted: a shortfall, not this bug
    ],
)
def test_the_first_round_entry_needs_zero_accepted_in_a_recorded_first_round(metrics, known):
    tiers = _reference_first_round(metrics)
    known_upstream.apply(tiers, {"transformers": "5.12.1"})
    assert (tiers["reference"]["verdict"] == KNOWN_UPSTREAM) is known
    assert (tiers["reference"]["checks"][0].get("known_upstream") == FIRST_ROUND) is known


def test_stored_tags_are_stripped_and_re_derived(record):
    """A tag an earlier run (or a GPU box) stored is never trusted: one naming no entry, or an entry narrowed since,
    is dropped and the tier's verdict derived again."""
    for c in record["tiers"]["reference"]["checks"]:
        if c["outcome"] == "failed":
            c["known_upstream"] = "an-entry-removed-since"
    record["tiers"]["reference"]["verdict"] = KNOWN_UPSTREAM
    record["tiers"]["reference"]["known_upstream"] = [{"id": "an-entry-removed-since", "checks": []}]
    known_upstream.apply(record["tiers"], record["versions"], issues=[])
    ref = record["tiers"]["reference"]
    assert ref["verdict"] == "failed" and "known_upstream" not in ref
    assert not any(c.get("known_upstream") for c in ref["checks"])


def test_every_entry_says_whose_bug_it_is():
    for issue in known_upstream.load():
        assert issue.component == ("sglang" if issue.package == "sglang" else "library"), issue.id
        assert issue.kind in (
            "import",
            "abi",
            "config",
            "args",
            "weights",
            "launch",
            "crash",
            "mismatch",
            "accuracy",
            "acceptance",
        ), issue.id


ASSISTED_SAMPLING = "hf-gemma4-assisted-sampling-not-lossless"


def _assisted_sampling(counts: dict) -> dict:
    """The reference tier's assisted-sampling check as the 0.5.17 row recorded it on 2026-12-01 (transformers
    5.12.1: 889 / 344 / 303 over offsets 1 / 3 / 7), with ``counts`` in its place."""
    n = sum(counts.values())
    chk = {
        "id": "tests/tiers/test_reference.py::test_sampled_assisted_generation_matches_closed_form",
        "tier": "reference",
        "outcome": "failed",
        "seconds": 6.9,
        "metrics": {
            "sampled_offsets": n,
            "sampled_counts": {str(k): v for k, v in counts.items()},
            "sampled_off_support": 0,
            "sampled_share_offset_1": round(counts[1] / n, 4),
            "sampled_share_offset_3": round(counts[3] / n, 4),
        },
        "failure": {
            "kind": "mismatch",
            "type": "CheckFailure",
            "message": "dense-31b: transformers' assisted sampling differs from the closed form: ...",
            "frame": None,
            "raised_at": "tests/tiers/test_reference.py:536 in test_sampled_assisted_generation_matches_closed_form",
        },
    }
    return {"reference": {"verdict": "failed", "checks": [chk]}}


@pytest.mark.parametrize(
    "counts, known",
    [
        ({1: 889, 3: 344, 7: 303}, True),  # the bug, as recorded on transformers 5.8.1 and 5.12.1
        ({1: 700, 3: 400, 7: 436}, False),  # flatter (temperature ignored): offset 1 under its closed form 0.518
        ({1: 150, 3: 100, 7: 1286}, False),  # drafts accepted unchecked: the drafter's offset 7 takes over
        ({1: 820, 3: 460, 7: 256}, False),  # offset 3 near its closed form: not the residual this bug loses
        ({1: 1536, 3: 0, 7: 0}, False),  # greedy: the argmax every time (offset 1's share 1.0)
        # temperature applied twice (0.49: 0.594 / 0.277 / 0.129 expected), a draw with offset 3 at 0.268 (a quarter of
        # such runs fall at or below 0.27)
        ({1: 925, 3: 412, 7: 199}, False),
    ],
)
def test_the_assisted_sampling_entry_needs_the_argmax_pushed_up_and_offset_3_down(counts, known):
    tiers = _assisted_sampling(counts)
    known_upstream.apply(tiers, {"transformers": "5.12.1"})
    assert (tiers["reference"]["checks"][0].get("known_upstream") == ASSISTED_SAMPLING) is known


def test_a_record_is_judged_again_by_one_function_the_report_and_bisect_share(record):
    """expected.rejudge_record: stored tags and verdicts are stripped, tiers judged again with the given list, the
    row verdict derived from them; report.summary.rejudge is that same function."""
    from mtpmatrix.core import expected
    from mtpmatrix.report import summary as report_summary

    record["verdict"] = "passed"
    for c in record["tiers"]["reference"]["checks"]:
        if c["outcome"] == "failed":
            c["known_upstream"] = "an-entry-removed-since"
    record["tiers"]["reference"]["verdict"] = KNOWN_UPSTREAM
    again = expected.rejudge_record(copy.deepcopy(record), issues=[])
    assert again["tiers"]["reference"]["verdict"] == "failed" and again["verdict"] == "failed"
    assert json.dumps(report_summary.rejudge(copy.deepcopy(record), issues=[]), sort_keys=True) == json.dumps(
        again, sort_keys=True
    )
    listed = expected.rejudge_record(copy.deepcopy(record))
    assert listed["tiers"]["reference"]["known_upstream"][0]["id"] == ISSUE
    unfinished = expected.rejudge_record(dict(copy.deepcopy(record), verdict="pending"), issues=[])
    assert unfinished["verdict"] == "pending"


def _with_metric(case: str, name: str, value: float) -> tuple[dict, dict]:
    """(tiers, versions) of a recorded match of ``case``'s entry with one metric replaced."""
    if case == "draft-phase":
        rec = _smoke(lambda checks, tier: _phase_check(checks)["metrics"].update({name: value}))
        return rec["tiers"], rec["versions"]
    if case == "first-round":
        return _reference_first_round({"first_round_drafted": 40, "first_round_accepted": 0, name: value}), {
            "transformers": "5.12.1"
        }
    tiers = _assisted_sampling({1: 889, 3: 344, 7: 303})
    tiers["reference"]["checks"][0]["metrics"][name] = value
    return tiers, {"transformers": "5.12.1"}


@pytest.mark.parametrize(
    "case, name",
    [
        ("draft-phase", "accept_length_requests"),
        ("first-round", "first_round_drafted"),
        ("first-round", "first_round_accepted"),
        ("assisted-sampling", "sampled_share_offset_1"),
        ("assisted-sampling", "sampled_share_offset_3"),
        ("assisted-sampling", "sampled_off_support"),
    ],
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_metric_never_matches(case, name, value):
    """NaN compares false with every bound and an infinity passes a one-sided one: a record whose metric is not a
    finite number cannot show a bug's signature."""
    tiers, versions = _with_metric(case, name, value)
    known_upstream.apply(tiers, versions)
    assert not any(c.get("known_upstream") for t in tiers.values() for c in t["checks"])
