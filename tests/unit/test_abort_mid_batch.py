"""serving.abort's order of events against scripted streams (no server): the neighbours are admitted before the
victim is sent, an abort the victim's request may have outrun is sent again at its first token, and the clocks
recorded tell a victim that finished before the abort went out from one that ignored it."""

from __future__ import annotations

import threading

import pytest

from mtpmatrix.serving import abort
from mtpmatrix.tiers import surface
from mtpmatrix.tiers.surface import long_context

HOLD_S = 30.0  # only a broken run() waits this long: every scripted wait ends on an event first


class Scripted:
    """Streams as a session's ``events`` would deliver them; ``victim`` scripts the victim's life."""

    def __init__(self, victim: str):
        self.victim = victim
        self.cond = threading.Condition()
        self.aborts: list[str] = []
        self.neighbour_tokens = 0
        self.neighbour_tokens_at_victim = None
        self.victim_known = False  # sglang holds the rid (an abort before this is a no-op)

    def events(self, base_url, path, payload, timeout, hear):
        rid = payload.get("rid")
        return self._victim(hear) if rid else self._neighbour(hear)

    def _event(self, n: int, finish: dict | None = None, **meta) -> dict:
        return {"output_ids": list(range(n)), "meta_info": {"completion_tokens": n, "finish_reason": finish, **meta}}

    def _neighbour(self, hear):
        with self.cond:  # a neighbour slow to its first token: a victim sent beside it arrives first
            self.cond.wait_for(lambda: self.neighbour_tokens_at_victim is not None, timeout=1.0)
        out = []
        for n in (1, 2):
            with self.cond:
                self.neighbour_tokens = n
                self.cond.notify_all()
            out.append(self._event(n))
            hear(out[-1])
        with self.cond:
            self.cond.wait_for(lambda: self.aborts, timeout=HOLD_S)
        out.append(self._event(3, {"type": "length", "length": 3}))
        hear(out[-1])
        return out

    def _victim(self, hear):
        with self.cond:
            self.neighbour_tokens_at_victim = self.neighbour_tokens
            self.cond.notify_all()
            if self.victim == "late":  # its request reaches sglang only after the first abort went out
                self.cond.wait_for(lambda: self.aborts, timeout=HOLD_S)
            if self.victim == "slow":  # its first token read late: after its neighbour's second, and after any abort
                self.cond.wait_for(lambda: self.neighbour_tokens >= 2, timeout=HOLD_S)
                self.cond.wait_for(lambda: self.aborts, timeout=1.0)
            self.victim_known = True
            heard_before = len(self.aborts)
        out = [self._event(1, response_sent_to_client_ts=100.0)]
        hear(out[-1])
        with self.cond:
            stopped = self.cond.wait_for(
                lambda: len(self.aborts) > heard_before, timeout=HOLD_S if self.victim == "late" else 2.0
            )
        out.append(self._event(2, {"type": "abort"} if stopped else {"type": "length", "length": 2}, e2e_latency=0.5))
        hear(out[-1])
        return out

    def abort(self, base_url, rid):
        with self.cond:
            self.aborts.append(rid)
            self.cond.notify_all()


@pytest.fixture
def scripted(monkeypatch):
    def make(victim: str) -> Scripted:
        s = Scripted(victim)
        monkeypatch.setattr(abort, "thread_session", lambda: s)
        monkeypatch.setattr(abort, "close_thread_session", lambda: None)
        monkeypatch.setattr(abort, "abort_request", s.abort)
        return s

    return make


def _item(victim_may_queue: bool = False) -> abort.AbortMidBatch:
    return abort.AbortMidBatch(({"input_ids": [1]},), {"input_ids": [2], "rid": "v"}, victim_may_queue)


def test_the_victim_is_sent_once_its_neighbours_have_a_token(scripted):
    # H200 2026-12-05e: sent together, the victim of a paged server got in first and finished alone ([0, 81])
    s = scripted("running")
    got = abort.run("http://stub", _item())
    assert s.neighbour_tokens_at_victim >= 1
    assert got["aborted_mid_batch"] and got["outputs"][-1]["meta_info"]["finish_reason"] == {"type": "abort"}
    assert len(got["abort_sent_at"]) == 1 and got["victim_first_event_ts"] == 100.0


def test_an_abort_the_victims_request_outran_is_sent_again(scripted):
    s = scripted("late")
    got = abort.run("http://stub", _item(victim_may_queue=True))
    assert s.aborts == ["v", "v"] and len(got["abort_sent_at"]) == 2
    assert (
        got["abort_note"] == "tokens streamed when the abort was sent: [2, 0] (sent again at the victim's first token)"
    )
    assert got["outputs"][-1]["meta_info"]["finish_reason"] == {"type": "abort"}


def test_an_unpaged_victim_is_not_aborted_before_its_first_token(scripted):
    # without victim_may_queue the [2, 0] of a lagging client is no reason to abort (H200 2026-12-05e: [79, 0] on the
    # unpaged topk 1 server, whose log had both decoding together): it waits for the victim's token
    scripted("slow")
    got = abort.run("http://stub", _item())
    assert got["abort_note"] == "tokens streamed when the abort was sent: [2, 1]"
    assert got["outputs"][-1]["meta_info"]["finish_reason"] == {"type": "abort"}


def _late_victim(sent_at: float) -> surface.Exchange:
    spec = next(s for s in long_context_specs() if s.topk == 1)
    item = dict(long_context.requests(spec, 512))["abort"]
    want = long_context.limit_new(1, long_context.PROMPT)
    outputs = [
        {"output_ids": long_context.expected(b["input_ids"], want), "meta_info": {"finish_reason": {"type": "length"}}}
        for b in (*item.neighbours, item.victim)
    ]
    outputs[-1]["meta_info"]["e2e_latency"] = 1.25
    response = {
        "outputs": outputs,
        "aborted_mid_batch": True,
        "abort_note": "tokens streamed when the abort was sent: [79, 0]",
        "abort_sent_at": [sent_at],
        "victim_first_event_ts": 1000.0,
    }
    return surface.Exchange("abort", item, response)


def long_context_specs():
    from long_runs import SPECS

    return list(SPECS.values())


def test_a_victim_done_before_the_abort_went_out_tested_nothing():
    # the H200 2026-12-05e case: both requests finished in the server's log before its /abort_request line, the client
    # having read [79, 0]; the victim came back "length", whole
    want = long_context.limit_new(1, long_context.PROMPT)
    got = long_context.abort_problems(_late_victim(1001.5), want, 1)
    assert len(got) == 1 and got[0].startswith("abort: the victim ran to its end before the abort was sent")
    assert "nothing was tested" in got[0] and "finished it by 1001.250" in got[0]


def test_a_victim_running_when_the_abort_went_out_that_ran_on_ignored_it():
    want = long_context.limit_new(1, long_context.PROMPT)
    got = long_context.abort_problems(_late_victim(1001.0), want, 1)
    assert "abort victim: finish_reason {'type': 'length'}, wanted abort" in got
    assert any("the abort did not stop it" in p for p in got)
    # no clocks (a server that sends no response_sent_to_client_ts): no proof, so it ignored the abort
    x = _late_victim(1001.5)
    bare = surface.Exchange("abort", x.payload, {**x.response, "victim_first_event_ts": None})
    assert any("the abort did not stop it" in p for p in long_context.abort_problems(bare, want, 1))
