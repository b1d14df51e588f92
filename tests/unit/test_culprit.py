"""runner/culprit.py: which moved package breaks a canary (fake probes, nothing installed), the budget, the pinned
row's verdicts, the ABI statement, and the search's new stop / known-result options in bisect.search."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.rows import parse_row
from mtpmatrix.runner import baseline, culprit
from mtpmatrix.runner import bisect as bs
from mtpmatrix.runner.canary import Canary, Resolution

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")

TRANSFORMERS = ["5.12.1", "5.13.0", "5.14.0", "5.15.0", "5.16.0", "5.17.0", "5.18.0", "5.19.0", "5.20.0", "5.24.0"]
TORCH = ["2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0"]


@pytest.fixture
def row(tmp_path):
    f = tmp_path / "sglang-0.5.17.txt"
    f.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n")
    return parse_row(f)


def resolution(row, moved: dict[str, str]) -> Resolution:
    c = Canary("c", row.path, row, "canary-override", {p: "" for p in moved})
    return Resolution(c, dict(moved), {p: (row.pins.get(p), v) for p, v in moved.items()})


def world(first_bad: dict[str, str], together: tuple[str, ...] = ()):
    """Probes over a fake world: ``package`` is bad from ``first_bad[package]`` on; ``together`` break only when all
    of them are at their newest release. Records every probe made as (package, version, also)."""
    order = {"transformers": TRANSFORMERS, "torch": TORCH}
    calls = []

    def probe_for(package, also):
        def probe(version):
            calls.append((package, version, tuple(also)))
            bad = package in first_bad and order[package].index(version) >= order[package].index(first_bad[package])
            moved_now = {package} | {a.split("==")[0] for a in also}
            if together and set(together) <= moved_now:
                bad = True
            if bad:
                return bs.Probe(
                    version,
                    bs.BAD,
                    "1 check(s) failed [import]",
                    {"kind": "import", "message": f"{package} {version} breaks the import"},
                )
            return bs.Probe(version, bs.GOOD)

        return probe

    def candidates(package, good, bad):
        vs = order[package]
        return vs[vs.index(good) : vs.index(bad) + 1]

    return probe_for, candidates, calls


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


# --- a canary whose newest release cannot install (issue #39, class 9) -------------------------------------------

# uv 0.13.9's own words on 2026-12-04 (results/before-install-conflict/sglang-0.5.17-transformers/install.log)
UV_CONFLICT = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because transformers>=5.25.0 depends on kernels>=0.19.1,<0.20 and sglang==0.5.17 depends on "
    "kernels>=0.14.1,<0.15, we can conclude that sglang==0.5.17 and transformers>=5.25.0 are incompatible.\n"
    "         And because you require sglang==0.5.17 and transformers==5.25.0, we can conclude that your "
    "requirements are unsatisfiable.\n"
)
CONFLICT_LINE = "transformers 5.25.0 needs kernels>=0.19.1,<0.20; sglang 0.5.17 requires kernels>=0.14.1,<0.15"
QWEN = "'qwen3_asr' is already used by a Transformers config, pick another name."


def test_uv_conflict_is_one_line_naming_the_release_and_both_requirements():
    from mtpmatrix.core.failures import classify_install
    from mtpmatrix.runner import installable

    message = classify_install(UV_CONFLICT).message
    assert installable.is_conflict({"message": message})
    assert installable.conflict_line(message, {"transformers": "5.25.0"}) == CONFLICT_LINE
    # the moved package first whichever side uv names it on; a range it names for older releases stays uv's
    swapped = "Because sglang==0.5.17 depends on kernels<0.15 and transformers>=5.20 depends on kernels>=0.19.1, we"
    assert (
        installable.conflict_line(swapped, {"transformers": "5.25.0"})
        == "transformers>=5.20 needs kernels>=0.19.1; sglang 0.5.17 requires kernels<0.15"
    )
    other = "resolver conflict: error: x | Because only foo<2 is available, we can conclude that bar is unusable."
    assert installable.conflict_line(other, {}) == "Because only foo<2 is available"
    assert not installable.is_conflict({"message": "index unreachable: error: Failed to fetch"})


def fake_uv(first_uninstallable: dict[str, str], calls: list, unreachable: bool = False):
    """``uv pip compile`` over a fake index: a package cannot install from ``first_uninstallable[package]`` on
    (uv's conflict text); ``unreachable``: every resolution fails to fetch."""
    import subprocess

    from packaging.version import Version

    def run(cmd, input, **kw):
        overrides = Path(cmd[cmd.index("--override") + 1]).read_text().split()
        calls.append(tuple(overrides))
        assert f"-e {culprit.paths.REPO}" in input and "sglang==0.5.17" in input  # the row's install, resolved
        if unreachable:
            return subprocess.CompletedProcess(cmd, 2, "", "error: Failed to fetch: `https://pypi.org/simple/x/`\n")
        for o in overrides:
            pkg, ver = o.split("==")
            if pkg in first_uninstallable and Version(ver) >= Version(first_uninstallable[pkg]):
                return subprocess.CompletedProcess(cmd, 1, "", UV_CONFLICT.replace("5.25.0", ver))
        return subprocess.CompletedProcess(cmd, 0, "\n".join(overrides) + "\n", "")

    return run


def test_the_first_release_that_cannot_install_is_bisected_by_resolution_alone(row, tmp_path, monkeypatch):
    from mtpmatrix.runner import installable

    monkeypatch.setattr(installable, "find_uv", lambda error=None: "uv")

    releases = [*TRANSFORMERS, "5.25.0"]
    calls = []
    run = fake_uv({"transformers": "5.20.0"}, calls)

    def probe_for(pkg):
        return installable.resolution_probe(row, pkg, workdir=tmp_path / "res", run=run)

    def cands(pkg, good, bad):
        return releases[releases.index(good) : releases.index(bad) + 1]

    s = installable.search(
        {"transformers": ("5.12.1", "5.25.0")}, row.id, probe_for, cands, lambda: None, log=lambda m: None
    )
    b = s["bisect"]["transformers"]
    assert (b["first_bad"], b["last_good"], s["installable"]) == ("5.20.0", "5.19.0", {"transformers": "5.19.0"})
    assert s["single"]["transformers"]["detail"] == "cannot install: " + CONFLICT_LINE
    # 5.25.0 alone, then a bisect of 11 releases with 5.25.0 known bad: at most ceil(log2(11)) + 1 resolutions
    assert calls[0] == ("transformers==5.25.0",) and len(calls) <= 1 + 5
    assert ("transformers==5.25.0",) not in calls[1:]  # the known bad end is not asked again
    text = "\n".join(installable.lines(s))
    assert "CANNOT INSTALL: transformers 5.25.0 on sglang-0.5.17: " + CONFLICT_LINE in text
    assert "first release that cannot install: transformers 5.20.0 (newest that installs: 5.19.0;" in text
    # a spent --budget stops the search cleanly, names the interval and runs nothing instead
    spent = iter([None, None, "--budget 15 s spent"])
    stopped = installable.search(
        {"transformers": ("5.12.1", "5.25.0")}, row.id, probe_for, cands, lambda: next(spent), log=lambda m: None
    )
    assert stopped["installable"] is None and stopped["stopped"] == "--budget 15 s spent"
    text = "\n".join(installable.lines(stopped))
    assert "stopped (--budget 15 s spent): the first release that cannot install is one of 5.17.0 .. 5.25.0" in text
    assert "install search stopped: --budget 15 s spent" in text
    # two moved packages: the one that installs alone stays at its release, the other falls back
    calls.clear()
    moved = {"transformers": ("5.12.1", "5.25.0"), "torch": ("2.11.0", "2.15.0")}
    s2 = installable.search(moved, row.id, probe_for, cands, lambda: None, log=lambda m: None)
    assert (
        s2["installable"] == {"transformers": "5.19.0", "torch": "2.15.0"} and s2["single"]["torch"]["status"] == "good"
    )

    # each alone installs, together they do not: nothing to run instead, and it says so
    def installs_alone(pkg):
        return installable.resolution_probe(row, pkg, workdir=tmp_path / "res", run=fake_uv({}, []))

    s3 = installable.search(moved, row.id, installs_alone, cands, lambda: None, log=lambda m: None)
    assert s3["installable"] is None and s3["together"] == ["torch", "transformers"]
    assert "torch + transformers install each alone on sglang-0.5.17, not together" in "\n".join(installable.lines(s3))
    # an index that does not answer stops the search in one line: no release can be told apart
    with pytest.raises(bs.BisectError, match="resolution failed: index unreachable"):
        installable.search(
            {"transformers": ("5.12.1", "5.25.0")},
            row.id,
            lambda pkg: installable.resolution_probe(row, pkg, workdir=tmp_path, run=fake_uv({}, [], unreachable=True)),
            cands,
            lambda: None,
            known={"transformers": bs.Probe("5.25.0", bs.BAD)},
            log=lambda m: None,
        )


@pytest.fixture
def conflicting_index(monkeypatch, tmp_path):
    """The 2026-12-04 index: transformers 5.25.0 cannot install on sglang 0.5.17 (uv's conflict), every release
    from 5.13.0 breaks the import; run_row answers as the matrix would, resolutions as uv would."""
    from packaging.version import Version

    from mtpmatrix.core.failures import classify_install
    from mtpmatrix.core.store import RunStore
    from mtpmatrix.runner import installable

    installs, resolutions = [], []

    def run_row(row, venv, opts, log=print):
        installs.append((row.id, tuple(opts.overrides)))
        tf = next(o.split("==")[1] for o in opts.overrides if o.startswith("transformers=="))
        base = {**opts.record_extra, "overrides": list(opts.overrides)}
        if Version(tf) >= Version("5.25.0"):
            install = {"verdict": "failed", "seconds": 0.8, "failure": classify_install(UV_CONFLICT).as_dict()}
            record = {**base, "verdict": "failed", "install": install}
        else:
            fails = Version(tf) >= Version("5.13.0")
            check = {
                "id": "tests/tiers/test_contract.py::test_import[gemma4_mtp]",
                "outcome": "failed" if fails else "passed",
                "failure": {"kind": "import", "type": "ValueError", "message": QWEN} if fails else None,
            }
            record = {
                **base,
                "versions": {"transformers": tf},
                "verdict": "failed" if fails else "passed",
                "install": {"verdict": "passed", "seconds": 12.5},
                "suite": {"seconds": 60.0},
                "tiers": {"contract": {"verdict": "failed" if fails else "passed", "checks": [check]}},
            }
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    real_probe = installable.resolution_probe
    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    monkeypatch.setattr(
        installable,
        "resolution_probe",
        lambda *a, **k: real_probe(*a, **k, run=fake_uv({"transformers": "5.25.0"}, resolutions)),
    )
    monkeypatch.setattr(installable, "find_uv", lambda error=None: "uv")
    monkeypatch.setattr(culprit.bisect, "candidates", lambda p, g, b: [*TRANSFORMERS, "5.25.0"][:11])
    return installs, resolutions


def test_a_canary_that_cannot_install_names_why_and_searches_the_newest_release_that_does(
    row, tmp_path, conflicting_index
):
    """Before: "FAILED — install failed", nothing searched, and the session said "breaks (culprit above and in
    canary.json)" with no culprit above or in the file."""
    installs, resolutions = conflicting_index
    c = Canary("sglang-0.5.17-transformers", row.path, row, "canary-override", {"transformers": ">=5.12"})
    res = Resolution(c, {"transformers": "5.25.0"}, {"transformers": ("5.12.1", "5.25.0")})
    opts = culprit.matrix.Options(run_id="r1", results=tmp_path / "results", tiers="contract")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    text = "\n".join(state["summary"])
    assert installs[:2] == [
        ("sglang-0.5.17-transformers", ("transformers==5.25.0",)),  # the canary: cannot install
        ("sglang-0.5.17-transformers-at-transformers-5.24.0", ("transformers==5.24.0",)),  # the newest that does
    ]
    assert all(r != ("transformers==5.25.0",) for r in resolutions)  # the canary's own install said so already
    assert "CANNOT INSTALL: transformers 5.25.0 on sglang-0.5.17: " + CONFLICT_LINE in text
    assert "first release that cannot install: transformers 5.25.0 (newest that installs: 5.24.0;" in text
    assert "sglang-0.5.17-transformers-at-transformers-5.24.0: FAILED — contract=failed" in text
    assert f"CULPRIT: transformers 5.13.0 breaks sglang-0.5.17 contract (last good: 5.12.1): [import] {QWEN}" in text
    on_disk = json.loads((tmp_path / "results" / "r1" / "sglang-0.5.17-transformers" / "canary.json").read_text())
    assert on_disk["install"]["bisect"]["transformers"]["first_bad"] == "5.25.0"
    assert on_disk["install"]["run"]["versions"] == {"transformers": "5.24.0"}
    assert on_disk["row"]["verdict"] == "failed"  # the canary itself still fails: its newest cannot install
    line = culprit.outcome_line(state, "canary.json")
    assert line.startswith("transformers 5.25.0 cannot install (" + CONFLICT_LINE + ")")
    assert "first that cannot: transformers 5.25.0, newest that installs: 5.24.0" in line
    assert "culprit: transformers 5.13.0 breaks sglang-0.5.17 contract" in line
    # the fallback run is planned in the run's manifest, and the report shows it as part of its canary
    from mtpmatrix.report import canaries as rc

    manifest = json.loads((tmp_path / "results" / "r1" / "manifest.json").read_text())
    assert "sglang-0.5.17-transformers-at-transformers-5.24.0" in manifest["rows"]
    from mtpmatrix.core.store import read_run

    run = tmp_path / "results" / "r1"
    sec = rc.section(run, read_run(run))  # the records as they stand (the report hands it its judged ones)
    assert [x["id"] for x in sec["canaries"]] == ["sglang-0.5.17-transformers"]
    assert sec["canaries"][0]["verdict"] == f"failed, cannot install transformers 5.25.0 ({CONFLICT_LINE})"
    # --resume: nothing installed or resolved again
    installs.clear(), resolutions.clear()
    opts.resume = True
    again = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    assert installs == [] and resolutions == [] and again["install"] == state["install"]


def test_an_install_that_fails_for_another_reason_claims_no_culprit(row, tmp_path, monkeypatch):
    from mtpmatrix.core.store import RunStore

    def run_row(row, venv, opts, log=print):
        failure = {"kind": "install", "message": "index unreachable: error: Failed to fetch: `https://x/simple`"}
        record = {**opts.record_extra, "verdict": "failed", "install": {"verdict": "failed", "failure": failure}}
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    res = resolution(row, {"transformers": "5.25.0"})
    opts = culprit.matrix.Options(run_id="r1", results=tmp_path / "results", tiers="contract")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    assert state.get("install") is None and "CULPRIT" not in "\n".join(state["summary"])
    assert state["summary"][1] == (
        "c: FAILED — install failed: index unreachable: error: Failed to fetch: `https://x/simple`"
    )
    line = culprit.outcome_line(state, "canary.json")
    assert line == (
        "failed (install failed: index unreachable: error: Failed to fetch: `https://x/simple`): no culprit "
        "searched — details above and in canary.json"
    )


def test_the_session_line_says_when_the_newest_release_that_installs_passes():
    state = {
        "row": {"verdict": "failed", "tiers": "install failed: resolver conflict: ..."},
        "install": {
            "single": {
                "transformers": {"version": "5.25.0", "status": "bad", "detail": "cannot install: " + CONFLICT_LINE}
            },
            "bisect": {"transformers": {"outcome": "found", "first_bad": "5.25.0", "last_good": "5.24.0"}},
            "run": {"id": "c-at-transformers-5.24.0", "verdict": "passed"},
        },
        "broken_tiers": [],
        "summary": [],
    }
    assert culprit.outcome_line(state, "canary.json") == (
        f"transformers 5.25.0 cannot install ({CONFLICT_LINE}); first that cannot: transformers 5.25.0, newest that "
        "installs: 5.24.0; c-at-transformers-5.24.0 passed: nothing breaks at the newest releases that install — "
        "details above and in canary.json"
    )
