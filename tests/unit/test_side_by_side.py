"""side_by_side.py: when a row's tiers run side by side, and that two real pytest processes (this machine's pytest, a
synthetic suite loading the real plugin) leave the same tiers.json records as one process does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mtpmatrix.core.evidence import expected_checks
from mtpmatrix.core.rows import RowError
from mtpmatrix.core.schema import JUNIT_FILE, PYTEST_LOG, TIERS, TIERS_FILE
from mtpmatrix.core.side_by_side_rule import shared_check
from mtpmatrix.runner import side_by_side
from mtpmatrix.runner.side_by_side import REFERENCE, SGLANG, merge_exitstatus, plan
from mtpmatrix.tiers.session import fork as pytest_fork
from mtpmatrix.tiers.session import process as pytest_process

SRC = Path(__file__).resolve().parents[2] / "src"
ALL = ",".join(TIERS)

# contract and reference run here, the GPU tiers skip (as on a CPU row); the plugin reads tier_unavailable through
# the environment module, so patching it in the suite's conftest reaches every process
CONFTEST = """\
from mtpmatrix.serving import environment

environment.tier_unavailable = lambda tier: None if tier in ("contract", "reference") else "needs 1 CUDA GPU(s)"
environment.versions = lambda: {"python": "3.11.9", "torch": "2.11.0"}
pytest_plugins = ["mtpmatrix.tiers.session.plugin"]


def pytest_configure(config):
    for m in ("contract", "reference", "smoke", "gsm8k", "check(kind): kind"):
        config.addinivalue_line("markers", m)
"""

CHECKS = """\
import pytest

from mtpmatrix.core.kinds import CheckFailure


@pytest.fixture(scope="session")
def shared():
    return {"built": 1}


@pytest.mark.contract
@pytest.mark.check("args")
def test_resolves(shared, record_property):
    record_property("speculative_algorithm", "FROZEN_KV_MTP")


@pytest.mark.contract
@pytest.mark.check("config")
def test_config_values(record_property):
    record_property("layers", 8)
    raise CheckFailure("config", "config resolves to the wrong values")


@pytest.mark.contract
def test_skips_itself():
    pytest.skip("not on this row")


@pytest.mark.reference
@pytest.mark.check("mismatch")
def test_greedy(shared, record_property):
    record_property("accept_len", 3.83)
    raise CheckFailure("mismatch", "outputs differ at token 3")


# split across the two processes (side_by_side_rule): a check of the greedy chains runs in the sglang group's
# process, the others in the reference group's
@pytest.mark.reference
@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name", ["e-series"])
def test_sampled_pair(shared, record_property, name):
    record_property("accept_rate", 0.5)


@pytest.mark.reference
@pytest.mark.check("acceptance")
def test_constructed_rule_and_acceptance(shared, record_property):
    record_property("accept_rate", 0.5)
    raise CheckFailure("acceptance", "drafts 0 of 8 right")


@pytest.mark.reference
@pytest.mark.check("weights")
def test_reference_setup_error(missing_fixture_on_purpose):
    pass


@pytest.mark.reference
def test_reference_ok():
    pass


@pytest.mark.smoke
def test_server():
    pass
"""


# --- plan ----------------------------------------------------------------------------------------------------


def test_plan_splits_the_sglang_tiers_from_the_reference_tier_on_two_cores():
    assert plan(ALL, [], env={}, cores=2) == [SGLANG, REFERENCE]
    assert plan("contract,reference", [], env={}, cores=16) == [SGLANG, REFERENCE]
    assert set(SGLANG.tiers) | set(REFERENCE.tiers) == set(TIERS) and not set(SGLANG.tiers) & set(REFERENCE.tiers)


@pytest.mark.parametrize(
    "tiers,args,env,cores",
    [
        ("contract", [], {}, 2),  # a bisect probe of one tier: nothing to run beside it
        ("contract,smoke,gsm8k", [], {}, 2),  # one group
        ("reference", [], {}, 2),
        (ALL, [], {}, 1),  # one core
        (ALL, ["-x"], {}, 2),  # the row's own pytest arguments would run twice, with another meaning
        (ALL, [], {"MTPMATRIX_SIDE_BY_SIDE": "0"}, 2),
    ],
)
def test_plan_keeps_one_process(tiers, args, env, cores):
    assert plan(tiers, args, env=env, cores=cores) == []


def test_plan_env_knob_forces_and_is_validated():
    assert plan(ALL, [], env={"MTPMATRIX_SIDE_BY_SIDE": "1"}, cores=1) == [SGLANG, REFERENCE]
    with pytest.raises(RowError, match=r"MTPMATRIX_SIDE_BY_SIDE='yes': use 1 .*, 0 .* or leave it unset"):
        plan(ALL, [], env={"MTPMATRIX_SIDE_BY_SIDE": "yes"}, cores=2)


def test_merge_exitstatus_is_the_worst_part():
    assert merge_exitstatus([0, 0]) == 0
    assert merge_exitstatus([0, 1]) == merge_exitstatus([1, 0]) == 1
    assert merge_exitstatus([1, 2]) == 2  # interrupted (collection error) beats failed tests
    assert merge_exitstatus([0, -9]) == -9  # killed: worst of all
    assert merge_exitstatus([5, 0]) == 5


# --- real pytest processes -------------------------------------------------------------------------------------


def _suite(tmp_path: Path, checks: str = CHECKS) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_tiers.py").write_text(checks)
    return suite


def _command(suite: Path, out: Path, module: str = "pytest") -> list[str]:
    return [
        sys.executable,
        "-m",
        module,
        str(suite),
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / JUNIT_FILE}",
        f"--mtp-results={out / TIERS_FILE}",
        f"--tiers={ALL}",
    ]


# How the groups' processes start: plain pytest, one process each; through pytest_process, forked from one
# interpreter that imported what they share (here json: this Python has no torch); or, that import failing, each a
# fresh interpreter after all. The log's first line from pytest_fork says which.
LAUNCHES = {
    "each": ("pytest", None, None),
    "forked": (pytest_process.__name__, ("json",), "forking 2"),
    "fresh": (pytest_process.__name__, ("json", "no_such_module_here"), "starting 2"),
}


@pytest.fixture(params=sorted(LAUNCHES))
def launch(request, monkeypatch):
    """(pytest module for the row's command, what pytest_fork says in the first group's log, or None)."""
    module, imports, says = LAUNCHES[request.param]
    if imports is not None:
        monkeypatch.setattr(pytest_fork, "SHARED_IMPORTS", imports)
    return module, says


def _env(monkeypatch) -> dict:
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    monkeypatch.setenv(expected_checks.ENV, expected_checks.AS_COLLECTED)  # a made-up suite: judged as collected
    import os

    return dict(os.environ)


def _without_times(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    data.pop("seconds")
    data.pop("session_id")  # each process's own
    data["pytest"].pop("options")  # each process's effective options: its own -m
    for entry in data["tiers"].values():
        entry.pop("seconds", None)
        for check in entry["checks"]:
            check.pop("seconds")
            check.pop("cpu_seconds", None)
    return data


def test_side_by_side_leaves_the_records_of_one_process(tmp_path, monkeypatch, launch):
    suite, env = _suite(tmp_path), _env(monkeypatch)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    module, says = launch
    rc_one = subprocess.run(_command(suite, one, module), env=env, cwd=tmp_path, capture_output=True).returncode
    rc_two = side_by_side.run(_command(suite, two, module), [SGLANG, REFERENCE], two, env, tmp_path, echo=False)

    assert rc_one == rc_two == 1
    alone, merged = (json.loads((d / TIERS_FILE).read_text()) for d in (one, two))
    # the one difference the two runs are given: their output folders, in the recorded args
    merged["selection"]["args"] = [a.replace(str(two), str(one)) for a in merged["selection"]["args"]]
    assert _without_times(merged) == _without_times(alone)
    # the failures read the same: verdicts, kinds and messages, the setup error included
    ref = merged["tiers"]["reference"]
    # a missing fixture is the harness's fault
    assert (ref["verdict"], ref["failure_kinds"]) == ("failed", ["acceptance", "harness", "mismatch"])
    assert [c["outcome"] for c in ref["checks"]] == ["failed", "passed", "failed", "error", "passed"]
    assert merged["tiers"]["contract"]["failure_kinds"] == ["config"]
    assert merged["tiers"]["smoke"]["reason"] == "smoke tier: needs 1 CUDA GPU(s)"
    # one tiers.json, junit.xml and pytest.log in the row folder; the parts are gone
    assert sorted(p.name for p in two.iterdir()) == sorted([TIERS_FILE, JUNIT_FILE, PYTEST_LOG])
    cases = ET.parse(two / JUNIT_FILE).getroot().iter("testcase")
    assert sorted(c.get("name") for c in cases) == sorted(
        c["id"].split("::")[1] for t in alone["tiers"].values() for c in t["checks"]
    )
    log = (two / PYTEST_LOG).read_text()
    assert f"-m {SGLANG.marker}" in log and f"-m {REFERENCE.marker}" in log and log.count("short test summary") == 2
    # the reference tier came from both processes: its check of the greedy chains from the sglang group's, in collection order
    sglang_log, reference_log = log.split(f"-m {REFERENCE.marker}", 1)
    assert "FAILED suite/test_tiers.py::test_constructed_rule_and_acceptance" in sglang_log
    assert "test_constructed_rule_and_acceptance" not in reference_log
    assert "FAILED suite/test_tiers.py::test_greedy" in reference_log
    if says:
        assert f"{pytest_fork.MODULE}: " in sglang_log.splitlines()[1] and says in sglang_log.splitlines()[1]


# Each group's test waits for the other's: it passes only when the two run at the same time. The timeout is the
# failure path (one process: the first waits in vain), not a margin a passing run depends on.
HANDSHAKE = """\
import os, time
from pathlib import Path

import pytest

DIR = Path(os.environ["HANDSHAKE_DIR"])


def meet(mine, theirs):
    (DIR / mine).touch()
    deadline = time.monotonic() + 60
    while not (DIR / theirs).exists():
        assert time.monotonic() < deadline, f"{theirs} never came: the groups did not run side by side"
        time.sleep(0.05)


@pytest.mark.contract
def test_contract_meets_reference():
    meet("contract", "reference")


@pytest.mark.reference
def test_reference_meets_contract():
    meet("reference", "contract")
"""


def test_the_groups_run_at_the_same_time(tmp_path, monkeypatch, launch):
    suite = _suite(tmp_path, HANDSHAKE)
    monkeypatch.setenv("HANDSHAKE_DIR", str(tmp_path))
    out = tmp_path / "row"
    out.mkdir()
    rc = side_by_side.run(
        _command(suite, out, launch[0]), [SGLANG, REFERENCE], out, _env(monkeypatch), tmp_path, echo=False
    )
    tiers = json.loads((out / TIERS_FILE).read_text())["tiers"]
    assert rc == 0 and tiers["contract"]["verdict"] == tiers["reference"]["verdict"] == "passed"


def _suite_whose_reference_process_dies(tmp_path: Path) -> Path:
    """A suite whose reference process exits before the plugin writes its part."""
    suite = _suite(tmp_path)
    (suite / "conftest.py").write_text(
        CONFTEST + "\n\nimport pytest\n\n\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_sessionfinish(session):  # before the plugin writes its part\n"
        '    if session.config.getoption("-m").startswith("reference"):\n'
        "        import os; os._exit(3)\n"
    )
    return suite


def test_a_part_without_results_leaves_no_tiers_json(tmp_path, monkeypatch, launch):
    """A pytest that dies before writing its part: no merged tiers.json, so run_row records the harness error for
    every tier, as it does when the one process dies."""
    suite = _suite_whose_reference_process_dies(tmp_path)
    out = tmp_path / "row"
    out.mkdir()
    rc = side_by_side.run(
        _command(suite, out, launch[0]), [SGLANG, REFERENCE], out, _env(monkeypatch), tmp_path, echo=False
    )
    assert rc == 3 and not (out / TIERS_FILE).exists()


def test_an_earlier_suite_s_parts_are_never_merged_into_this_one(tmp_path, monkeypatch):
    """The reference process dies before writing its part, where an earlier suite left a passing one (and a junit
    part, and its merged files): nothing of that suite is read, so no tiers.json, and run_row records the harness
    error for every tier, as it does for a missing part."""
    suite = _suite_whose_reference_process_dies(tmp_path)
    out = tmp_path / "row"
    out.mkdir()
    earlier = {
        "tiers": {
            "reference": {
                "verdict": "passed",
                "checks": [
                    {
                        "id": "suite/test_tiers.py::test_from_an_earlier_suite",
                        "tier": "reference",
                        "outcome": "passed",
                        "seconds": 0.1,
                    }
                ],
            }
        },
        "versions": {},
        "gpus": 0,
        "seconds": 1.0,
        "exitstatus": 0,
    }
    REFERENCE.part(out, TIERS_FILE).write_text(json.dumps(earlier))
    REFERENCE.part(out, JUNIT_FILE).write_text(
        '<testsuite tests="1"><testcase name="test_from_an_earlier_suite"/></testsuite>'
    )
    (out / TIERS_FILE).write_text('{"written by": "an earlier suite"}')
    rc = side_by_side.run(
        _command(suite, out, "pytest"), [SGLANG, REFERENCE], out, _env(monkeypatch), tmp_path, echo=False
    )
    assert rc == 3 and not (out / TIERS_FILE).exists()
    assert not REFERENCE.part(out, TIERS_FILE).exists() and not REFERENCE.part(out, JUNIT_FILE).exists()
    assert "test_from_an_earlier_suite" not in (out / JUNIT_FILE).read_text()  # the sglang group's cases only


def test_the_shared_rule_picks_the_checks_of_the_greedy_chains():
    """The sglang process runs every check that reads the reference tier's greedy chains (all their parameters), the
    reference process the sampled checks (the assisted one included), the witness ablations and the rest."""
    ref = "tests/tiers/test_reference.py::"
    for check in (
        "test_greedy_with_assistant_equals_greedy[dense-31b]",
        "test_greedy_with_assistant_equals_greedy[e-series-decoy]",
        "test_constructed_rule_and_acceptance[moe-26b-a4b]",
        "test_witness_drafts_at_transformers_phase[e-series]",
        "test_decoy_chain_meets_prediction_in_transformers[dense-31b]",
    ):
        assert shared_check("reference", ref + check), check
    for check in (
        "test_sampled_assisted_generation_matches_closed_form",
        "test_sampled_closed_form_matches_transformers_sampling[dense-31b]",
        "test_sampled_drafter_proposes_another_order[moe-26b-a4b]",
        "test_witness_drafts_need_each_input[dense-31b-witness]",
        "test_configs_load[e-series]",
        "test_moe_output_does_not_depend_on_routing",
    ):
        assert not shared_check("reference", ref + check), check
    assert not shared_check("contract", "tests/tiers/test_contract.py::test_greedy_with_assistant_equals_greedy")


# Each test says it runs (its pid in a file), then blocks until killed: stopping the row must end both processes.
BLOCKING = """\
import os
from pathlib import Path

import pytest

DIR = Path(os.environ["HANDSHAKE_DIR"])


def block(name):
    (DIR / f"{name}.tmp").write_text(str(os.getpid()))
    os.replace(DIR / f"{name}.tmp", DIR / f"{name}.pid")
    os.read(os.open(DIR / "never", os.O_RDONLY), 1)  # a fifo nobody writes to


@pytest.mark.contract
def test_contract_blocks():
    block("contract")


@pytest.mark.reference
def test_reference_blocks():
    block("reference")
"""


def test_stopping_a_forked_suite_ends_every_pytest_process(tmp_path, monkeypatch):
    import os
    import select

    monkeypatch.setattr(pytest_fork, "SHARED_IMPORTS", ("json",))
    suite = _suite(tmp_path, BLOCKING)
    monkeypatch.setenv("HANDSHAKE_DIR", str(tmp_path))
    os.mkfifo(tmp_path / "never")
    out = tmp_path / "row"
    out.mkdir()
    cmd = _command(suite, out, pytest_process.__name__)
    groups = [SGLANG, REFERENCE]
    streams, kill, _wait = side_by_side._start_forked(
        cmd, [side_by_side._with_paths(cmd, g, out) for g in groups], groups, _env(monkeypatch), tmp_path
    )
    pids = []
    deadline = time.monotonic() + 60  # the failure path only: both tests start within seconds
    for name in ("contract", "reference"):
        while not (tmp_path / f"{name}.pid").exists():  # the event: that test is running
            assert time.monotonic() < deadline, f"the {name} test never started"
            time.sleep(0.05)
        pids.append(int((tmp_path / f"{name}.pid").read_text()))
    kill()
    for stream in streams:  # each pipe ends (EOF) only when every process holding it is gone
        while True:
            assert select.select([stream], [], [], max(0.0, deadline - time.monotonic()))[0], (
                "a pytest process outlived the stop: its pipe is still open"
            )
            if not os.read(stream.fileno(), 65536):
                break
        stream.close()
    assert _wait() == [-9, -9]  # the launcher itself was killed: no child's status is known
    for pid in pids:  # gone, or dead and not yet reaped by its new parent (a killed process closes its pipes
        status = Path(f"/proc/{pid}/status")  # on its way out, so it may still be exiting here: wait for that)
        while status.exists() and "\nState:\tZ" not in _read(status):
            assert time.monotonic() < deadline, f"pytest process {pid} outlived the stop"
            time.sleep(0.05)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # gone between the two looks
        return "\nState:\tZ"


def test_the_parts_name_one_suite_by_its_hash_not_its_commit(monkeypatch):
    """Both processes fingerprint the suite on their own: a commit made between their starts changes the commit
    beside the hash, not the suite (seen on a CPU row, 2026-12-02); two hashes are two suites."""
    monkeypatch.setenv(expected_checks.ENV, expected_checks.AS_COLLECTED)

    def part(fp):
        return {"tiers": {}, "versions": {}, "gpus": 0, "seconds": 1.0, "exitstatus": 0, "fingerprint": fp}

    one = {"suite": "a" * 64, "commit": "c1", "dirty": False}
    merged = side_by_side.merge_tiers([(SGLANG, part(one)), (REFERENCE, part(dict(one, commit="c2", dirty=True)))])
    assert merged["fingerprint"]["suite"] == "a" * 64
    merged = side_by_side.merge_tiers([(SGLANG, part(one)), (REFERENCE, part(dict(one, suite="b" * 64)))])
    assert merged["fingerprint"] == {"suite": None, "error": "the row's processes ran different suites"}
