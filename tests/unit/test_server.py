"""SglangServer lifecycle against stub server *processes* (tests/unit/fake_sglang.py and tiny python -c scripts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from events import HANG, wait_for

from mtpmatrix.core.failures import classify
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client, processes
from mtpmatrix.serving.server import SglangServer, root_exception

FAKE = str(Path(__file__).with_name("fake_sglang.py"))


def _fake(tmp_path, *extra, **kw) -> SglangServer:
    return SglangServer(
        ["--model-path", "fake", *extra], log_path=tmp_path / "server.log", launcher=[sys.executable, FAKE], **kw
    )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_start_ready_generate_stop(tmp_path):
    srv = _fake(tmp_path, "--startup-delay", "0.3", "--starting-for", "0.5")
    with srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}"
        assert srv.model_info == {"model_path": "fake", "is_generation": True}
        assert srv.ready_seconds >= 0.8
        out = client.generate(srv.base_url, text="hi")
        assert out["meta_info"]["completion_tokens"] == 8
        assert client.spec_stats(srv.server_info())["avg_spec_accept_length"] == 2.0
        assert srv.flush_cache() is True
        srv.check_alive()
    assert not srv.alive()
    assert processes.port_is_free("127.0.0.1", srv.port)
    log = (tmp_path / "server.log").read_text()
    assert "# command:" in log and "fake sglang: serving" in log and "stopped (exit code" in log
    assert srv.stop() is not None  # idempotent


def test_progress_lines_while_a_server_starts(tmp_path):
    """A launch takes minutes on a GPU: the caller hears the launch, a line while it waits, and the ready time."""
    lines = []
    started = tmp_path / "a-starting-line-was-said"

    def hear(line: str) -> None:
        lines.append(line)
        if "] starting, " in line:
            started.touch()

    # the stub stays unready (503) until the caller has heard a "starting" line: one is said however fast or slow
    # the stub comes up
    srv = _fake(
        tmp_path,
        "--ready-file",
        str(started),
        name="random-nomtp",
        progress=hear,
        progress_every=0.4,
        ready_timeout=HANG,
    )
    with srv:
        pass
    assert lines[0].startswith(f"[random-nomtp] launching on {srv.base_url}, log {tmp_path / 'server.log'}")
    assert any(ln.startswith("[random-nomtp] starting, ") and "so far (last health answer: " in ln for ln in lines)
    assert lines[-1] == f"[random-nomtp] ready after {srv.ready_seconds:.0f}s"
    failed = []
    (tmp_path / "fail-once").write_text("")
    with pytest.raises(CheckFailure):
        with _fake(tmp_path, "--exit-once", str(tmp_path / "fail-once"), name="x", progress=failed.append):
            pass
    assert failed[-1].startswith("[x] exited with code 1 before it was ready")


def test_command_line_shape(tmp_path):
    srv = SglangServer(["--model-path", "m"], python="/x/bin/python", log_path=tmp_path / "l.log", port=31234)
    assert srv.command == [
        "/x/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
    ]
    with pytest.raises(ValueError, match="loopback"):
        SglangServer([], log_path=tmp_path / "l.log", host="0.0.0.0")
    with pytest.raises(ValueError, match="host/port"):
        SglangServer(["--port", "1"], log_path=tmp_path / "l.log")


def test_early_exit_fails_fast_with_log_tail(tmp_path):
    script = (
        "import sys\nfor i in range(60): print('noise', i)\n"
        "print('RuntimeError: CUDA error: out of memory', flush=True)\nsys.exit(3)"
    )
    srv = SglangServer([], log_path=tmp_path / "s.log", launcher=[sys.executable, "-c", script], ready_timeout=HANG)
    with pytest.raises(CheckFailure) as ei:
        with srv:
            pass
    exc = ei.value
    assert exc.kind == "launch"
    first = str(exc).splitlines()[0]
    # fails fast: the exit is seen as an exit (not the ready timeout's "not ready after"), whenever it comes
    assert "exited with code 3" in first and "CUDA error: out of memory" in first
    assert "noise 59" in str(exc) and "noise 5\n" not in str(exc)  # only the tail (~40 lines)
    assert classify(exc).kind == "launch"


# The shape of an sglang 0.5.13 scheduler crash (H200, 2026-12-02, witness-mtp-topk3-eager): a traceback the server
# survived first, then the crash, chained to the SIGQUIT handler's own traceback
SCHEDULER_CRASH = [
    "[2026-12-02 05:42:35] Can not initialize OpenAIServingResponses, error: Traceback (most recent call last):",
    '  File "/tmp/site-13/sglang/srt/entrypoints/http_server.py", line 1, in <module>',
    "ModuleNotFoundError: No module named 'openai_harmony'",
    "[2026-12-02 05:42:38] Prefill batch, #new-seq: 1",
    "[2026-12-02 05:42:46] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/tmp/site-13/sglang/srt/model_executor/cuda_graph_buffer_registry.py", line 39, in _foreach_copy',
    "    torch._foreach_copy_(group_dsts, group_srcs)",
    "RuntimeError: The size of tensor a (24) must match the size of tensor b (48) at non-singleton dimension 0",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/tmp/site-13/sglang/srt/managers/scheduler.py", line 4062, in run_scheduler_process',
    "KeyboardInterrupt",
    "[2026-12-02 05:42:46] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
]


def test_root_exception_is_the_first_after_the_last_sign_of_progress():
    crash = "RuntimeError: The size of tensor a (24) must match the size of tensor b (48) at non-singleton dimension 0"
    # the survived startup traceback is followed by a prefill line: passed over; the SIGQUIT chain: not the cause
    assert root_exception(SCHEDULER_CRASH) == crash
    # a teardown traceback after the crash (another chain) does not replace it
    teardown = ["Traceback (most recent call last):", '  File "uvicorn.py", line 1', "asyncio.CancelledError"]
    assert root_exception(SCHEDULER_CRASH + teardown) == crash
    # a death with no traceback after the server went on (a C++ abort): no cause named, never the survived one
    abort = ["terminate called after throwing an instance of 'c10::Error'", "  what():  CUDA error"]
    assert root_exception(SCHEDULER_CRASH[:4] + abort) == ""
    # exception lines without an Error suffix, and a bare Exception, are named too
    for last in ("Exception: Capture cuda graph failed", "triton.runtime.errors.OutOfResources: out of resource"):
        assert root_exception(["[t] x: Traceback (most recent call last):", '  File "a.py", line 1', last]) == last
    assert root_exception(["[t] Capture cuda graph begin", "RuntimeError mentioned in prose"]) == ""


def test_launch_failure_names_the_root_exception_not_the_sigquit(tmp_path):
    script = "import sys\nprint(*" + repr(SCHEDULER_CRASH) + ", sep=chr(10), flush=True)\nsys.exit(3)"
    srv = SglangServer([], log_path=tmp_path / "s.log", launcher=[sys.executable, "-c", script], ready_timeout=HANG)
    with pytest.raises(CheckFailure) as ei:
        with srv:
            pass
    first = str(ei.value).splitlines()[0]
    assert ei.value.kind == "launch"
    # the SIGQUIT line is the log's last error-looking line; the cause is the traceback's root
    assert "exited with code 3" in first and "SIGQUIT" not in first
    assert first.endswith(
        "RuntimeError: The size of tensor a (24) must match the size of tensor b (48) at non-singleton dimension 0"
    )


def test_not_ready_before_deadline_is_launch_failure(tmp_path):
    srv = _fake(tmp_path, "--ready-file", str(tmp_path / "never"))  # bound and answering, never ready
    srv.start()
    try:
        # the deadline counts from a stub that answers (its "serving" line), not from a launch on a busy machine;
        # a loopback 503 takes milliseconds, the 2 s are for the deadline itself
        wait_for(lambda: "fake sglang: serving on" in (tmp_path / "server.log").read_text(), "the stub serving")
        with pytest.raises(CheckFailure) as ei:
            srv.wait_ready(timeout=2)
        with pytest.raises(CheckFailure, match="not ready after 0s \\(last health answer: /health_generate -> 503"):
            srv.wait_ready(timeout=0)  # a wait that begins at its deadline still asks the server once
    finally:
        srv.stop()
    assert ei.value.kind == "launch" and "not ready after 2s" in str(ei.value)
    assert "/health_generate -> 503" in str(ei.value)
    assert not srv.alive() and processes.port_is_free("127.0.0.1", srv.port)


def test_stop_kills_whole_group_including_grandchild(tmp_path):
    pidfile = tmp_path / "pids"
    srv = _fake(tmp_path, "--grandchild", "--pidfile", str(pidfile))
    with srv:
        spid, gpid = map(int, pidfile.read_text().split())
        assert _alive(spid) and _alive(gpid) and gpid != 0
        assert os.getpgid(gpid) == srv.pid  # same process group as the server
    # stop() returns once the group has no live member: nothing to wait for here
    assert not _alive(spid) and not _alive(gpid)
    assert processes.port_is_free("127.0.0.1", srv.port)


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    srv = _fake(tmp_path, "--ignore-sigterm", stop_timeout=1)
    srv.start()
    srv.wait_ready(timeout=HANG)  # serving: SIGTERM is ignored by now, so the 1 s SIGTERM grace always runs out
    rc = srv.stop()
    assert rc == -9
    assert "SIGKILL" in (tmp_path / "server.log").read_text()


def test_crash_while_serving_is_crash(tmp_path):
    srv = _fake(tmp_path)
    with srv:
        os.kill(srv.pid, 9)
        srv.proc.wait(HANG)
        with pytest.raises(CheckFailure) as ei:
            srv.check_alive("running gsm8k")
        assert ei.value.kind == "crash" and "exit code -9" in str(ei.value)


def test_port_in_use_is_refused(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not processes.port_is_free("127.0.0.1", port)
        with pytest.raises(RuntimeError, match="already in use"):
            _fake(tmp_path, port=port).start()


def test_secrets_are_redacted_in_log_header(tmp_path):
    script = "import time; time.sleep(0.1)"
    env = {"HF_TOKEN": "hf_supersecret", "MY_API_KEY": "k-123", "CUDA_VISIBLE_DEVICES": "0"}
    srv = SglangServer(
        ["--api-key", "sk-abc", "--hf-token=tok-xyz", "--model-path", "m"],
        log_path=tmp_path / "s.log",
        launcher=[sys.executable, "-c", script],
        env=env,
    )
    srv.start()
    srv.stop()
    log = (tmp_path / "s.log").read_text()
    for secret in ("hf_supersecret", "k-123", "sk-abc", "tok-xyz"):
        assert secret not in log
    assert '"CUDA_VISIBLE_DEVICES": "0"' in log and "--api-key '***'" in log or "--api-key ***" in log


def test_env_passed_to_process(tmp_path):
    out = tmp_path / "env.txt"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ.get('MTP_TEST_VAR', '-'))"
    srv = SglangServer(
        [], log_path=tmp_path / "s.log", launcher=[sys.executable, "-c", script], env={"MTP_TEST_VAR": "yes"}
    )
    srv.start()
    srv.proc.wait(HANG)
    srv.stop()
    assert out.read_text() == "yes"


def test_auto_port_taken_before_start_is_picked_again(tmp_path):
    import socket

    srv = _fake(tmp_path)
    taken = srv.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with srv:
            assert srv.port != taken
            assert client.health(srv.base_url, timeout=5)


def test_exit_cause_of_a_live_healthy_server_is_none_at_once(tmp_path):
    # requests that lost their connection to a server that did not die (a stall): nothing to wait for; a harness
    # that waited for an exit here would sit out the whole bound (HANG) instead of the few seconds to a healthy answer
    srv = _fake(tmp_path)
    with srv:
        assert srv.exit_cause(wait=HANG) == ""
        assert srv.alive()
