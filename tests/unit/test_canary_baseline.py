"""A canary's baseline (runner/baseline.py): the pinned row's latest run that proves the tiers compared, judged again
and of the same suite; without one the culprit search probes the pinned row's own releases. Installs are faked."""

from __future__ import annotations

import os
import shutil

import pytest

from mtpmatrix.core.rows import parse_row
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import baseline, culprit
from mtpmatrix.runner.canary import Canary, Resolution

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")

ROW = "sglang-0.5.17"
IMPORT = "tests/tiers/test_contract.py::test_import[gemma4_mtp]"
QWEN3_ASR = {
    "kind": "import",
    "type": "ValueError",
    "message": "'qwen3_asr' is already used by a Transformers config",
    "raised_at": "transformers/models/auto/configuration_auto.py:140 in register",
}


def contract_record(transformers: str, *, breaks: bool, fingerprint: str | None = None, **kw) -> dict:
    """The 0.5.17 row's contract tier at ``transformers``: the import fails (transformers >= 5.13's break) or
    passes; a session that collected exactly that check."""
    chk = {"id": IMPORT, "outcome": "failed" if breaks else "passed"}
    if breaks:
        chk["failure"] = dict(QWEN3_ASR)
    tiers = {"contract": {"verdict": chk["outcome"], "checks": [chk]}}
    return {
        "verdict": chk["outcome"],
        "versions": {"sglang": "0.5.17", "transformers": transformers},
        "install": {"verdict": "passed", "seconds": 5.0},
        "suite": {"seconds": 30.0, **({"fingerprint": fingerprint} if fingerprint else {})},
        "selection": {"args": [], "knobs": {}, "paths": [], "collected": {"contract": [IMPORT]}},
        "tiers": tiers,
        **kw,
    }


USAGE_ERROR = {
    "verdict": "error",
    "versions": {"sglang": "0.5.17", "transformers": "5.12.1"},
    "install": {"verdict": "passed"},
    "suite": {"seconds": 1.0},
    "tiers": {
        "contract": {"verdict": "error", "reason": "pytest exited 4 (usage error) without results", "checks": []}
    },
}


@pytest.fixture
def pinned_runs(tmp_path):
    """Write the pinned row's runs, oldest first (each one's row.json a second newer than the one before)."""
    results = tmp_path / "results"

    def write(*records):
        for i, rec in enumerate(records):
            f = RunStore(results, f"r{i}").save_row(ROW, rec)
            os.utime(f, (1000 + i, 1000 + i))
        return results

    return write


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """Run the sglang-0.5.17-transformers canary (transformers 5.12.1 -> 5.24.0, contract): ``first_bad`` is where
    the fake import starts failing; returns (run it, every run_row call)."""
    calls = []

    def go(results, first_bad="5.13.0", fingerprint=None):
        order = ["5.12.1", "5.13.0", "5.24.0"]

        def run_row(row, venv, opts, log=print):
            tf = next(o.split("==")[1] for o in opts.overrides if o.startswith("transformers=="))
            calls.append(tf)
            rec = {
                **opts.record_extra,
                "overrides": list(opts.overrides),
                **contract_record(tf, breaks=order.index(tf) >= order.index(first_bad), fingerprint=fingerprint),
            }
            RunStore(opts.results, opts.run_id).save_row(row.id, rec)
            return rec

        monkeypatch.setattr(culprit.matrix, "run_row", run_row)
        monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
        monkeypatch.setattr(culprit.bisect, "candidates", lambda p, g, b: order)
        f = tmp_path / f"{ROW}.txt"
        f.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n")
        c = Canary("sglang-0.5.17-transformers", f, parse_row(f), "canary-override", {"transformers": ">=5.12"})
        res = Resolution(c, {"transformers": "5.24.0"}, {"transformers": ("5.12.1", "5.24.0")})
        opts = culprit.matrix.Options(run_id="canary-run", results=results, tiers="contract")
        return culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)

    return go, calls


def test_runs_that_proved_nothing_are_not_the_baseline(pinned_runs, canary):
    """Three runs of the pinned row ended in a pytest usage error after one that passed: the baseline is the one
    that passed (the canary once compared with the last usage error and blamed nothing on transformers 5.24.0)."""
    results = pinned_runs(contract_record("5.12.1", breaks=False), USAGE_ERROR, USAGE_ERROR, USAGE_ERROR)
    go, calls = canary
    state = go(results)
    text = "\n".join(state["summary"])
    assert state["pinned"]["run"] == "r0" and state["pinned"]["tiers"] == {"contract": "passed"}
    assert "breaks contract that sglang-0.5.17 passes (run r0)" in text
    assert "CULPRIT: transformers 5.13.0 breaks sglang-0.5.17 contract (last good: 5.12.1)" in text
    assert calls == ["5.24.0", "5.13.0"]  # the canary, then one probe: the baseline's pass is the good end


def test_without_a_complete_baseline_the_search_probes_the_pins(pinned_runs, canary):
    results = pinned_runs(USAGE_ERROR, USAGE_ERROR)
    go, calls = canary
    state = go(results)
    text = "\n".join(state["summary"])
    assert state["pinned"]["run"] is None
    assert (
        "breaks contract; no complete baseline run of sglang-0.5.17 (no run of it proves contract: 2 passed "
        "over): the search probes its pins itself"
    ) in text
    assert "CULPRIT: transformers 5.13.0 breaks sglang-0.5.17 contract (last good: 5.12.1)" in text
    assert calls == ["5.24.0", "5.12.1", "5.13.0"]


def test_a_pinned_row_that_breaks_the_tier_too_is_no_baseline_and_its_pins_say_so(pinned_runs, canary):
    """The pinned row's latest run with a verdict on contract broke it: an older pass is not its baseline; the
    search probes the pins, which fail too, and nothing is blamed on the moved package."""
    results = pinned_runs(contract_record("5.12.1", breaks=False), contract_record("5.12.1", breaks=True), USAGE_ERROR)
    go, calls = canary
    state = go(results, first_bad="5.12.1")
    text = "\n".join(state["summary"])
    assert state["pinned"]["run"] is None and "its latest run with a verdict on contract (r1) breaks it" in text
    assert "CULPRIT" not in text
    assert (
        "sglang-0.5.17 fails contract at its own pin too (transformers 5.12.1): nothing to blame on transformers"
    ) in text


def test_only_a_run_of_the_same_suite_is_compared(pinned_runs, canary):
    results = pinned_runs(
        contract_record("5.12.1", breaks=False, fingerprint="suite-a"),
        contract_record("5.12.1", breaks=False, fingerprint="suite-b"),
        contract_record("5.12.1", breaks=False),
    )  # no fingerprint: unknown, comparable
    go, _ = canary
    assert go(results, fingerprint="suite-a")["pinned"]["run"] == "r2"
    shutil.rmtree(results / "r2")
    assert go(results, fingerprint="suite-a")["pinned"]["run"] == "r0"


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"suite": {"seconds": 1.0, "fingerprint": "abc"}}, "abc"),
        ({"suite": {"seconds": 1.0}}, None),
        ({}, None),
        ({"suite": None}, None),
        ({"suite": {"fingerprint": ""}}, None),
    ],
)
def test_a_missing_fingerprint_is_unknown(record, expected):
    assert baseline.suite_fingerprint(record) == expected
    assert baseline.same_suite(record, {"suite": {"fingerprint": "xyz"}}) is (expected in (None, "xyz"))
