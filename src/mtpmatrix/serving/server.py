"""sglang server lifecycle: launch, readiness, teardown of the whole process tree.

    with SglangServer(settings.server_args(...), log_path=tmp / "server.log") as srv:
        client.generate(srv.base_url, text="Hello", sampling_params={"max_new_tokens": 8})

``start()`` runs ``python -m sglang.launch_server <args> --host 127.0.0.1 --port P`` in its own session/process
group, stdout+stderr into one log file. ``wait_ready()`` polls /health_generate (falling back to /health) and then
/model_info, and fails fast with ``CheckFailure("launch")`` (exit code + log tail) when the process dies first.
``stop()`` kills the whole process group (SIGTERM, grace, SIGKILL), waits until no member is left, the port is
free and, where ``nvidia-smi`` exists, no GPU context of those pids is left.

Stdlib and this package only, and never imports sglang (the launching Python may be another venv's).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import client
from mtpmatrix.serving.processes import (
    LOG_NOTE,
    READY_NOTE,
    free_port,
    gpu_memory_by_pid,
    gpu_pids,
    group_members,
    port_is_free,
    redact_args,
    redact_env,
    supported_env,
)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
HEALTH_PATHS = ("/health_generate", "/health")
_ERROR_LINE = re.compile(r"Error|Exception|Traceback|CUDA out of memory|Killed|FAILED|assert", re.I)
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# what sglang's launcher logs when a child process (scheduler, detokenizer) failed: its traceback is logged by then
CHILD_FAILED = ("SIGQUIT received", "Received sigquit from a child process")
# lines of a server going on: a traceback before one of these was survived (sglang 0.5.13 logs an optional OpenAI
# class's ModuleNotFoundError at startup and serves on), so it never names why the server later died
PROGRESS_LINES = (
    "The server is fired up and ready to roll",
    LOG_NOTE + READY_NOTE,
    "Prefill batch",
    "Decode batch",
    "Uvicorn running on",
    "Application startup complete",
)
HEALTHY_AFTER = 2.0  # seconds after the failed requests: a server still healthy then stalled, it did not die
ROOT_EXCEPTION_LINES = 600  # a scheduler crash's chained tracebacks fit (H200, 0.5.13: ~90 lines)


def root_exception(lines: list[str]) -> str:
    """The first exception a traceback names after the server's last sign of progress: the crash, not the SIGQUIT
    handler's traceback chained to it nor a teardown traceback after it, and never a traceback the server survived
    (one followed by PROGRESS_LINES). A traceback's exception line is its first line after the frames that is not
    indented and carries no log prefix ("RuntimeError: ...", "Exception: ...", "triton...OutOfResources: ...").
    "" when no traceback follows the last progress line (a death without one: a C++ abort, a SIGKILL)."""
    root, in_traceback = "", False
    for raw in lines:
        line = raw.rstrip()
        if any(mark in line for mark in PROGRESS_LINES):
            root, in_traceback = "", False  # whatever came before was survived
        elif line.endswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace() and not line.startswith(("[", *_CHAINED)):
            in_traceback = False
            root = root or line
    return root


def _read_tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            block = min(size, max(65536, n * 400))
            fh.seek(size - block)
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-n:]


# --- the server -------------------------------------------------------------------------------------------------
# sglang's crash handler (tokenizer_manager, 0.5.13-0.5.23) sleeps 5 s and then waits 60 s for a py-spy dump and a
# CUDA coredump these boxes never make (no py-spy, no coredump pipe: "Waiting 60.0 seconds for CUDA coredumps before
# exiting", H200 2026-12-05e): a server whose scheduler died lingered 65 s before exiting, and four of them dying at
# their readiness probe put a mutant suite past its limit with no verdict. Off unless the caller's environment sets them.
CRASH_DIAGNOSTICS_OFF = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


class SglangServer:
    """One ``sglang.launch_server`` process tree on a loopback port; a context manager (start + wait_ready)."""

    def __init__(
        self,
        args: list[str],
        *,
        python: str = sys.executable,
        log_path: Path,
        env: dict | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout: float = 600,
        launcher: list[str] | None = None,
        stop_timeout: float = 60,
        name: str | None = None,
        progress: Callable[[str], None] | None = None,
        progress_every: float = 30.0,
    ):
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"SglangServer binds loopback only; got host {host!r}")
        self.args = [str(a) for a in args]
        if any(a in ("--host", "--port") or a.startswith(("--host=", "--port=")) for a in self.args):
            raise ValueError("pass host/port to SglangServer, not in args")
        self.python = python
        self.log_path = Path(log_path)
        self.host = host
        self._auto_port = port is None
        self.port = port if port is not None else free_port(host)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        # ``launcher`` replaces ``python -m sglang.launch_server`` (unit tests start stub servers this way).
        self.launcher = list(launcher) if launcher else [python, "-m", "sglang.launch_server"]
        self.name = name or "sglang"
        # progress(line): launch, a line every progress_every seconds while sglang starts (a launch takes 1-4
        # minutes with nothing else to show), ready or not
        self.progress = progress
        self.progress_every = progress_every
        if launcher is None:
            quiet = {k: v for k, v in CRASH_DIAGNOSTICS_OFF.items() if k not in os.environ}
            self.env, self.dropped_env = supported_env({**quiet, **(env or {})}, python)
        else:
            self.env, self.dropped_env = dict(env or {}), []
        self.proc: subprocess.Popen | None = None
        self.model_info: dict | None = None
        self.started_at: float | None = None
        self.ready_seconds: float | None = None
        self._pids_seen: set[int] = set()
        self._log_fh = None

    # -- properties
    @property
    def base_url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    @property
    def command(self) -> list[str]:
        return [*self.launcher, *self.args, "--host", self.host, "--port", str(self.port)]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- lifecycle
    def __enter__(self) -> SglangServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> SglangServer:
        if self.proc is not None:
            raise RuntimeError("server already started")
        if self._auto_port and not port_is_free(self.host, self.port):
            self.port = free_port(self.host)  # taken since __init__ picked it: pick again rather than fail
        if not port_is_free(self.host, self.port):
            raise RuntimeError(f"port {self.port} on {self.host} is already in use (a leftover server?)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab", buffering=0)
        header = [
            f"# mtpmatrix {self.name} server, started {_dt.datetime.now(_dt.UTC).isoformat()}",
            f"# command: {shlex.join(redact_args(self.command))}",
            f"# env overrides: {json.dumps(redact_env(self.env), sort_keys=True)}",
        ]
        if self.dropped_env:
            header.append(f"# not passed (unknown to this sglang's envs module): {', '.join(sorted(self.dropped_env))}")
        self._log_fh.write(("\n".join(header) + "\n").encode())
        full_env = {**os.environ, **self.env}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
        self._log_fh.write(f"# pid {self.proc.pid} (process group {self.proc.pid})\n".encode())
        atexit.register(self._atexit)
        self._say(f"launching on {self.base_url}, log {self.log_path}")
        return self

    def _say(self, line: str) -> None:
        if self.progress is not None:
            try:
                self.progress(f"[{self.name}] {line}")
            except Exception:  # a broken progress printer must not fail a launch
                pass

    def _fail(self, kind: str, first_line: str, n: int = 40) -> CheckFailure:
        tail = self.log_tail(n)
        # the message names why the server died: the root exception when a traceback shows one (what a known
        # upstream signature matches; only once it has exited: a server not ready in time has not died), else the
        # last line that looks like an error
        cause = (self.root_exception() if self.returncode is not None else "") or next(
            (ln.strip() for ln in reversed(tail) if _ERROR_LINE.search(ln) and not ln.startswith("#")), ""
        )
        head = first_line + (f": {cause[:300]}" if cause else "")
        body = "\n".join(tail)
        return CheckFailure(kind, f"{head}\nlog: {self.log_path}\n--- last {len(tail)} log lines ---\n{body}")

    def wait_ready(self, timeout: float | None = None, poll: float = 1.0) -> dict:
        """Block until the server generates (/health_generate 200) and answers /model_info; return model_info.

        Raises CheckFailure("launch") with the exit code and the log tail as soon as the process exits, or when
        ``timeout`` (default ``ready_timeout``) passes.
        """
        if self.proc is None:
            raise RuntimeError("server not started")
        if self.model_info is not None and self.proc.poll() is None:
            return self.model_info  # already ready (e.g. wait_ready() again inside ``with``)
        timeout = self.ready_timeout if timeout is None else timeout
        t0 = self.started_at or time.monotonic()
        deadline = time.monotonic() + timeout
        health = list(HEALTH_PATHS)
        last = "no answer yet"
        next_say = time.monotonic() + self.progress_every
        asked = False
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._say(f"exited with code {rc} before it was ready ({time.monotonic() - t0:.0f}s)")
                raise self._fail(
                    "launch",
                    f"{self.name} server exited with code {rc} before it was ready "
                    f"({time.monotonic() - t0:.0f}s after launch)",
                )
            remaining = deadline - time.monotonic()
            # given up only once the server was asked at least once: the failure says what it answered, even
            # when this wait began late (a loaded machine, a caller that waited on something else first)
            if remaining <= 0 and asked:
                self._say(f"not ready after {timeout:.0f}s: giving up")
                raise self._fail(
                    "launch", f"{self.name} server not ready after {timeout:.0f}s (last health answer: {last})"
                )
            if time.monotonic() >= next_say:
                next_say += self.progress_every
                self._say(f"starting, {time.monotonic() - t0:.0f}s so far (last health answer: {last})")
            try:
                asked = True
                status, _ = client.request(self.base_url, "GET", health[0], timeout=min(30.0, max(remaining, 1.0)))
                last = f"{health[0]} -> {status}"
                if status == 404 and len(health) > 1:
                    health.pop(0)
                    continue
                if status == 200:
                    status, body = client.request(
                        self.base_url, "GET", "/model_info", timeout=min(30.0, max(remaining, 1.0))
                    )
                    last = f"/model_info -> {status}"
                    if status == 404:  # very old releases
                        status, body = client.request(self.base_url, "GET", "/get_model_info", timeout=30)
                    if status == 200:
                        try:
                            self.model_info = json.loads(body) if body else {}
                        except ValueError:
                            self.model_info = {}
                        self.ready_seconds = round(time.monotonic() - t0, 3)
                        self._log(f"{READY_NOTE} {self.ready_seconds}s")
                        self._say(f"ready after {self.ready_seconds:.0f}s")
                        return self.model_info
            except (OSError, http.client.HTTPException) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def gpu_memory_mib(self) -> int | None:
        """GPU memory held by this server's process group (all TP ranks), in MiB; None when nvidia-smi cannot tell
        (absent, or a container whose PID namespace hides the pids)."""
        if self.proc is None:
            return None
        held = gpu_memory_by_pid()
        members = set(group_members(self.proc.pid))
        self._pids_seen |= members
        mine = [mib for pid, mib in (held or {}).items() if pid in members]
        return sum(mine) if mine else None

    def check_alive(self, what: str = "serving") -> None:
        """CheckFailure("crash") with the log tail when the server process has exited."""
        rc = self.returncode
        if self.proc is not None and rc is not None:
            raise self._fail("crash", f"{self.name} server died (exit code {rc}) while {what}")

    def _log(self, line: str) -> None:
        try:
            if self._log_fh and not self._log_fh.closed:
                self._log_fh.write(f"{LOG_NOTE}{line}\n".encode())
        except OSError:
            pass

    # -- HTTP conveniences
    def flush_cache(self, timeout: float = 60.0) -> bool:
        """POST /flush_cache, retrying while sglang refuses (it does while requests run); True when flushed."""
        deadline = time.monotonic() + timeout
        while True:
            ok = client.flush_cache(self.base_url, timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            if ok or time.monotonic() >= deadline:
                return ok
            time.sleep(0.5)

    def server_info(self, timeout: float = 60.0) -> dict:
        return client.server_info(self.base_url, timeout=timeout)

    def log_tail(self, n: int = 40) -> list[str]:
        return _read_tail(self.log_path, n)

    def root_exception(self) -> str:
        """``root_exception`` of this server's log (its last ROOT_EXCEPTION_LINES lines)."""
        return root_exception(self.log_tail(ROOT_EXCEPTION_LINES))

    def child_failed(self) -> bool:
        """Whether the log says a child of the server failed (sglang's launcher logs SIGQUIT once its scheduler died;
        it then holds every open request until its own kill: 60 s of coredump wait on 0.5.13 and 0.5.17)."""
        return any(m in ln for ln in self.log_tail(80) for m in CHILD_FAILED)

    def exit_cause(self, wait: float = 75.0, poll: float = 0.5) -> str:
        """Why the server died: its log's root exception, once the log shows that a child failed (sglang's
        launcher logs SIGQUIT after the child logged its traceback) or the process has exited; "" if neither
        happens within ``wait`` seconds. Waits on those events, not on the exit alone: after a scheduler crash
        0.5.13's launcher waits 60 s for CUDA coredumps before it exits (H200, 2026-12-02); ``wait`` covers that
        exit where a release logs no SIGQUIT line, and bounds a server that stalled without dying."""
        if self.proc is None:
            return ""
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None or any(m in ln for ln in self.log_tail(80) for m in CHILD_FAILED):
                return self.root_exception()
            waited = time.monotonic() - t0
            if waited >= wait:
                return ""
            # a server that still answers its health check a moment on did not die: it stalled (no cause to wait
            # for; the crash path logs SIGQUIT within milliseconds of dropping its connections)
            if waited >= HEALTHY_AFTER and self._answers_health():
                return ""
            time.sleep(poll)

    def _answers_health(self) -> bool:
        try:
            return client.request(self.base_url, "GET", "/health", timeout=5.0)[0] == 200
        except OSError:
            return False

    # -- teardown
    def stop(self, timeout: float | None = None, grace: float | None = None) -> int | None:
        """Kill the whole process group (SIGTERM, wait up to ``grace``, SIGKILL); wait up to ``timeout`` for port and
        GPU memory to be released (``grace`` defaults to ``timeout``).

        Returns the server's exit code (None when never started). Safe to call twice.
        """
        if self.proc is None:
            return None
        timeout = self.stop_timeout if timeout is None else timeout
        grace = timeout if grace is None else grace
        pgid = self.proc.pid
        members = set(group_members(pgid)) | {pgid}
        self._pids_seen |= members
        if self.proc.poll() is None or group_members(pgid):
            self._signal_group(pgid, signal.SIGTERM)
            if not self._wait_group(pgid, grace):
                self._log(f"process group {pgid} still alive {grace:.0f}s after SIGTERM: SIGKILL")
                self._signal_group(pgid, signal.SIGKILL)
                self._wait_group(pgid, 30)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        self._wait_port_free(timeout)
        self._wait_gpu_released(timeout)
        self._log(f"stopped (exit code {rc})")
        if self._log_fh:
            self._log_fh.close()
        atexit.unregister(self._atexit)
        return rc

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait_group(self, pgid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None:
                self.proc.poll()  # reap our direct child so it does not linger as a zombie
            members = group_members(pgid)
            self._pids_seen |= set(members)
            if not members:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _wait_port_free(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not port_is_free(self.host, self.port):
            if time.monotonic() >= deadline:
                self._log(f"port {self.port} still busy {timeout:.0f}s after stop")
                return False
            time.sleep(0.2)
        return True

    def _wait_gpu_released(self, timeout: float) -> bool:
        """Best effort: wait until nvidia-smi lists none of this server's pids (no-op without nvidia-smi)."""
        if not shutil.which("nvidia-smi"):
            return True
        deadline = time.monotonic() + timeout
        while True:
            held = gpu_pids()
            if held is None or not (held & self._pids_seen):
                return True
            if time.monotonic() >= deadline:
                self._log(f"GPU contexts of pids {sorted(held & self._pids_seen)} still present after {timeout:.0f}s")
                return False
            time.sleep(0.5)

    def _atexit(self) -> None:
        if self.proc is not None and (self.proc.poll() is None or group_members(self.proc.pid)):
            self._signal_group(self.proc.pid, signal.SIGKILL)
