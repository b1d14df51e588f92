"""Known-upstream failures in pytest's own words (mtpmatrix.tiers.session.known_failures): real pytest sessions with
the plugin (test_pytest_plugin's ``session`` fixture, here ``tier_session``) over a small synthetic tier. A failure an
entry explains reads as xfailed with the entry's id and link, an unexplained one stays FAILED, and tiers.json keeps
every failure as it kept it before."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import test_pytest_plugin
from test_pytest_plugin import GREEDY_FAILS, KNOWN, REFERENCE_ONLY, _checks

pytest_plugins = ["pytester"]
tier_session = test_pytest_plugin.session  # that module's fixture, here under this name

REASON = "greedy-bug: https://example.invalid/pr/1"  # KNOWN's id and link
OWN_BUG = """

@pytest.mark.reference
@pytest.mark.check("mismatch")
def test_own_mismatch():
    raise CheckFailure("mismatch", "not a known bug")
"""


def _lines(result) -> list[str]:
    return [ln.rstrip() for ln in result.outlines]


def test_a_known_failure_reads_xfailed_with_its_entry_and_an_unknown_one_failed(tier_session, pytester):
    junit = pytester.path / "junit.xml"
    result, data = tier_session(
        REFERENCE_ONLY + OWN_BUG, "--tiers", "reference", "-rfEx", f"--junitxml={junit}", known=[KNOWN]
    )
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    lines = _lines(result)
    assert f"XFAIL test_tiers.py::test_greedy - {REASON}" in lines
    assert not [ln for ln in lines if ln.startswith("FAILED test_tiers.py::test_greedy")]
    assert [ln.split(" - ")[0] for ln in lines if ln.startswith("FAILED ")] == [
        "FAILED test_tiers.py::test_own_mismatch"
    ]
    # pytest shows no traceback for an xfail; the log keeps the known failure's, under its own heading
    result.stdout.fnmatch_lines(
        ["*= known upstream failures (xfailed) =*", f"*_ test_greedy [[]{REASON}[]] _*", "*outputs differ at token 3*"]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED and data["exitstatus"] == 1  # the unknown failure
    # junit.xml: pytest's own xfail element for the known failure, a failure for the other
    cases = {c.get("name"): {e.tag: e.get("type") for e in c} for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_greedy"] == {"skipped": "pytest.xfail"} and "failure" in cases["test_own_mismatch"]
    # the record keeps the failure: outcome, kind, message, frame, and the matched entry
    greedy = _checks(data, "reference")["test_greedy"]
    assert greedy["outcome"] == "failed" and greedy["known_upstream"] == "greedy-bug"
    assert greedy["failure"]["kind"] == "mismatch" and greedy["failure"]["message"] == "outputs differ at token 3"
    assert data["tiers"]["reference"]["verdict"] == "failed"  # the unknown failure fails the tier, as before


def test_the_record_is_the_one_written_before(tier_session, monkeypatch):
    """tiers.json's tiers are what the plugin wrote when a known failure still read FAILED: the same records with
    the known-upstream tag, the same verdict and entry list. ``turn`` made a no-op gives that old terminal."""
    from mtpmatrix.tiers.session import known_failures

    _result, now = tier_session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN])
    monkeypatch.setattr(known_failures, "turn", lambda report, why: None)
    monkeypatch.setattr(known_failures, "reconcile", lambda session, tiers, issues: None)
    old_result, before = tier_session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN])
    old_result.assert_outcomes(passed=1, failed=1)  # what the terminal said of it before

    def without_times(tiers):
        drop = ("seconds", "cpu_seconds")
        return {
            name: {
                **{k: v for k, v in t.items() if k not in drop},
                "checks": [{k: v for k, v in c.items() if k not in drop} for c in t.get("checks") or []],
            }
            for name, t in tiers.items()
        }

    assert without_times(now["tiers"]) == without_times(before["tiers"])
    assert now["tiers"]["reference"]["verdict"] == "known-upstream"
    # the exit status is pytest's: an xfail fails nothing (tiers.json says so too, as the process does)
    assert (before["exitstatus"], now["exitstatus"]) == (1, 0)


def test_only_known_failures_exit_0_and_the_summary_counts_them_xfailed(tier_session):
    result, data = tier_session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN])
    assert result.ret == pytest.ExitCode.OK and data["exitstatus"] == 0
    result.stdout.fnmatch_lines(["*= 1 passed, 1 xfailed in *"])
    assert "FAILED" not in result.stdout.str().replace("known upstream failures", "")
    assert data["tiers"]["reference"]["verdict"] == "known-upstream"


def test_a_signature_completed_by_a_later_check_reads_xfailed_at_the_end(tier_session):
    """``passed_beside`` names a check that runs after the failure: the makereport hook cannot match yet, the
    session's end does (reconcile), and the summary and the exit status follow the record."""
    known = dict(KNOWN, signature={"passed_beside": ["test_witness"]})
    result, data = tier_session(REFERENCE_ONLY, "--tiers", "reference", "-rfEx", known=[known])
    result.assert_outcomes(passed=1, xfailed=1)
    assert f"XFAIL test_tiers.py::test_greedy - {REASON}" in _lines(result)
    assert result.ret == pytest.ExitCode.OK
    assert _checks(data, "reference")["test_greedy"]["known_upstream"] == "greedy-bug"
    # and when the check beside it fails, the signature does not hold: FAILED, as the record says
    broken = REFERENCE_ONLY.replace("def test_witness():\n    pass", "def test_witness():\n    assert False")
    result, data = tier_session(broken, "--tiers", "reference", "-rfEx", known=[known])
    result.assert_outcomes(failed=2)
    assert "known_upstream" not in _checks(data, "reference")["test_greedy"]


TEARDOWN_BREAKS = (
    GREEDY_FAILS.replace(
        "def test_greedy():",
        "def test_greedy(breaks_after):",
    )
    + """

@pytest.fixture
def breaks_after():
    yield
    raise RuntimeError("teardown broke")
"""
)


def test_a_known_failure_whose_teardown_then_breaks_reads_failed_again(tier_session):
    """The call matched and read xfailed; its teardown error is the check's record now (one record per check) and no
    entry explains it, so the session's end turns the call back to FAILED and the exit status to 1."""
    result, data = tier_session(TEARDOWN_BREAKS, "--tiers", "reference", "-rfEx", known=[KNOWN])
    result.assert_outcomes(failed=1, errors=1)
    greedy = _checks(data, "reference")["test_greedy"]
    assert greedy["outcome"] == "error" and "known_upstream" not in greedy
    assert result.ret == pytest.ExitCode.TESTS_FAILED and data["exitstatus"] == 1
    assert "XFAIL" not in result.stdout.str()


def test_a_listed_check_that_passes_is_noted_like_an_xpass(tier_session):
    stale = dict(KNOWN, id="witness-bug", match="never raised", checks=["test_witness"])
    result, _data = tier_session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN, stale])
    result.stdout.fnmatch_lines(
        [
            "*= known upstream entries that can go =*",
            "XPASS witness-bug: 1 of its checks pass with transformers 5.18.0 (test_tiers.py::test_witness); "
            "https://example.invalid/pr/1",
        ]
    )
