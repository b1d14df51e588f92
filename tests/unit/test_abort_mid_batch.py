"""serving.abort's order of events against scripted streams (no server): the neighbours are admitted before the
victim is sent, one abort is sent (never a second that could hide an ignored first), and what is recorded (the
abort's time, the victim's tokens then, sglang's time of the victim's first event) tells a victim that finished
before the abort went out, or may not have been known to sglang yet, from one that ignored it."""

from __future__ import annotations

import threading
import time

import pytest
from long_runs import SPECS

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
        self.abort_times: list[float] = []
        self.opened = False  # the victim's stream has its headers
        self.opened_at_abort: list[bool] = []

    def events(self, base_url, path, payload, timeout, hear, on_open=None):
        rid = payload.get("rid")
        if not rid and self.victim == "neighbour-fails":
            raise ConnectionError("neighbour dropped")
        return self._victim(hear, on_open) if rid else self._neighbour(hear)

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
            out.append(self._event(n, response_sent_to_client_ts=50.0) if n == 1 else self._event(n))
            hear(out[-1])
        with self.cond:
            self.cond.wait_for(lambda: self.aborts, timeout=HOLD_S)
        out.append(self._event(3, {"type": "length", "length": 3}))
        hear(out[-1])
        return out

    def _victim(self, hear, on_open):
        with self.cond:
            self.neighbour_tokens_at_victim = self.neighbour_tokens
            self.cond.notify_all()
            if self.victim == "slow-open":  # its headers come late: after its neighbour's second token, or an abort
                self.cond.wait_for(lambda: self.neighbour_tokens >= 2, timeout=HOLD_S)
                self.cond.wait_for(lambda: self.aborts, timeout=1.0)
        if on_open is not None:  # (a run() that predates on_open passes none)
            on_open()
        with self.cond:
            self.opened = True
            if self.victim == "slow-open":  # queued: no token until the abort ends it there
                self.cond.wait_for(lambda: self.aborts, timeout=HOLD_S)
            if self.victim == "late":  # taken (headers) but not yet known to sglang when the abort came: a no-op there
                self.cond.wait_for(lambda: self.aborts, timeout=HOLD_S)
            if self.victim == "slow":  # its first token read late: after its neighbour's second, and after any abort
                self.cond.wait_for(lambda: self.neighbour_tokens >= 2, timeout=HOLD_S)
                self.cond.wait_for(lambda: self.aborts, timeout=1.0)
            heard_before = len(self.aborts)
        if self.victim == "slow-open":
            out = [self._event(0, {"type": "abort", "message": "Abort in waiting queue"})]
            hear(out[0])
            return out
        out = [self._event(1, response_sent_to_client_ts=100.0)]
        hear(out[-1])
        with self.cond:
            # a second abort would stop the late victim: the first fix's run() sent one at its first token
            stopped = self.cond.wait_for(
                lambda: len(self.aborts) > heard_before, timeout=HOLD_S if self.victim != "late" else 1.0
            )
        out.append(self._event(2, {"type": "abort"} if stopped else {"type": "length", "length": 2}, e2e_latency=0.5))
        hear(out[-1])
        return out

    def abort(self, base_url, rid):
        with self.cond:
            self.abort_times.append(time.time())
            self.opened_at_abort.append(self.opened)
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
    assert got["victim_tokens_at_abort"] == 1
    # the victim's own first-event time, not its neighbour's (50.0): the bound is on the victim's life
    assert got["victim_first_event_ts"] == 100.0
    # taken before the request: sglang cannot have acted on the abort before that time
    assert len(got["abort_sent_at"]) == 1 and got["abort_sent_at"][0] <= s.abort_times[0]


def test_an_abort_before_the_victims_first_token_is_sent_once(scripted):
    # a second abort at its first token would stop a victim whose first abort sglang ignored (0.5.13 and 0.5.17 act
    # on every abort sent): the one abort went out at [2, 0] and the victim, unknown to sglang then, ran on
    s = scripted("late")
    got = abort.run("http://stub", _item(victim_may_queue=True))
    assert s.aborts == ["v"] and got["victim_tokens_at_abort"] == 0
    assert got["abort_note"] == "tokens streamed when the abort was sent: [2, 0]"
    assert got["outputs"][-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_a_queued_victim_is_aborted_only_once_its_stream_is_open(scripted):
    # an abort before sglang took the victim's request finds an unknown rid (answered 200, nothing done): the queued
    # branch waits for the victim's headers, the narrowest sign short of a token that sglang has it
    s = scripted("slow-open")
    got = abort.run("http://stub", _item(victim_may_queue=True))
    assert s.opened_at_abort == [True], s.opened_at_abort
    assert got["abort_note"] == "tokens streamed when the abort was sent: [2, 0]"


def test_an_unpaged_victim_is_not_aborted_before_its_first_token(scripted):
    # without victim_may_queue the [2, 0] of a lagging client is no reason to abort (H200 2026-12-05e: [79, 0] on the
    # unpaged topk 1 server, whose log had both decoding together): it waits for the victim's token
    scripted("slow")
    got = abort.run("http://stub", _item())
    assert got["abort_note"] == "tokens streamed when the abort was sent: [2, 1]"
    assert got["outputs"][-1]["meta_info"]["finish_reason"] == {"type": "abort"}


def test_a_neighbour_that_fails_sends_no_victim(scripted):
    s = scripted("neighbour-fails")
    with pytest.raises(ConnectionError):
        abort.run("http://stub", _item())
    assert s.neighbour_tokens_at_victim is None and s.aborts == []


def _late_victim(sent_at: float) -> surface.Exchange:
    spec = next(s for s in SPECS.values() if s.topk == 1)
    item = dict(long_context.requests(spec, 512))["abort"]
    want = long_context.limit_new(1, long_context.PROMPT)
    outputs = [
        {
            "output_ids": long_context.expected(b["input_ids"], want),
            "meta_info": {"finish_reason": {"type": "length", "length": want}, "completion_tokens": want},
        }
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
    assert "abort victim: finish_reason {'type': 'length', 'length': 90}, wanted abort" in got
    assert any("the abort did not stop it" in p for p in got)
    # no clocks (a server that sends no response_sent_to_client_ts): no proof, so it ignored the abort
    x = _late_victim(1001.5)
    bare = surface.Exchange("abort", x.payload, {**x.response, "victim_first_event_ts": None})
    assert any("the abort did not stop it" in p for p in long_context.abort_problems(bare, want, 1))


def test_a_late_victims_neighbour_off_the_rule_is_still_a_mismatch():
    want = long_context.limit_new(1, long_context.PROMPT)
    x = _late_victim(1001.5)
    neighbour = x.response["outputs"][0]
    ids = list(neighbour["output_ids"])
    ids[5] = (ids[5] + 1) % 512
    bad = {**x.response, "outputs": [{**neighbour, "output_ids": ids}, *x.response["outputs"][1:]]}
    got = long_context.abort_problems(surface.Exchange("abort", x.payload, bad), want, 1)
    assert got == [
        f"abort neighbour 0: token 5 is {ids[5]}, the long witness's rule gives {neighbour['output_ids'][5]}"
    ]


def test_a_victim_the_abort_ended_is_judged_as_aborted_whatever_the_clocks():
    want = long_context.limit_new(1, long_context.PROMPT)
    x = _late_victim(1001.5)
    victim = x.response["outputs"][-1]
    cut = {
        "output_ids": victim["output_ids"][:7],
        "meta_info": {**victim["meta_info"], "finish_reason": {"type": "abort"}},
    }
    ended = {**x.response, "outputs": [*x.response["outputs"][:-1], cut]}
    assert long_context.abort_problems(surface.Exchange("abort", x.payload, ended), want, 1) == []


def test_a_victim_aborted_before_its_first_token_that_ran_on_tested_nothing():
    # the queued branch's one abort may reach sglang before the victim's request: no clocks prove it late, but a
    # victim with no token at the abort may have been unknown to sglang (answered 200, nothing done)
    want = long_context.limit_new(1, long_context.PROMPT)
    x = _late_victim(999.0)  # the clocks prove nothing: the abort went out before the victim's first event
    queued = {
        **x.response,
        "victim_tokens_at_abort": 0,
        "abort_note": "tokens streamed when the abort was sent: [2, 0]",
    }
    got = long_context.abort_problems(surface.Exchange("abort", x.payload, queued), want, 1)
    assert len(got) == 1 and "before the victim had streamed a token" in got[0] and "nothing was tested" in got[0]
    # with a token at the abort, sglang knew it: running on is ignoring the abort
    known = {**queued, "victim_tokens_at_abort": 1}
    got = long_context.abort_problems(surface.Exchange("abort", x.payload, known), want, 1)
    assert any("the abort did not stop it" in p for p in got)
