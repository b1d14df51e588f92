"""Suites of fault injection (faults/suites.py): verdicts on tiers.json records as the pytest plugin writes them,
the suites' environment and command, the scheduler (server cap, warm-up, timeouts), leftover servers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from mutant_trees import (
    make_stub_env,
)

from mtpmatrix.faults import mutation as F
from mtpmatrix.faults import suites as S


@pytest.fixture
def stub_env(tmp_path, monkeypatch):
    return make_stub_env(tmp_path, monkeypatch)


def check(name: str, outcome: str, kind: str | None = None, message: str = "") -> dict:
    rec = {
        "id": f"tests/tiers/test_smoke.py::{name}",
        "tier": "smoke",
        "outcome": outcome,
        "seconds": 1.0,
        "metrics": {},
    }
    if kind:
        rec["failure"] = {"kind": kind, "type": "CheckFailure", "message": message, "frame": None, "raised_at": None}
    return rec


def tiers(*checks, verdict=None, reason=None) -> dict:
    smoke = {
        "verdict": verdict or ("failed" if any(c["outcome"] == "failed" for c in checks) else "passed"),
        "checks": list(checks),
    }
    if reason:
        smoke["reason"] = reason
    return {"tiers": {"smoke": smoke}, "exitstatus": 0}


def test_judge_suite():
    got = S.judge_suite(
        tiers(
            check("test_server_serves[w1]", "passed"),
            check("test_spec_metrics[w1]", "failed", "acceptance", "accept length 1.03 outside [5.0, 6]\nmore detail"),
        )
    )
    assert got.status == "failed" and got.passed == 1
    assert got.failed == [
        {
            "id": "tests/tiers/test_smoke.py::test_spec_metrics[w1]",
            "outcome": "failed",
            "kind": "acceptance",
            "message": "accept length 1.03 outside [5.0, 6]",
        }
    ]
    assert S.judge_suite(tiers(check("a", "passed"), check("b", "passed"))).status == "passed"
    skipped = S.judge_suite(tiers(check("a", "skipped"), verdict="skipped", reason="smoke tier: no GPU"))
    assert skipped.status == "error" and "no GPU" in skipped.reason
    assert S.judge_suite(tiers(check("a", "failed", "harness", "KeyError"))).status == "error"
    assert S.judge_suite(None, 2).reason.startswith("pytest exited 2 without tiers.json")
    assert S.judge_suite(tiers(check("a", "passed")), timed_out=True).status == "timeout"
    stopped = tiers(check("a", "passed"), verdict="error", reason="pytest stopped early (exit 2)")
    assert S.judge_suite(stopped).status == "error"


def test_hook_evidence_from_server_logs(tmp_path):
    (tmp_path / "server-w1.log").write_text(f"# pid 1 (process group 1)\n{F.MARK} m1 serves patched x.y (pid 3)\n")
    assert S.hook_evidence(tmp_path, "m1") == (True, None)
    assert S.hook_evidence(tmp_path, "m2") == (False, None)
    (tmp_path / "server-w3.log").write_text(f"{F.MARK} m1 NOT applied to x.y: changed (pid 4)\n")
    assert S.hook_evidence(tmp_path, "m1")[1].startswith(f"{F.MARK} m1 NOT applied")


@pytest.mark.parametrize(
    "outcome,served,refused,status",
    [
        (S.SuiteOutcome("failed", [{"id": "a", "kind": "acceptance"}]), True, None, "killed"),
        (S.SuiteOutcome("passed", [], 4), True, None, "survived"),
        (S.SuiteOutcome("failed", [{"id": "a", "kind": "launch"}]), False, None, "error"),  # killed by something else
        (S.SuiteOutcome("passed", [], 4), True, "NOT applied", "error"),
        (S.SuiteOutcome("timeout", reason="t"), True, None, "error"),
        (S.SuiteOutcome("error", reason="no smoke check ran"), True, None, "error"),
    ],
)
def test_mutant_status(outcome, served, refused, status):
    assert S.mutant_status(outcome, served, refused)[0] == status


def test_overall_verdict():
    killed, survived, na = ({"status": "killed"}, {"status": "survived"}, {"status": "n.a."})
    assert S.overall({"status": "passed"}, [killed, na]) == ("all-killed", 0)
    assert S.overall({"status": "passed"}, [killed, survived]) == ("survivors", 1)
    assert S.overall({"status": "failed"}, [killed]) == ("invalid", 1)
    assert S.overall({"status": "passed"}, [killed, {"status": "error"}]) == ("incomplete", 1)
    assert S.overall({"status": "passed"}, [na]) == ("nothing-applicable", 1)


def test_render_table():
    rows = [
        {"id": "baseline", "models": "unpatched sglang 0.5.17", "status": "passed", "seconds": 120.4},
        {
            "id": "topk-parent-hidden",
            "models": "x" * 80,
            "status": "killed",
            "seconds": 95.0,
            "killed_by": "test_spec_metrics[witness-mtp-topk3] (acceptance)",
        },
        {"id": "accept-count-server", "models": "m", "status": "n.a.", "seconds": None},
    ]
    lines = S.render_table(rows, models_width=20).splitlines()
    assert lines[0].split() == ["mutant", "what", "it", "models", "status", "killed", "by", "s"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[3].startswith("topk-parent-hidden   " + "x" * 17 + "...  killed  test_spec_metrics[")
    assert lines[3].endswith(" 95") and lines[2].endswith("120") and lines[4].endswith(" -")
    status_col = lines[0].index("status")
    assert [ln[status_col:].split()[0] for ln in lines[2:]] == ["passed", "killed", "n.a."]


def test_killed_by_names_checks_with_their_kind():
    checks = [{"id": f"t.py::c{i}", "kind": "acceptance"} for i in range(4)]
    assert S.killed_by(checks) == "c0 (acceptance), c1 (acceptance), +2 more"


def test_server_cap():
    assert S.server_cap(16, None) == 5  # one per CORES_PER_SERVER cores
    # a 12 GiB card: the smoke tier's memory rule wins (0.7 x 12 GiB / 2,944 MiB)
    assert S.server_cap(16, 12 * 1024) == 2
    assert S.server_cap(2, None) == 1 and S.server_cap(None, None) == 1
    assert S.server_cap(16, None, requested=2) == 2


def test_suite_env_puts_the_hook_first_and_names_the_suite(tmp_path):
    base = {"PYTHONPATH": "/tmp/site:src", F.ENV_MUTANT: "stale", "MTPMATRIX_SMOKE_SWAP_DRAFTERS": "1"}
    env = S.suite_env(
        base, ("a", "b"), tmp_path / "m", tmp_path / "tiny", tmp_path / "m" / "mutant.json", tmp_path / "cache"
    )
    assert env["PYTHONPATH"] == f"{F.HOOK_DIR}{os.pathsep}/tmp/site:src"
    assert env[F.ENV_MUTANT] == str(tmp_path / "m" / "mutant.json")
    assert env["MTPMATRIX_SMOKE_SERVERS"] == "a,b" and env["MTPMATRIX_SMOKE_PARALLEL"] == "2"
    assert env["MTPMATRIX_RESULTS"] == str(tmp_path / "m" / "tiers.json")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert "MTPMATRIX_SMOKE_SWAP_DRAFTERS" not in env
    baseline = S.suite_env(base, ("a",), tmp_path / "b", tmp_path / "tiny", None, None)
    assert F.ENV_MUTANT not in baseline and "TRITON_CACHE_DIR" not in baseline


def test_pytest_command_is_the_smoke_suite_with_its_own_results(tmp_path):
    s = S.Suite("m", ("a",), tmp_path, {})
    assert S.pytest_command(s, "py") == [
        "py",
        "-m",
        "pytest",
        "tests/tiers",
        "-p",
        "no:cacheprovider",
        "--tiers",
        "smoke",
        "--mtp-results",
        str(tmp_path / "tiers.json"),
    ]


def test_scheduler_respects_the_server_cap_and_the_warmup(tmp_path, stub_env, monkeypatch):
    _pkg, command = stub_env
    monkeypatch.setenv("STUB_SLEEP", "0.6")
    out = tmp_path / "out"
    suites = [S.Suite("baseline", ("a", "b"), out / "baseline", dict(os.environ))]
    suites += [S.Suite(f"m{i}", ("a",), out / f"m{i}", dict(os.environ)) for i in range(4)]
    done: list[str] = []
    S.Scheduler(
        suites,
        cap=2,
        timing=S.Timing(timeout=60, poll=0.02),
        command=command,
        log=lambda _: None,
        on_done=lambda s: done.append(s.name),
    ).run()
    assert sorted(done) == ["baseline", "m0", "m1", "m2", "m3"]
    spans = {}
    for line in (out / "spans.txt").read_text().splitlines():
        name, a, b = line.split()
        spans[name] = (float(a), float(b))
    servers = {s.name: s.n for s in suites}
    for name, (a, _b) in spans.items():  # at any start, the servers of overlapping suites fit under the cap
        overlapping = [n for n, (x, y) in spans.items() if x <= a < y]
        assert sum(servers[n] for n in overlapping) <= 2, (name, overlapping)
    assert all(s.started >= suites[0].started for s in suites[1:])


HANGING_SUITE = """\
import signal, time
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a SIGINT held since exec is raised here
    time.sleep(3600)
except KeyboardInterrupt:
    raise SystemExit(2)  # as pytest does: stops its servers, writes tiers.json
"""


@pytest.mark.parametrize("runner_sigint", ["handled", "ignored"])
def test_scheduler_times_out_a_hanging_suite(tmp_path, runner_sigint):
    """A suite past its deadline is interrupted with SIGINT and stops on it (exit 2), not SIGKILLed after its grace.

    Event, not time: SIGINT is blocked in this thread while the scheduler runs, so the suite starts with it blocked
    and the scheduler's SIGINT stays pending until the suite unblocks it inside its ``try`` -- however much longer
    than the 2 s deadline a Python start takes on a loaded machine. The grace is a hang bound only (the suite exits
    at once). 'ignored': the runner started with SIGINT ignored (a background job of a non-interactive shell), which
    its children inherit unless the scheduler resets it: they were SIGKILLed (-9), issue #20."""
    from events import HANG

    hang = tmp_path / "hang.py"
    hang.write_text(HANGING_SUITE)
    suite = S.Suite("m", ("a",), tmp_path / "m", dict(os.environ))
    runner_handler = signal.SIG_IGN if runner_sigint == "ignored" else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, runner_handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        S.Scheduler(
            [suite],
            cap=1,
            timing=S.Timing(timeout=2, poll=0.05, grace=HANG),
            command=lambda s: [sys.executable, str(hang)],
            log=lambda _: None,
        ).run()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)
    assert suite.timed_out and suite.exitstatus == 2
    assert S.judge_suite(None, suite.exitstatus, suite.timed_out).status == "timeout"


def test_leftover_server_groups_are_killed_only_when_they_are_sglang(tmp_path):
    procs = {}
    for name, code in (
        ("sg", "import time; time.sleep(120)  # sglang.launch_server"),
        ("other", "import time; time.sleep(120)"),
    ):
        p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        procs[name] = p
        (tmp_path / f"server-{name}.log").write_text(f"# command: x\n# pid {p.pid} (process group {p.pid})\nlog\n")
    try:
        assert S.stop_leftover_servers(tmp_path) == [procs["sg"].pid]
        assert procs["sg"].wait(timeout=10) == -9
        assert procs["other"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_known_upstream_failure_is_neither_a_kill_nor_a_failed_baseline():
    """H200, sglang 0.5.17 (2026-12-02): intact sglang fails four request-surface checks by known upstream deviations;
    the mutants' baseline read them as failed and left every mutant unrun. Tagged ones count as neither."""
    known = dict(
        check("test_min_p_matches_closed_form[s1]", "failed", "mismatch", "95 min_p-sampled tokens off"),
        known_upstream="sglang-mtp-verify-ignores-min-p",
    )
    baseline = S.judge_suite(tiers(check("a", "passed"), known, verdict="known-upstream"))
    assert baseline.status == "passed" and baseline.failed == [] and baseline.passed == 1
    mutant = S.judge_suite(
        tiers(
            check("a", "passed"),
            known,
            check("test_stop_ends_the_output_exactly[w1]", "failed", "mismatch", "3/10 stop"),
        )
    )
    assert mutant.status == "failed" and [f["id"].split("::")[1] for f in mutant.failed] == [
        "test_stop_ends_the_output_exactly[w1]"
    ]
