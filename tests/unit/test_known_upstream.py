"""known_upstream.py on the recorded CPU run of the 0.5.23 row (docs/runs): the transformers 5.19.0 assisted
generation crash is tagged, the row's sglang verdict passes, anything else still fails, stale entries are named."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mtpmatrix.tiers import known_upstream

from mtpmatrix.runner import matrix
from mtpmatrix.runner.store import row_verdict
from mtpmatrix.schema import KNOWN_UPSTREAM

RUN = json.loads((Path(__file__).resolve().parents[2] / "docs" / "runs" /
                  "cpu-20261130-matrix1-sglang-0.5.23.json").read_text())
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
    for issue in issues.values():
        for check in issue.checks:  # a renamed check would never be seen passing: the entry could not go stale
            assert f"def {check}(" in (tiers / f"test_{issue.tier}.py").read_text(), (issue.id, check)


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


@pytest.mark.parametrize("entry, words", [
    ({"id": "x"}, "missing package, affected, tier, match, checks, summary, upstream"),
    ({"id": "x", "package": "transformers", "affected": "5.19", "tier": "reference", "match": "m", "checks": ["t"],
      "summary": "s", "upstream": "u"}, "Invalid specifier"),
    ({"id": "x", "package": "transformers", "affected": ">=1", "tier": "gpu", "match": "m", "checks": ["t"],
      "summary": "s", "upstream": "u"}, "unknown tier 'gpu'"),
    ({"id": "x", "package": "transformers", "affected": ">=1", "tier": "reference", "match": "(", "checks": ["t"],
      "summary": "s", "upstream": "u", "color": "red"}, "unknown field(s) color"),
])
def test_malformed_entries_are_one_line_errors(tmp_path, entry, words):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [entry]}))
    with pytest.raises(ValueError) as info:
        known_upstream.load(f)
    assert words in str(info.value) and "\n" not in str(info.value) and str(f) in str(info.value)


def test_transformers_5_23_assistant_config_rejection_is_known_upstream():
    """The recorded --with transformers==5.23.0 probe of the 0.5.23 row (reference tier, written before the entry
    existed): every assistant load fails in kv_sharing_modes; the entry tags all of it, 5.24.0 is out of range."""
    rec = json.loads((Path(__file__).resolve().parents[2] / "docs" / "runs" /
                      "cpu-20261130-probe-tf5230-sglang-0.5.23.json").read_text())
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
