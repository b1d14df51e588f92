"""runner/culprit.py: which moved package breaks a canary (fake probes, nothing installed), the budget, the pinned
row's verdicts, the ABI statement, and the search's new stop / known-result options in bisect.search."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from canary_world import TRANSFORMERS, canary_row, resolution, world

from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.rows import parse_row
from mtpmatrix.runner import baseline, culprit
from mtpmatrix.runner import bisect as bs
from mtpmatrix.runner.canary import Canary, Resolution

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")


@pytest.fixture
def row(tmp_path):
    return canary_row(tmp_path)


def test_one_moved_package_that_breaks_is_bisected_to_its_first_bad_release(row):
    res = resolution(row, {"transformers": "5.24.0"})
    probe_for, cands, calls = world({"transformers": "5.13.0"})
    c = culprit.find_culprit(res, "contract", probe_for, cands, culprit.Budget(None), log=lambda m: None)
    assert c["single"]["transformers"]["status"] == bs.BAD
    b = c["bisect"]["transformers"]
    assert (b["outcome"], b["first_bad"], b["last_good"]) == ("found", "5.13.0", "5.12.1")
    text = "\n".join(culprit.culprit_lines(c, res))
    assert (
        "CULPRIT: transformers 5.13.0 breaks sglang-0.5.17 contract (last good: 5.12.1): [import] "
        "transformers 5.13.0 breaks the import" in text
    )
    # 5.24.0 was probed once (alone), never again by the bisect (known bad)
    assert calls.count(("transformers", "5.24.0", ())) == 1


def test_a_canary_run_that_is_the_single_probe_is_not_run_again(row):
    res = resolution(row, {"transformers": "5.24.0"})
    probe_for, cands, calls = world({"transformers": "5.18.0"})
    known = {"transformers": bs.Probe("5.24.0", bs.BAD, "failed", {"kind": "crash", "message": "x"})}
    c = culprit.find_culprit(res, "reference", probe_for, cands, culprit.Budget(None), log=lambda m: None, known=known)
    assert c["bisect"]["transformers"]["first_bad"] == "5.18.0"
    assert ("transformers", "5.24.0", ()) not in calls


def test_only_the_package_that_breaks_is_bisected(row):
    res = resolution(row, {"transformers": "5.24.0", "torch": "2.15.0"})
    probe_for, cands, calls = world({"torch": "2.12.0"})
    c = culprit.find_culprit(res, "contract", probe_for, cands, culprit.Budget(None), log=lambda m: None)
    assert c["single"]["transformers"]["status"] == bs.GOOD and c["single"]["torch"]["status"] == bs.BAD
    assert list(c["bisect"]) == ["torch"] and c["bisect"]["torch"]["first_bad"] == "2.12.0"
    assert {p for p, _, _ in calls[2:]} == {"torch"}


@pytest.mark.parametrize("moved", [("transformers", "torch"), ("transformers", "torch", "sglang-kernel")])
def test_a_break_that_needs_two_packages_is_named_as_such(row, moved):
    versions = {"transformers": "5.24.0", "torch": "2.15.0", "sglang-kernel": "0.4.10"}
    res = resolution(row, {p: versions[p] for p in moved})
    probe_for, cands, calls = world({}, together=("transformers", "torch"))
    c = culprit.find_culprit(res, "contract", probe_for, cands, culprit.Budget(None), log=lambda m: None)
    assert c["bisect"] == {} and c["together"]["packages"] == ["transformers", "torch"]
    assert "CULPRIT: transformers + torch break sglang-0.5.17 contract only together" in "\n".join(
        culprit.culprit_lines(c, res)
    )
    # with two moved packages the pair is the canary itself: no extra probe
    assert len(calls) == len(moved) + (0 if len(moved) == 2 else 1)


def test_the_budget_stops_the_search_cleanly_and_says_how_far_it_got(row):
    res = resolution(row, {"transformers": "5.24.0"})
    probe_for, cands, calls = world({"transformers": "5.13.0"})
    ticks = itertools.count()
    budget = culprit.Budget(3, clock=lambda: next(ticks))  # t0 = 0; spent at the 3rd question
    c = culprit.find_culprit(res, "contract", probe_for, cands, budget, log=lambda m: None)
    b = c["bisect"]["transformers"]
    assert c["stopped"] == "--budget 3 s spent" and b["outcome"] == "stopped"
    assert len(calls) == 2  # the single probe and one bisect probe
    lines = culprit.culprit_lines(c, res)
    assert "  stopped (--budget 3 s spent): the first bad release is one of 5.12.1 .. 5.16.0 (5 release(s))" in lines
    assert lines[-1] == "search stopped: --budget 3 s spent (resume with --resume to go on)"


def test_search_known_results_and_stop():
    calls = []

    def probe(v):
        calls.append(v)
        return bs.Probe(v, bs.BAD if TRANSFORMERS.index(v) >= 6 else bs.GOOD)

    res = bs.search(TRANSFORMERS, probe, log=lambda m: None, known={"5.24.0": bs.BAD, "5.12.1": bs.GOOD})
    assert (res.first_bad, res.last_good) == ("5.18.0", "5.17.0") and "5.24.0" not in calls and "5.12.1" not in calls
    calls.clear()
    res = bs.search(TRANSFORMERS, probe, log=lambda m: None, should_stop=lambda: "budget" if calls else None)
    assert res.outcome == "stopped" and len(calls) == 1 and res.stopped == "budget"
    assert bs.describe(res, "transformers")[0] == (  # 5.16.0 passed: nothing bad seen yet
        "stopped (budget): the first bad release, if any, is one of 5.17.0 .. 5.24.0 (5 release(s))"
    )


def judged_tier(outcome: str, tier: str = "contract", kind: str = "import") -> dict:
    """A judged tier of one check that ran with ``outcome`` (failing as ``kind``)."""
    chk = {"id": f"tests/tiers/test_{tier}.py::test_a", "outcome": outcome}
    if outcome in ("failed", "error"):
        chk["failure"] = {"kind": kind, "message": f"{kind} failure"}
    return {"verdict": outcome, "checks": [chk]}


def row_record(tiers: dict, **kw) -> dict:
    """A finished row record whose session collected exactly its checks."""
    sel = {
        "args": [],
        "knobs": {},
        "paths": [],
        "collected": {t: [c["id"] for c in v.get("checks") or []] for t, v in tiers.items()},
    }
    return {"verdict": "passed", "install": {"verdict": "passed"}, "selection": sel, "tiers": tiers, **kw}


def test_pinned_row_baseline_and_broken_tiers(tmp_path):
    results = tmp_path / "results"

    def rec(run, row, tiers, **kw):
        atomic_write_json(results / run / row / "row.json", row_record(tiers, **kw))

    rec("r1", "sglang-0.5.17", {"contract": judged_tier("failed")})
    rec("r2", "sglang-0.5.17", {"contract": judged_tier("passed"), "reference": judged_tier("passed", "reference")})
    rec("r3", "sglang-0.5.17", {"contract": judged_tier("failed")}, overrides=["torch==2.13.0"])  # a probe
    rec("bisect-x", "sglang-0.5.17", {"contract": judged_tier("failed")})  # not a matrix run
    import os

    for i, run in enumerate(["r1", "r2", "r3", "bisect-x"]):
        os.utime(results / run / "sglang-0.5.17" / "row.json", (i, i))
        os.utime(results / run, (i, i))
    base = baseline.pinned_baseline(results, "sglang-0.5.17", ["reference", "contract"])
    assert base.run == "r2" and base.tiers["contract"]["verdict"] == "passed"
    assert baseline.pinned_baseline(results, "nope", ["contract"]).as_dict() == {
        "row": "nope",
        "run": None,
        "tiers": {},
        "why": "no finished run of it",
    }
    canary = {
        "contract": judged_tier("failed"),
        "reference": judged_tier("failed", "reference", "mismatch"),
        "smoke": {"verdict": "skipped", "checks": []},
    }
    assert baseline.broken_tiers(canary) == ["reference", "contract"]  # cheapest first
    # a failure of the harness alone, or a tier stored as failed without a failing check, proves nothing
    harness = {"contract": judged_tier("error", kind="harness"), "reference": {"verdict": "failed", "checks": []}}
    assert baseline.broken_tiers(harness) == []


def test_abi_statement_reads_the_contract_abi_checks():
    def record(outcome, failure=None):
        return {
            "versions": {"torch": "2.15.0"},
            "tiers": {
                "contract": {
                    "checks": [
                        {
                            "id": "tests/tiers/test_contract.py::test_torch_abi",
                            "outcome": outcome,
                            "failure": failure,
                            "metrics": {"libraries": 32, "torch_symbols": 2045},
                        },
                        {"id": "tests/tiers/test_contract.py::test_cuda_major", "outcome": "passed"},
                    ]
                }
            },
        }

    assert culprit.abi_statement(record("passed")) == (
        "torch 2.15.0 does not break sglang's native extensions: the ABI checks pass "
        "(32 torch-linked libraries, 2045 torch symbols)"
    )
    assert culprit.abi_statement(record("failed", {"message": "torch 2.15.0 does not define 1 symbol(s)"})).startswith(
        "torch 2.15.0 breaks native extensions (contract ABI check): torch 2.15.0 does not define"
    )
    assert culprit.abi_statement({"tiers": {}}) is None


def test_publish_appends_to_the_step_summary(tmp_path):
    f = tmp_path / "summary.md"
    culprit.publish(["a", "b"], env={"GITHUB_STEP_SUMMARY": str(f)})
    culprit.publish(["c"], env={})
    assert f.read_text() == "\n```\na\nb\n```\n"
    assert Path(f).exists()


# --- the whole canary, with the installs faked -------------------------------------------------------------------

TORCHAUDIO = {
    "kind": "import",
    "type": "RuntimeError",
    "message": "PyTorch has CUDA version 13.2 whereas TorchAudio has CUDA version 13.0",
    "raised_at": "torchaudio/_extension/utils.py:124 in _check_cuda_version",
}


@pytest.fixture
def fake_installs(monkeypatch, tmp_path):
    """run_row answers like the 0.5.23 row under torch 2.15.0: the ABI check passes, the import fails on
    torchaudio until torchaudio moves; every call is recorded, and saved like run_row saves (for --resume)."""
    from mtpmatrix.core.store import RunStore

    calls = []

    def run_row(row, venv, opts, log=print):
        calls.append((row.id, tuple(opts.overrides)))
        moved_audio = any(o.startswith("torchaudio==") for o in opts.overrides)
        torch = next((o.split("==")[1] for o in opts.overrides if o.startswith("torch==")), row.pins["torch"])
        fails = torch == "2.15.0" and not moved_audio
        checks = [
            {
                "id": "tests/tiers/test_contract.py::test_torch_abi",
                "outcome": "passed",
                "metrics": {"libraries": 32, "torch_symbols": 2045},
            },
            {
                "id": "tests/tiers/test_contract.py::test_import[gemma4_mtp]",
                "outcome": "failed" if fails else "passed",
                "failure": TORCHAUDIO if fails else None,
            },
        ]
        record = {
            **opts.record_extra,
            "overrides": list(opts.overrides),
            "versions": {"torch": torch},
            "suite": {"seconds": 60.0},
            "verdict": "failed" if fails else "passed",
            "install": {
                "verdict": "passed",
                "seconds": 12.5,
                "held": [{"package": "sglang-kernel", "version": "0.4.10", "why": "kept at sglang's exact pin"}],
            },
            "tiers": {"contract": {"verdict": "failed" if fails else "passed", "checks": checks}},
            "blocking_pins": [
                {
                    "package": "torchaudio",
                    "version": "2.11.0",
                    "pinned_by": "sglang 0.5.23",
                    "tier": "contract",
                    "check": checks[1]["id"],
                    "kind": "import",
                    "message": TORCHAUDIO["message"],
                }
            ]
            if fails
            else [],
        }
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    monkeypatch.setattr(culprit.matrix, "resolve_companions", lambda row, venv, ov, names: ["torchaudio==2.11.1"])
    monkeypatch.setattr(culprit.bisect, "candidates", lambda p, g, b: ["2.14.1", "2.15.0"])
    return calls


def test_canary_override_reports_the_blocking_pin_and_retries_with_it_moved(tmp_path, fake_installs):
    f = tmp_path / "sglang-0.5.23.txt"
    f.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.23\ntransformers==5.19.0\ntorch==2.14.1\n")
    row = parse_row(f)
    c = Canary("sglang-0.5.23-torch", f, row, "canary-override", {"torch": ">=2.14"})
    res = Resolution(c, {"torch": "2.15.0"}, {"torch": ("2.14.1", "2.15.0")})
    opts = culprit.matrix.Options(run_id="r1", results=tmp_path / "results", tiers="contract")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    assert fake_installs == [
        ("sglang-0.5.23-torch", ("torch==2.15.0",)),  # the canary: torch's single probe too
        ("sglang-0.5.23-torch-2.14.1", ("torch==2.14.1",)),  # the bisect checks the pinned end
        ("sglang-0.5.23-torch-and-torchaudio", ("torch==2.15.0", "torchaudio==2.11.1")),
    ]  # the retry
    text = "\n".join(state["summary"])
    assert "held: sglang-kernel 0.4.10 (kept at sglang's exact pin)" in text
    assert "torch 2.15.0 does not break sglang's native extensions: the ABI checks pass" in text
    assert (
        "CULPRIT: torch 2.15.0 breaks sglang-0.5.23 contract (last good: 2.14.1): [import] PyTorch has CUDA "
        "version 13.2 whereas TorchAudio has CUDA version 13.0"
    ) in text  # the failure of the canary's own run
    assert state["summary"][-2] == (
        "ANSWER: torch==2.15.0 works with sglang-0.5.23 once torchaudio==2.11.1 moves "
        "too (contract=passed): the upgrade is blocked only by sglang 0.5.23's pin "
        "torchaudio==2.11.0"
    )
    assert "BLOCKING PIN: sglang 0.5.23 pins torchaudio==2.11.0, which refuses torch==2.15.0" in text
    assert "  retry with torchaudio==2.11.1: PASSED — contract=passed" in text
    on_disk = json.loads((tmp_path / "results" / "r1" / "sglang-0.5.23-torch" / "canary.json").read_text())
    assert on_disk["summary"] == state["summary"]
    # --resume: every finished step is read back, nothing is installed again
    fake_installs.clear()
    opts.resume = True
    on_disk["seconds"] = 1000.0  # the sessions before took 1000 s: a resumed one adds to them
    (tmp_path / "results" / "r1" / "sglang-0.5.23-torch" / "canary.json").write_text(json.dumps(on_disk))
    again = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)

    def same(lines):  # timings aside: a fake probe takes no time, its record says 72.5 s
        return [ln for ln in lines[:-1] if "probe(s) over" not in ln]

    assert fake_installs == [] and same(again["summary"]) == same(state["summary"])
    assert again["row"]["seconds"] == state["row"]["seconds"] == 72.5 and again["seconds"] >= 1000.0
    assert again["blocking"][0]["retry"]["seconds"] == 72.5 and again["summary"][-1].endswith("(over resumed sessions)")
    assert again["blocking"][0]["retry"] == state["blocking"][0]["retry"]


def test_a_second_broken_tier_is_named_with_the_command_that_searches_it(row, tmp_path):
    res = resolution(row, {"transformers": "5.24.0"})
    state = {
        "resolution": "r",
        "row": {"verdict": "failed", "tiers": "t"},
        "broken_tiers": ["reference", "contract"],
        "culprit": {
            "tier": "reference",
            "single": {},
            "bisect": {
                "transformers": {
                    "outcome": "found",
                    "first_bad": "5.18.0",
                    "last_good": "5.17.0",
                    "probes": [],
                    "summary": [],
                }
            },
        },
        "seconds": 1.0,
    }
    lines = culprit.summary_lines(state, res, {})
    assert (
        "also breaks contract: searched on reference only: nox -s bisect -- transformers 5.12.1 5.24.0 "
        "--row sglang-0.5.17 --tier contract"
    ) in lines


def test_a_pinned_row_that_passed_the_tier_is_the_good_end_without_a_probe(row):
    res = resolution(row, {"transformers": "5.24.0"})
    probe_for, cands, calls = world({"transformers": "5.13.0"})
    c = culprit.find_culprit(
        res, "contract", probe_for, cands, culprit.Budget(None), log=lambda m: None, pins_pass=True
    )
    assert (c["bisect"]["transformers"]["first_bad"], c["bisect"]["transformers"]["last_good"]) == ("5.13.0", "5.12.1")
    assert ("transformers", "5.12.1", ()) not in calls


# --- a probe is judged as the report judges it (expected.tier_state of the re-judged record) ---------------------


def test_a_harness_error_beside_a_known_upstream_failure_blames_nothing(tmp_path, monkeypatch):
    """Every 0.5.13-0.5.23 smoke run carries the draft-phase known upstream failure. A canary whose smoke tier adds
    a harness error beside it has shown nothing about torch 2.15.0: no culprit, and the answer says the tier is not
    proven (it once read "CULPRIT: torch 2.15.0 breaks sglang-0.5.23 smoke ... draft query is not at transformers'
    RoPE phase")."""
    from probe_records import smoke_record

    from mtpmatrix.core.store import RunStore

    results = tmp_path / "results"
    RunStore(results, "20261201-000000").save_row(
        "sglang-0.5.23", smoke_record({"sglang": "0.5.23", "torch": "2.14.1"})
    )
    calls = []

    def run_row(row, venv, opts, log=print):
        calls.append((row.id, tuple(opts.overrides)))
        record = {
            **opts.record_extra,
            "overrides": list(opts.overrides),
            **smoke_record({"sglang": "0.5.23", "torch": "2.15.0"}, harness_error=True),
        }
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    monkeypatch.setattr(culprit.bisect, "candidates", lambda p, g, b: ["2.14.1", "2.15.0"])
    f = tmp_path / "sglang-0.5.23.txt"
    f.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.23\ntransformers==5.19.0\ntorch==2.14.1\n")
    c = Canary("sglang-0.5.23-torch", f, parse_row(f), "canary-override", {"torch": ">=2.14"})
    res = Resolution(c, {"torch": "2.15.0"}, {"torch": ("2.14.1", "2.15.0")})
    opts = culprit.matrix.Options(run_id="r1", results=results, tiers="smoke")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    text = "\n".join(state["summary"])
    assert "CULPRIT" not in text, text
    assert state["broken_tiers"] == [] and calls == [("sglang-0.5.23-torch", ("torch==2.15.0",))]
    assert (
        "smoke not proven (harness error: the smoke tier never batched 4 requests at topk 3; known upstream "
        "sglang-gemma4-mtp-draft-rope-phase beside it): nothing to blame on the moved packages"
    ) in text
