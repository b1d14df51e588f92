"""HTTP client for sglang's native API (/generate, /server_info, /flush_cache) and a concurrent batch runner.

Built on requests: every thread has its own keep-alive Session (requests.Session is not meant to be shared between
threads), so run_batch's workers hold one connection each and a thread's consecutive calls reuse its connection.

Response shape of POST /generate (single request), identical in sglang 0.5.13 / 0.5.17 / 0.5.23::

    {"text": str, "output_ids": [int, ...],            # output_ids: tokenizer_manager adds it for generation
     "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                   # only when speculative decoding ran at least one verify step for this request:
                   "spec_verify_ct", "spec_accept_length" (= completion_tokens / spec_verify_ct, bonus token included),
                   "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts",
                   "spec_correct_drafts_histogram",
                   # 0.5.13 only (backward-compat aliases): "spec_accepted_drafts", "spec_proposed_drafts",
                   # "spec_accept_histogram"; 0.5.17+: optional "spec_cap_length", "spec_block_accept_length"
                   ...}}

GET /server_info: resolved server args at the top level (0.5.23 adds "launch_command"), scheduler info, and
``internal_states`` (one dict per DP rank) whose ``avg_spec_accept_length`` (accepted tokens / verify forwards,
cumulative since launch) is present only once a speculative forward has run (all three releases).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests
import urllib3
from requests.adapters import HTTPAdapter

# what /server_info says is read in info.py (standard library: nox's Python reads it too); the tiers use it as client.*
from mtpmatrix.serving.info import PATHS as SERVER_INFO_PATHS
from mtpmatrix.serving.info import cuda_graph_disabled, error_message, find_arg, spec_stats  # noqa: F401

DEFAULT_TIMEOUT = 600.0
_JSON_HEADERS = {"Content-Type": "application/json"}


class ClientError(RuntimeError):
    """A non-2xx answer or an unusable body; ``status`` is the HTTP status (None for transport errors)."""

    def __init__(self, message: str, status: int | None = None, body: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = body


def finish_type(meta: dict) -> str | None:
    """meta_info's finish_reason type ("stop", "length", "abort"), or the reason itself where it is no object."""
    reason = meta.get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def _url(base_url: str, path: str) -> str:
    """``path`` on the server of ``base_url``; only its host and port count (user info never reaches a request, so
    no credential shows up in an error message)."""
    u = urllib.parse.urlsplit(base_url)
    if u.scheme not in ("http", ""):
        raise ValueError(f"only plain http is supported, got {base_url!r}")
    host = u.hostname or "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{u.port or 80}{path}"


class _ThreadSession:
    """One thread's requests.Session: its keep-alive connections serve every call that thread makes."""

    def __init__(self) -> None:
        self.session = requests.Session()
        # As the stdlib stack this replaces: nothing from the environment. A proxy variable would route local sglang
        # traffic through a proxy, and .netrc would add credentials; it also saves per-request environment lookups.
        self.session.trust_env = False
        # A thread has one request in flight at a time, so one pooled connection per server is all it uses: run_batch's
        # ``parallel`` threads hold ``parallel`` connections in all. No retries inside urllib3: a read timeout or a
        # server dying mid-request must not be re-sent (send() retries the one safe case itself).
        self.session.mount("http://", HTTPAdapter(pool_maxsize=1, max_retries=0))
        self.kept_alive: set[str] = set()  # servers whose last answer left a connection open in the pool

    def send(self, method: str, base_url: str, path: str, payload: Any, timeout: float) -> tuple[int, bytes]:
        url = _url(base_url, path)
        body = None if payload is None else json.dumps(payload).encode()
        server = url[: len(url) - len(path)]
        for attempt in (0, 1):
            reused = server in self.kept_alive
            self.kept_alive.discard(server)
            try:
                resp = self.session.request(
                    method,
                    url,
                    data=body,
                    headers=_JSON_HEADERS if body is not None else None,
                    timeout=timeout,
                    allow_redirects=False,
                )
            except requests.ConnectionError as exc:
                # A kept-alive connection the server closed while idle breaks on first use: that request goes again
                # once, on a fresh connection. A fresh connection breaking is the server's doing and stands.
                dropped = bool(exc.args) and isinstance(exc.args[0], urllib3.exceptions.ProtocolError)
                if reused and dropped and attempt == 0:
                    continue
                raise
            if resp.headers.get("Connection", "").lower() != "close":
                self.kept_alive.add(server)
            return resp.status_code, resp.content
        raise AssertionError("unreachable")

    def events(
        self,
        base_url: str,
        path: str,
        payload: Any,
        timeout: float,
        on_event: Callable[[dict], None] | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> list[dict]:
        """POST ``payload`` and read a server-sent event stream (sglang's ``stream: true`` on /generate and the
        OpenAI endpoints): every ``data: {json}`` event in order, up to ``data: [DONE]``. An event that is an error
        object ({"error": ...}, what sglang sends when a stream fails) raises ClientError, as does a stream that
        ends without [DONE] (the server dropped it). ``on_event(event)`` hears each event as it arrives;
        ``on_open()`` hears the stream's 2xx headers, before any event (the server has taken the request and is
        running its handler)."""
        url = _url(base_url, path)
        resp = self.session.post(
            url, data=json.dumps(payload).encode(), headers=_JSON_HEADERS, timeout=timeout, stream=True
        )
        with resp:
            if not 200 <= resp.status_code < 300:
                text = resp.content.decode("utf-8", errors="replace")
                raise ClientError(
                    f"POST {path} -> HTTP {resp.status_code}: {error_message(text)}", resp.status_code, text
                )
            if on_open is not None:
                on_open()
            out: list[dict] = []
            # chunk_size None: each HTTP chunk as it arrives (uvicorn sends one per event), so on_event hears an
            # event when the server sends it, not once 512 bytes have piled up
            for line in resp.iter_lines(chunk_size=None, decode_unicode=False):
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments
                data = line[5:].strip()
                if data == b"[DONE]":
                    return out
                try:
                    event = json.loads(data)
                except ValueError as exc:
                    raise ClientError(f"POST {path}: stream event {len(out)} is not JSON: {data[:200]!r}") from exc
                if isinstance(event, dict) and isinstance(event.get("error"), dict):
                    raise ClientError(f"POST {path}: stream event {len(out)}: {error_message(data.decode())}")
                out.append(event)
                if on_event is not None:
                    on_event(event)
        raise ClientError(f"POST {path}: the stream ended after {len(out)} events without data: [DONE]")

    def json(self, method: str, base_url: str, path: str, payload: Any = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
        status, data = self.send(method, base_url, path, payload, timeout)
        text = data.decode("utf-8", errors="replace")
        if not 200 <= status < 300:
            raise ClientError(f"{method} {path} -> HTTP {status}: {error_message(text)}", status, text)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ClientError(
                f"{method} {path} -> HTTP {status} with a non-JSON body: {text[:200]!r}", status, text
            ) from exc

    def close(self) -> None:
        self.session.close()
        self.kept_alive.clear()


_local = threading.local()


def thread_session() -> _ThreadSession:
    """This thread's session, created on first use."""
    ts = getattr(_local, "session", None)
    if ts is None:
        ts = _local.session = _ThreadSession()
    return ts


def close_thread_session() -> None:
    ts = getattr(_local, "session", None)
    if ts is not None:
        ts.close()
        del _local.session


def _transport_error(exc: BaseException) -> str:
    """``Type: message`` of a failed request, without urllib3's "Max retries exceeded" wrapper (none ran)."""
    inner = exc.args[0] if exc.args else None
    if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        return f"{type(exc).__name__}: {inner.reason}"
    return f"{type(exc).__name__}: {exc}"


def request(
    base_url: str, method: str, path: str, payload: Any = None, timeout: float = DEFAULT_TIMEOUT
) -> tuple[int, bytes]:
    """One request on this thread's keep-alive session: (status, body bytes). Transport errors and timeouts raise
    requests' exceptions, which are OSErrors."""
    return thread_session().send(method, base_url, path, payload, timeout)


def generate_payload(
    text: str | None = None,
    input_ids: list[int] | None = None,
    sampling_params: dict | None = None,
    return_logprob: bool = False,
    **extra,
) -> dict:
    if (text is None) == (input_ids is None):
        raise ValueError("give exactly one of text / input_ids")
    payload: dict = {"text": text} if text is not None else {"input_ids": list(input_ids)}
    payload["sampling_params"] = dict(sampling_params or {})
    if return_logprob:
        payload["return_logprob"] = True
    payload.update(extra)
    return payload


def generate(
    base_url: str,
    text: str | None = None,
    input_ids: list[int] | None = None,
    sampling_params: dict | None = None,
    return_logprob: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    **extra,
) -> dict:
    """POST /generate for one prompt; returns sglang's JSON (``text``, ``output_ids``, ``meta_info``).

    ``extra`` goes into the request body as is (e.g. ``rid=...``, ``logprob_start_len=...``).
    Raises ClientError on a non-2xx answer (message = sglang's error message).
    """
    payload = generate_payload(text, input_ids, sampling_params, return_logprob, **extra)
    return thread_session().json("POST", base_url, "/generate", payload, timeout)


def _get_json_with_fallback(base_url: str, path: str, old_path: str, timeout: float) -> dict:
    """GET ``path``, or ``old_path`` on releases that answer 404 for the new name."""
    session = thread_session()
    try:
        return session.json("GET", base_url, path, timeout=timeout)
    except ClientError as exc:
        if exc.status != 404:
            raise
    return session.json("GET", base_url, old_path, timeout=timeout)


def server_info(base_url: str, timeout: float = 60.0) -> dict:
    """GET /server_info (/get_server_info on older releases)."""
    return _get_json_with_fallback(base_url, *SERVER_INFO_PATHS, timeout)


def model_info(base_url: str, timeout: float = 60.0) -> dict:
    """GET /model_info (/get_model_info on older releases)."""
    return _get_json_with_fallback(base_url, "/model_info", "/get_model_info", timeout)


def flush_cache(base_url: str, timeout: float = 60.0) -> bool:
    """POST /flush_cache; False when sglang refused (requests running) or the server is unreachable."""
    try:
        status, _ = request(base_url, "POST", "/flush_cache", timeout=timeout)
    except OSError:  # requests' exceptions included
        return False
    return status == 200


def health(base_url: str, path: str = "/health_generate", timeout: float = 30.0) -> bool:
    try:
        status, _ = request(base_url, "GET", path, timeout=timeout)
    except OSError:  # requests' exceptions included
        return False
    return status == 200


# --- batch runner -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """A request of a batch that is not a plain POST /generate: another endpoint (the OpenAI-compatible
    ``/v1/completions``, ``/v1/chat/completions``) and/or a streamed answer. Its Result.response is

    * not streamed: the JSON answer; a list (/generate with ``n`` > 1 answers one object per sample) comes as
      {"outputs": [...]};
    * streamed: {"stream_events": [every event]} and, for /generate, the last event's fields too (sglang's last
      /generate event is the whole answer: cumulative ``output_ids``, ``text`` and the final ``meta_info``)."""

    path: str
    body: dict
    stream: bool = False


class AnswersItself(Protocol):
    """A batch item that sends its own requests (serving.abort.AbortMidBatch: a batch of its own, with an abort in
    it); modules above this one define them, so this one never imports them."""

    def answer(self, base_url: str, timeout: float) -> dict: ...


def _answer(session: _ThreadSession, base_url: str, item, default_path: str, timeout: float) -> dict:
    """One batch item's answer as a dict (see Call, AnswersItself)."""
    if callable(getattr(item, "answer", None)):
        return item.answer(base_url, timeout)
    if isinstance(item, Call) and item.stream:
        events = session.events(base_url, item.path, item.body, timeout)
        last = events[-1] if events and item.path == "/generate" and isinstance(events[-1], dict) else {}
        return {**last, "stream_events": events}
    path, body = (item.path, item.body) if isinstance(item, Call) else (default_path, item)
    resp = session.json("POST", base_url, path, body, timeout)
    if isinstance(resp, list) and isinstance(item, Call):
        return {"outputs": resp}
    if not isinstance(resp, dict):
        raise ClientError(f"unexpected {path} answer of type {type(resp).__name__}")
    return resp


@dataclass
class Result:
    """One request of a batch: the response or the error, and its latency."""

    index: int
    ok: bool
    latency_s: float
    response: dict | None = None
    error: str | None = None
    status: int | None = None
    started_s: float = 0.0  # relative to the batch start
    extra: dict = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        return self.response.get("text") if self.response else None

    @property
    def meta_info(self) -> dict:
        return (self.response or {}).get("meta_info") or {}

    @property
    def completion_tokens(self) -> int:
        v = self.meta_info.get("completion_tokens")
        return int(v) if isinstance(v, (int, float)) else 0


@dataclass
class BatchSummary:
    total: int
    ok: int
    errors: int
    wall_s: float
    completion_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_max_s: float | None
    spec_accept_length: float | None  # accept_length_from_meta over the answered requests
    first_errors: list[str]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _percentile(sorted_vals: list[float], q: float) -> float | None:
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def accept_length_from_meta(metas: Iterable[dict]) -> float | None:
    """Accepted tokens per verify step over requests, sglang's per-request ``spec_accept_length`` (completion tokens
    / spec_verify_ct, bonus token included) pooled: sum(completion_tokens) / sum(spec_verify_ct) over the requests
    that ran a verify step. A request without one (no speculative decoding, or done at prefill) has no accept length
    and adds nothing. None when no request ran a verify step.
    """
    verify = tokens = 0
    for meta in metas:
        ct = meta.get("spec_verify_ct")
        if isinstance(ct, (int, float)) and ct > 0:
            verify += int(ct)
            tokens += int(meta.get("completion_tokens") or 0)
    return round(tokens / verify, 4) if verify else None


def summarize(results: list[Result], wall_s: float) -> BatchSummary:
    ok = [r for r in results if r.ok]
    toks = sum(r.completion_tokens for r in ok)
    lat = sorted(r.latency_s for r in ok)
    return BatchSummary(
        total=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        wall_s=round(wall_s, 3),
        completion_tokens=toks,
        output_tokens_per_s=round(toks / wall_s, 2) if wall_s > 0 else 0.0,
        requests_per_s=round(len(results) / wall_s, 2) if wall_s > 0 else 0.0,
        latency_p50_s=_percentile(lat, 0.5),
        latency_p90_s=_percentile(lat, 0.9),
        latency_max_s=lat[-1] if lat else None,
        spec_accept_length=accept_length_from_meta(r.meta_info for r in ok),
        first_errors=[f"#{r.index}: {r.error}" for r in results if not r.ok][:5],
    )


def run_batch(
    base_url: str,
    requests: Iterable[Any],
    parallel: int = 128,
    progress: Callable[[int, int, Result], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    path: str = "/generate",
) -> list[Result]:
    """POST every payload in ``requests`` (bodies of /generate, see ``generate_payload``, a ``Call``: another
    endpoint, a streamed answer, or an item that answers itself: ``AnswersItself``) with ``parallel`` workers.

    Each worker thread has its own keep-alive session (one connection). A failing request (HTTP error, timeout,
    refused connection, bad JSON) becomes a Result with ok=False and its error; it never stops the batch. Results come
    back in input order. ``progress(done, total, result)`` is called after each request, serialized by a lock.
    """
    payloads = list(requests)
    total = len(payloads)
    results: list[Result | None] = [None] * total
    if total == 0:
        return []
    work: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(total):
        work.put(i)
    lock = threading.Lock()
    done = [0]
    t_batch = time.perf_counter()

    def worker() -> None:
        session = thread_session()
        try:
            while True:
                try:
                    i = work.get_nowait()
                except queue.Empty:
                    return
                t0 = time.perf_counter()
                try:
                    resp = _answer(session, base_url, payloads[i], path, timeout)
                    res = Result(i, True, time.perf_counter() - t0, response=resp, started_s=t0 - t_batch)
                except ClientError as exc:
                    res = Result(
                        i, False, time.perf_counter() - t0, error=str(exc), status=exc.status, started_s=t0 - t_batch
                    )
                except Exception as exc:  # transport errors, timeouts: recorded, the batch goes on
                    res = Result(
                        i, False, time.perf_counter() - t0, error=_transport_error(exc), started_s=t0 - t_batch
                    )
                results[i] = res
                if progress is not None:
                    with lock:
                        done[0] += 1
                        try:
                            progress(done[0], total, res)
                        except Exception:  # a broken progress printer must not kill the batch
                            pass
        finally:
            close_thread_session()

    # Plain daemon threads rather than a ThreadPoolExecutor: Ctrl-C must not wait at exit for requests in flight
    # (a GSM8K request may run for minutes), and an executor's threads are joined at interpreter exit.
    n = max(1, min(int(parallel), total))
    threads = [threading.Thread(target=worker, name=f"mtpmatrix-client-{k}", daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]  # every slot is filled: each index is taken exactly once
