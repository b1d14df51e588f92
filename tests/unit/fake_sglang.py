"""A stub of sglang's native HTTP API, for unit tests of the client / lifecycle code ONLY (never for tiers).

In-process::

    with FakeSglang(delay=0.01, fail={3: 500}) as fake:
        client.generate(fake.base_url, text="hi")

As a process (lifecycle tests; argv mimics ``sglang.launch_server``)::

    python fake_sglang.py --model-path x --host 127.0.0.1 --port 30000 [--startup-delay 1] [--grandchild]

Tests wait on events here, not on time (tests/unit/events.py): ``before_answer`` runs in each /generate handler
thread before it answers (a barrier: requests in flight at once; an event: a reply held back), ``--ready-file``
keeps /health at 503 until a file exists, ``--rendezvous`` holds each stub process until N of them run at once.

Endpoints: GET /health, /health_generate, /model_info, /get_model_info, /server_info, /get_server_info;
POST /generate, /flush_cache; with ``shapes`` (fake_shapes.WitnessShapes) also /v1/completions,
/v1/chat/completions and streamed answers; with shapes that stream event by event and hear aborts
(fake_long.LongWitnessShapes) also /abort_request. HTTP/1.1 keep-alive like uvicorn.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeState:
    def __init__(
        self,
        *,
        delay: float = 0.0,
        fail: dict | None = None,
        responder: Callable | None = None,
        server_info: dict | None = None,
        legacy_server_info: bool = False,
        accept_length: float = 2.0,
        completion_tokens: int = 8,
        starting_for: float = 0.0,
        flush_refusals: int = 0,
        drop_connection: set | None = None,
        before_answer: Callable[[], object] | None = None,
        crash_on_key: str | None = None,
        crash_after: int = 0,
        crash_holds: bool = False,
        ready_file: str | None = None,
        shapes: Callable[[str, dict], object] | None = None,
    ):
        self.delay = delay
        self.fail = dict(fail or {})  # request number (0-based, arrival order) -> HTTP status
        self.drop_connection = set(drop_connection or ())  # request numbers answered by closing the socket
        self.responder = responder  # payload -> text
        self.server_info = server_info
        self.legacy_server_info = legacy_server_info  # 404 on /server_info (old releases)
        self.accept_length = accept_length
        self.completion_tokens = completion_tokens
        self.ready_at = time.monotonic() + starting_for  # /health answers 503 until then
        self.ready_file = ready_file  # ... and until this file exists
        # called by each /generate before it answers; what it raises is answered as a 500 with its text
        self.before_answer = before_answer
        self.crash_on_key = crash_on_key
        self.crash_after = crash_after  # requests with crash_on_key answered before the one that crashes
        self.crash_holds = crash_holds  # the crash keeps the process and holds the request (sglang's coredump wait)
        self.flush_refusals = flush_refusals
        # (path, payload) -> the answer of /generate and the OpenAI endpoints (fake_shapes.WitnessShapes): a dict or
        # a list; for ``stream: true`` the list of events, sent as server-sent events and data: [DONE]
        self.shapes = shapes
        self.lock = threading.Lock()
        self.count = 0
        self.payloads: list[dict] = []
        # request number -> the most other /generate requests in flight at once while it was (meta_info "fake_peers")
        self.active: set[int] = set()
        self.peers: dict[int, int] = {}
        self.connections: set = set()
        self.flushes = 0

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at and (self.ready_file is None or os.path.exists(self.ready_file))

    def info(self) -> dict:
        if self.server_info is not None:
            return self.server_info
        return {
            "model_path": "fake",
            "speculative_algorithm": "FROZEN_KV_MTP",
            "speculative_eagle_topk": 1,
            "disable_cuda_graph": False,
            "version": "0.0.fake",
            "internal_states": [{"avg_spec_accept_length": self.accept_length}],
        }


def make_handler(state: FakeState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            # like uvicorn/asyncio: no Nagle, else header and body writes meet delayed ACKs (40 ms per request)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *a):  # quiet
            pass

        def _send(self, status: int, obj=None, text: str | None = None):
            body = (json.dumps(obj) if obj is not None else (text or "")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if obj is not None else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            with state.lock:
                state.connections.add(self.client_address)
            p = self.path.split("?")[0]
            if p in ("/health", "/health_generate"):
                return self._send(200 if state.ready() else 503, text="")
            if p in ("/model_info", "/get_model_info"):
                return self._send(200, {"model_path": "fake", "is_generation": True})
            if p == "/server_info" and state.legacy_server_info:
                return self._send(404, {"detail": "Not Found"})
            if p in ("/server_info", "/get_server_info"):
                return self._send(200, state.info())
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            p = self.path.split("?")[0]
            if p == "/flush_cache":
                with state.lock:
                    state.flushes += 1
                    refuse = state.flushes <= state.flush_refusals
                return self._send(400 if refuse else 200, text="Cache flushed.\n")
            if p == "/abort_request" and hasattr(state.shapes, "abort"):
                state.shapes.abort(json.loads(raw).get("rid"))
                return self._send(200, text="")
            if state.shapes is not None and p in ("/generate", "/v1/completions", "/v1/chat/completions"):
                return self._shape(p, raw)
            if p != "/generate":
                return self._send(404, {"detail": "Not Found"})
            with state.lock:
                k = state.count
                state.count += 1
                state.connections.add(self.client_address)
                state.active.add(k)
                for j in state.active:
                    state.peers[j] = max(state.peers.get(j, 0), len(state.active) - 1)
            try:
                return self._generate(k, raw)
            finally:
                with state.lock:
                    state.active.discard(k)

        def _shape(self, path: str, raw: bytes):
            payload = json.loads(raw)
            with state.lock:
                state.payloads.append(payload)
            if payload.get("stream") and hasattr(state.shapes, "stream"):
                return self._stream_live(state.shapes.stream(payload))
            answer = state.shapes(path, payload)
            if isinstance(answer, tuple):  # (status, message): sglang's error body
                return self._send(answer[0], {"error": {"message": answer[1], "code": answer[0]}})
            if not payload.get("stream"):
                return self._send(200, answer)
            body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in answer)
            if not getattr(state.shapes, "drop_done", False):
                body += b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None

        def _stream_live(self, events):
            """Each event written as it is produced (the shapes may block between events), one HTTP chunk each, as
            uvicorn sends a StreamingResponse."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            for e in events:
                chunk(b"data: " + json.dumps(e).encode() + b"\n\n")
            chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return None

        def _generate(self, k: int, raw: bytes):
            try:
                payload = json.loads(raw)
            except ValueError:
                return self._send(400, {"error": {"message": "bad json"}})
            with state.lock:
                state.payloads.append(payload)
            if state.delay:
                time.sleep(state.delay)
            if state.crash_on_key and state.crash_on_key in payload:
                with state.lock:
                    state.crash_after -= 1
                    crash_now = state.crash_after < 0
                if crash_now and state.crash_holds:  # sglang: the crash logged, the request held until the kill
                    _scheduler_crash_logged(drop=False)
                    time.sleep(CRASH_HOLD_S)
                    print("fake sglang: a held request was released by no one", flush=True)
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                if crash_now:
                    _scheduler_crash()
            if state.before_answer is not None:
                try:
                    state.before_answer()
                except ConnectionAbortedError:  # the server went away under this request: its connection drops
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return None
                except Exception as exc:  # e.g. a broken barrier: the requests were not all in flight at once
                    return self._send(500, {"error": {"message": f"before_answer: {type(exc).__name__}: {exc}"}})
            if k in state.drop_connection:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if k in state.fail:
                return self._send(
                    state.fail[k],
                    {"error": {"message": f"injected failure #{k}", "type": "BadRequest", "code": state.fail[k]}},
                )
            text = state.responder(payload) if state.responder else f"echo {k}"
            ct = state.completion_tokens
            meta = {
                "id": f"req-{k}",
                "finish_reason": {"type": "length", "length": ct},
                "prompt_tokens": 5,
                "completion_tokens": ct,
                "cached_tokens": 0,
                "e2e_latency": state.delay,
            }
            with state.lock:  # out of flight before the answer leaves: the client may send its next request at once
                state.active.discard(k)
                meta["fake_peers"] = state.peers.pop(k, 0)
            if state.accept_length:
                verify = max(1, round(ct / state.accept_length))
                meta.update(spec_verify_ct=verify, spec_accept_length=ct / verify)
            return self._send(200, {"text": text, "output_ids": list(range(ct)), "meta_info": meta})

    return Handler


def gsm8k_responder(
    lines: list[dict], right: Callable[[int], bool] = lambda index: True, num_shots: int = 5
) -> Callable[[dict], str]:
    """A /generate responder for GSM8K prompts (mtpmatrix.tiers.gsm8k_eval's layout, few-shot prefix from the first
    ``num_shots`` lines): the gold answer for evaluated question ``index`` where ``right(index)``, else gold + 1."""
    golds: dict[str, tuple[int, str]] = {}
    for i, line in enumerate(lines[num_shots:]):
        golds.setdefault(line["question"], (i, line["answer"].split("####")[-1].strip().replace(",", "")))

    def respond(payload: dict) -> str:
        question = payload["text"].rsplit("Question: ", 1)[-1].removesuffix("\nAnswer:")
        index, gold = golds[question]
        return f" The answer is {gold if right(index) else int(float(gold)) + 1}.\n\n"

    return respond


def server_info(
    model_path: str = "google/gemma-4-E4B-it", topk: int | None = 1, accept_length: float | None = 2.5, **extra
) -> dict:
    """/server_info as sglang 0.5.17 answers it (the fields the tiers read): resolved speculative args for ``topk``
    (None: no speculative decoding), CUDA graphs on, the accept length under internal_states."""
    from mtpmatrix.core import settings

    info = {
        "model_path": model_path,
        "tp_size": 1,
        "disable_cuda_graph": False,
        "version": "0.5.17",
        "speculative_algorithm": None,
        "internal_states": [{}],
    }
    if topk is not None:
        info.update(
            settings.expected_resolution(topk)
            if topk in settings.DRAFT_TOKENS
            else {"speculative_algorithm": settings.SPEC_ALGORITHM_RESOLVED, "speculative_eagle_topk": topk},
            speculative_draft_model_path=model_path + "-assistant",
        )
        if accept_length is not None:
            info["internal_states"] = [{"avg_spec_accept_length": accept_length}]
    info.update(extra)
    return info


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # uvicorn listens with backlog 2048; the default 5 resets connections at parallel 128
    daemon_threads = True


class FakeSglang:
    """In-process fake server on a free 127.0.0.1 port (context manager)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **kw):
        self.state = FakeState(**kw)
        self.httpd = _Server((host, port), make_handler(self.state))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeSglang:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _scheduler_crash() -> None:
    """What sglang's log holds when its scheduler dies mid-request: the cause, then the SIGQUIT handler's own
    traceback chained to it; every open connection then drops."""
    _scheduler_crash_logged(drop=False)
    os._exit(1)


CRASH_HOLD_S = 120.0  # --crash-holds: how long a crashed request waits for a kill before it gives up
_CRASH_LOGGED = threading.Lock()  # held for good by the first crash: its lines are written once, never interleaved


def _scheduler_crash_logged(drop: bool = True) -> None:
    """The crash's log lines (once, by the first request to get here: every request in flight lands here, and lines
    printed by two handler threads at once interleave); with ``drop`` the request is answered by a dropped connection
    (raised: the handler closes it) while the process stays, as sglang's launcher does while it waits for coredumps."""
    if not _CRASH_LOGGED.acquire(blocking=False):
        if drop:
            raise ConnectionAbortedError("scheduler crashed")
        threading.Event().wait()  # the first crash ends the process (os._exit) once its lines are out
    print(
        "[t] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "model_runner.py", line 3208, in forward_decode',
        "RuntimeError: injected scheduler crash (--crash-on-generate)",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "scheduler.py", line 4062, in run_scheduler_process',
        "KeyboardInterrupt",
        "[t] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
        sep="\n",
        flush=True,
    )
    if drop:
        raise ConnectionAbortedError("scheduler crashed")


def rendezvous(folder: str, count: int) -> None:
    """Hold this stub until ``count`` stubs (this one included) have reached this point: proof that they were
    launched side by side. Exits 1 with one line when they never are (launched in turn, the first waits alone)."""
    from events import wait_for

    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    try:
        wait_for(lambda: len(os.listdir(folder)) >= count, f"{count} fake sglang servers running at once")
    except AssertionError as exc:
        print(f"fake sglang: rendezvous: {exc} ({len(os.listdir(folder))} were)", flush=True)
        sys.exit(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--startup-delay", type=float, default=0.0, help="seconds before binding the port")
    ap.add_argument("--starting-for", type=float, default=0.0, help="seconds of 503 on /health after binding")
    ap.add_argument("--grandchild", action="store_true", help="spawn a long-lived grandchild (same group)")
    ap.add_argument("--pidfile", default=None, help="write 'server_pid grandchild_pid' here")
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--exit-once", default=None, help="if this file exists: delete it and exit 1 (one failure)")
    ap.add_argument("--exit-always", action="store_true", help="exit 1 at every launch (a broken release)")
    ap.add_argument(
        "--crash-stays",
        action="store_true",
        help="with --crash-on-generate: log the crash and drop the request, but keep the process (sglang 0.5.13's "
        "launcher waits 60 s for CUDA coredumps before it exits)",
    )
    ap.add_argument(
        "--crash-on-generate",
        action="store_true",
        help="the first /generate kills the server as an sglang scheduler crash does: chained tracebacks, exit",
    )
    ap.add_argument(
        "--crash-on-key",
        default=None,
        metavar="KEY",
        help="the first /generate whose body has KEY kills the server as --crash-on-generate does (sglang 0.5.17 on "
        "token_ids_logprob in a mixed batch)",
    )
    ap.add_argument("--crash-after", type=int, default=0, help="with --crash-on-key: answer N such requests first")
    ap.add_argument(
        "--crash-holds",
        action="store_true",
        help="with --crash-on-key: log the crash and its SIGQUIT, keep the process and hold the request (sglang's 60 s "
        "coredump wait) until the process is killed",
    )
    ap.add_argument("--ready-file", default=None, help="/health answers 503 until this file exists")
    ap.add_argument(
        "--rendezvous",
        default=None,
        metavar="DIR",
        help="before binding: leave a file in DIR, then wait until --rendezvous-count stubs have",
    )
    ap.add_argument("--rendezvous-count", type=int, default=1)
    args, _unknown = ap.parse_known_args(argv)
    if args.ignore_sigterm:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_once:
        try:
            os.unlink(args.exit_once)
        except FileNotFoundError:
            pass
        else:
            print("fake sglang: RuntimeError: injected launch failure (--exit-once)", flush=True)
            sys.exit(1)
    if args.exit_always:
        print("fake sglang: RuntimeError: draft CUDA graph capture failed (--exit-always)", flush=True)
        sys.exit(1)
    child_pid = None
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        child_pid = child.pid
    if args.pidfile:
        with open(args.pidfile, "w") as fh:
            fh.write(f"{os.getpid()} {child_pid or 0}\n")
    print(f"fake sglang: pid {os.getpid()} starting", flush=True)
    if args.rendezvous:
        rendezvous(args.rendezvous, args.rendezvous_count)
    time.sleep(args.startup_delay)
    crash = None
    if args.crash_on_generate:
        crash = _scheduler_crash_logged if args.crash_stays else _scheduler_crash
    fake = FakeSglang(
        args.host,
        args.port,
        starting_for=args.starting_for,
        ready_file=args.ready_file,
        before_answer=crash,
        crash_on_key=args.crash_on_key,
        crash_after=args.crash_after,
        crash_holds=args.crash_holds,
    )
    print(f"fake sglang: serving on {fake.base_url}", flush=True)
    fake.httpd.serve_forever()


if __name__ == "__main__":
    main()
