"""Aborting a request while its batch decodes: POST /abort_request, and a batch item (``AbortMidBatch``) that sends
a victim beside its neighbours and aborts the victim mid-batch, for client.run_batch (an item that answers itself:
client.AnswersItself, so client never imports this module).

Event-driven: the neighbours go first and the victim once each of them has streamed a token (so the neighbours hold
the batch, whatever order the client's threads reach the server in: on a busy H200 box, 2026-12-05e, the victim of a
paged server got in first and finished alone, "a request finished first: [0, 81]"); the abort goes out when every
request has streamed an output token, or, where the item allows it (a paged pool that keeps the victim queued), the
neighbours have streamed past their prefill's while the victim has none, and none has finished (read from the
streams themselves), never after a fixed delay.

What the client reads can lag what the server did: a stream's events wait for its thread, and on a loaded box a whole
request (15 verify steps at topk 1) can finish before the client reads its first token (H200 2026-12-05e: the abort
went out at [79, 0] and both requests had finished in the server's log before the /abort_request line). So the item
records what tells afterwards (one host, one wall clock): when the abort went out, the victim's tokens then, and
sglang's own time of the victim's first event (meta_info response_sent_to_client_ts, 0.5.13-0.5.23, set once, on
the first event); ``finished_before_abort`` reads them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial

from mtpmatrix.serving.client import (
    DEFAULT_TIMEOUT,
    ClientError,
    close_thread_session,
    error_message,
    finish_type,
    request,
    thread_session,
)


def abort_request(base_url: str, rid: str, timeout: float = 60.0) -> None:
    """POST /abort_request for the request ``rid`` (http_server.py, 0.5.13-0.5.23: {"rid": ..., "abort_all":
    false}, answered 200 whether or not the rid is still running); ClientError on any other answer."""
    status, data = request(base_url, "POST", "/abort_request", {"rid": rid}, timeout)
    if status != 200:
        text = data.decode("utf-8", errors="replace")
        raise ClientError(f"POST /abort_request -> HTTP {status}: {error_message(text)}", status, text)


@dataclass(frozen=True)
class AbortMidBatch:
    """A batch item that is a batch of its own: the /generate bodies ``neighbours`` and then ``victim`` (which names
    its ``rid``), streamed, and /abort_request for the victim once every one of them has streamed at least one output
    token and none has finished, i.e. while they decode in one batch; with ``victim_may_queue`` (a pool that holds the
    victim in the queue: the topk 3 paged server, H200 2026-12-05, "a request finished first: [81, 0]") also once the
    neighbours have decoded past their first token while the victim has none. Such an abort may reach sglang before
    the victim's request did (an unknown rid: answered 200, nothing done); it is sent once, never again, so that an
    abort sglang ignored is not hidden by a second one that stopped it (0.5.13 and 0.5.17 act on every abort sent).

    Its Result.response is {"outputs": [each neighbour's answer..., the victim's answer], "aborted_mid_batch": bool,
    "abort_note": str, "abort_sent_at": [the abort's wall-clock seconds] or [], "victim_tokens_at_abort": int or
    None, "victim_first_event_ts": sglang's response_sent_to_client_ts of the victim's first event or None}, each
    answer the stream's last event (the whole answer, as a streamed Call's); aborted_mid_batch is false (and the note
    says why) when a request finished before the abort could be sent mid-batch, so nothing was tested.

    A request aborted in sglang's waiting queue (retracted, or not yet admitted) is answered by the tokenizer, not
    the scheduler (tokenizer_manager._handle_abort_req): on 0.5.13 and 0.5.17 a streamed answer's output_ids then
    hold only its last token while completion_tokens counts them all. The victim's answer, aborted so, has its
    output_ids rebuilt from the stream (every earlier event carries the whole output so far, and a queued request
    makes no token), marked "output_ids_from_stream"."""

    neighbours: tuple[dict, ...]
    victim: dict
    victim_may_queue: bool = False

    @property
    def body(self) -> dict:
        """The victim's body (what surface.Exchange reads a request's sampling parameters from)."""
        return self.victim

    def answer(self, base_url: str, timeout: float) -> dict:
        """client.AnswersItself: client.run_batch sends this item through ``run``."""
        return run(base_url, self, timeout)


def _tokens_so_far(event: dict) -> int:
    meta = event.get("meta_info") or {}
    n = meta.get("completion_tokens")
    return int(n) if isinstance(n, int) else len(event.get("output_ids") or [])


def _abort_now(latest: list[dict], victim_may_queue: bool = False, victim_open: bool = False) -> bool:
    """Whether the abort is due, from the streams' latest events (the victim's last): every request has streamed a
    token (all decoding together), or, where the victim may be queued, its stream is open (sglang took the request:
    the narrowest sign short of a token that it knows the rid) and every neighbour has streamed more than its
    prefill's token while the victim has none (it waits in the queue: aborted there). Never without a neighbour:
    nothing would be beside it."""
    tokens = [_tokens_so_far(e) for e in latest]
    *neighbours, victim = tokens
    queued = victim_may_queue and victim_open and all(n >= 2 for n in neighbours)
    return bool(neighbours) and all(n >= 1 for n in neighbours) and (victim >= 1 or queued)


def _finished(event: dict) -> bool:
    return bool((event.get("meta_info") or {}).get("finish_reason"))


def _whole(answer: dict, streamed: list) -> dict:
    """The victim's last event, its output_ids rebuilt from ``streamed`` where sglang's abort answer sent fewer than
    its completion_tokens (see AbortMidBatch); any other answer as it came (a neighbour's short answer is its own
    finding, never repaired)."""
    ids = answer.get("output_ids") or []
    meta = answer.get("meta_info") or {}
    count = meta.get("completion_tokens")
    if (
        finish_type(meta) == "abort"
        and isinstance(count, int)
        and len(ids) < count == len(streamed)
        and streamed[-len(ids) :] == ids
    ):
        return {**answer, "output_ids": list(streamed), "output_ids_from_stream": True}
    return answer


def _seconds(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def finished_before_abort(response: dict) -> str:
    """Why the victim provably finished before the first abort was sent, from the clocks ``run`` records ("" when
    they do not show it): sglang sent the victim's first event at response_sent_to_client_ts (wall clock) and
    finished it e2e_latency seconds after creating it, which was before that event, so it was done by their sum; an
    abort sent at or after that time found nothing to stop."""
    outputs = response.get("outputs") or [{}]
    victim = outputs[-1] if isinstance(outputs[-1], dict) else {}
    first = _seconds(response.get("victim_first_event_ts"))
    e2e = _seconds((victim.get("meta_info") or {}).get("e2e_latency"))
    sent = _seconds((response.get("abort_sent_at") or [None])[0])
    if first is None or e2e is None or sent is None or first + e2e > sent:
        return ""
    return (
        f"sglang had finished it by {first + e2e:.3f} (first event sent at {first:.3f}, e2e_latency {e2e:.3f} s), "
        f"the abort went out at {sent:.3f}"
    )


class _Streams:
    """The item's streams as the client has read them so far, under one condition every event notifies."""

    def __init__(self, base_url: str, bodies: list[dict], timeout: float):
        self.base_url, self.bodies, self.timeout = base_url, bodies, timeout
        self.deadline = time.monotonic() + timeout  # one for every wait and join of the item
        self.victim = len(bodies) - 1
        self.latest: list[dict] = [{} for _ in bodies]
        self.longest: list[list] = [[] for _ in bodies]  # the most output ids any event of each stream carried
        self.answers: list[dict | BaseException | None] = [None] * len(bodies)
        self.first_ts: float | None = None  # sglang's wall clock at the victim's first event
        self.victim_open = False  # the victim's stream answered 2xx headers
        self.changed = threading.Condition()
        self.threads = [threading.Thread(target=self._stream, args=(i,), daemon=True) for i in range(len(bodies))]

    def _hear(self, i: int, event: dict) -> None:
        with self.changed:
            self.latest[i] = event
            ids = event.get("output_ids") or []
            if len(ids) > len(self.longest[i]):
                self.longest[i] = list(ids)
            ts = _seconds((event.get("meta_info") or {}).get("response_sent_to_client_ts"))
            if i == self.victim and self.first_ts is None and ts is not None:
                self.first_ts = ts
            self.changed.notify_all()

    def _opened(self) -> None:
        with self.changed:
            self.victim_open = True
            self.changed.notify_all()

    def _stream(self, i: int) -> None:
        try:
            body = {**self.bodies[i], "stream": True}
            opened = self._opened if i == self.victim else None
            events = thread_session().events(
                self.base_url, "/generate", body, self.timeout, partial(self._hear, i), on_open=opened
            )
            last = {**(events[-1] if events else {}), "stream_events": len(events)}
            self.answers[i] = _whole(last, self.longest[i]) if i == self.victim else last
        except BaseException as exc:  # kept: the caller raises the first
            self.answers[i] = exc
        finally:
            close_thread_session()
            with self.changed:
                self.changed.notify_all()

    def over(self) -> bool:
        """Whether a request has finished or failed (no abort is mid-batch after that)."""
        return any(a is not None for a in self.answers) or any(_finished(e) for e in self.latest)

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait(self, ready) -> bool:
        with self.changed:
            return self.changed.wait_for(ready, timeout=self.left())

    def join(self) -> None:
        for t in self.threads:
            if t.ident is not None:  # started
                t.join(self.left())


def run(base_url: str, item: AbortMidBatch, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Send ``item`` (see AbortMidBatch) and wait for every answer."""
    rid = item.victim.get("rid")
    if not rid:
        raise ClientError("AbortMidBatch: the victim names no rid to abort")
    s = _Streams(base_url, [*item.neighbours, item.victim], timeout)
    sent: list[float] = []
    try:
        for t in s.threads[: s.victim]:
            t.start()
        # the neighbours first: each admitted (a token out) before the victim is sent
        admitted = s.wait(lambda: s.over() or all(_tokens_so_far(e) >= 1 for e in s.latest[: s.victim]))
        if not admitted or s.over():
            s.answers[s.victim] = {"meta_info": {}, "not_sent": "its neighbours had no token or had ended"}
            seen, mid = [_tokens_so_far(e) for e in s.latest], False
        else:
            s.threads[s.victim].start()
            # every request decoding (a token out, none finished), or the neighbours past their first decode step
            # while the victim waits (a pool that cannot hold both: sglang keeps it queued), or one done / failed
            s.wait(lambda: s.over() or _abort_now(s.latest, item.victim_may_queue, s.victim_open))
            with s.changed:
                mid = not s.over() and _abort_now(s.latest, item.victim_may_queue, s.victim_open)
                seen = [_tokens_so_far(e) for e in s.latest]
            if mid:
                sent.append(time.time())  # before the request: sglang cannot have acted on it earlier
                abort_request(base_url, rid)
    finally:
        s.join()
    failed = [a for a in s.answers if not isinstance(a, dict)]
    if failed:
        raise failed[0] if isinstance(failed[0], BaseException) else ClientError("AbortMidBatch: a stream hung")
    note = f"tokens streamed when the abort was sent: {seen}" if mid else f"a request finished first: {seen}"
    return {
        "outputs": s.answers,
        "aborted_mid_batch": mid,
        "abort_note": note,
        "abort_sent_at": sent,
        "victim_first_event_ts": s.first_ts,
        "victim_tokens_at_abort": seen[s.victim] if mid else None,
    }
