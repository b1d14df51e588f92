"""Aborting a request while its batch decodes: POST /abort_request, and a batch item (``AbortMidBatch``) that sends
a victim and its neighbours together and aborts the victim mid-batch, for client.run_batch (an item that answers
itself: client.AnswersItself, so client never imports this module).

Event-driven: the abort goes out when every request has streamed an output token, or the neighbours have streamed
past their prefill's while the victim has none (queued), and none has finished (read from the streams themselves),
never after a fixed delay.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

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
    """A batch item that is a batch of its own: the /generate bodies ``neighbours`` and ``victim`` (which names its
    ``rid``) sent together, streamed, and /abort_request for the victim once every one of them has streamed at least
    one output token and none has finished, i.e. while they decode in one batch, or once the neighbours have decoded
    past their first token while the victim has none (the pool holds it in the queue: measured on the topk 3 paged
    server, H200 2026-12-05, "a request finished first: [81, 0]"). Its Result.response is
    {"outputs": [each neighbour's answer..., the victim's answer], "aborted_mid_batch": bool, "abort_note": str},
    each answer the stream's last event (the whole answer, as a streamed Call's); aborted_mid_batch is false (and the
    note says why) when a request finished before the abort could be sent mid-batch, so nothing was tested.

    A request aborted in sglang's waiting queue (retracted, or not yet admitted) is answered by the tokenizer, not
    the scheduler (tokenizer_manager._handle_abort_req): on 0.5.13 and 0.5.17 a streamed answer's output_ids then
    hold only its last token while completion_tokens counts them all. The victim's answer, aborted so, has its
    output_ids rebuilt from the stream (every earlier event carries the whole output so far, and a queued request makes no token), marked
    "output_ids_from_stream"."""

    neighbours: tuple[dict, ...]
    victim: dict

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


def _abort_now(latest: list[dict]) -> bool:
    """Whether the abort is due, from the streams' latest events (the victim's last): every request has streamed a
    token (all decoding together), or every neighbour has streamed more than its prefill's token while the victim
    has none (it waits in the queue: aborted there). Never without a neighbour: nothing would be beside it."""
    tokens = [_tokens_so_far(e) for e in latest]
    *neighbours, victim = tokens
    return bool(neighbours) and all(n >= 1 for n in neighbours) and (victim >= 1 or all(n >= 2 for n in neighbours))


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


def run(base_url: str, item: AbortMidBatch, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Send ``item`` (see AbortMidBatch) and wait for every answer."""
    bodies = [*item.neighbours, item.victim]
    rid = item.victim.get("rid")
    if not rid:
        raise ClientError("AbortMidBatch: the victim names no rid to abort")
    latest: list[dict] = [{} for _ in bodies]
    longest: list[list] = [[] for _ in bodies]  # the most output ids any event of each stream carried
    answers: list[dict | BaseException | None] = [None] * len(bodies)
    changed = threading.Condition()

    def stream(i: int) -> None:
        def hear(event: dict) -> None:
            with changed:
                latest[i] = event
                ids = event.get("output_ids") or []
                if len(ids) > len(longest[i]):
                    longest[i] = list(ids)
                changed.notify_all()

        try:
            events = thread_session().events(base_url, "/generate", {**bodies[i], "stream": True}, timeout, hear)
            last = {**(events[-1] if events else {}), "stream_events": len(events)}
            answers[i] = _whole(last, longest[i]) if i == len(bodies) - 1 else last
        except BaseException as exc:  # kept: the caller raises the first
            answers[i] = exc
        finally:
            close_thread_session()
            with changed:
                changed.notify_all()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    with changed:
        # every request decoding (a token out, none finished), or the neighbours past their first decode step while
        # the victim waits (a pool that cannot hold both: sglang keeps it queued), or one of them done / failed
        changed.wait_for(
            lambda: any(a is not None for a in answers) or any(_finished(e) for e in latest) or _abort_now(latest),
            timeout=timeout,
        )
        mid = all(a is None for a in answers) and not any(_finished(e) for e in latest) and _abort_now(latest)
        seen = [_tokens_so_far(e) for e in latest]
    if mid:
        abort_request(base_url, rid)
    for t in threads:
        t.join(timeout)
    failed = [a for a in answers if not isinstance(a, dict)]
    if failed:
        raise failed[0] if isinstance(failed[0], BaseException) else ClientError("AbortMidBatch: a stream hung")
    note = f"tokens streamed when the abort was sent: {seen}" if mid else f"a request finished first: {seen}"
    return {"outputs": answers, "aborted_mid_batch": mid, "abort_note": note}
