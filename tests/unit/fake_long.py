"""Answers of the fake sglang (fake_sglang.FakeState.shapes) for the long-and-tight servers: the long witness's rule
output (mtpmatrix.pairs.long_witness), sglang's length limits (tokenizer reservation, scheduler clamp), a radix
cache of earlier sequences counted in pages, streams that go event by event and hear /abort_request. Unit tests
only. ``broken`` names one fault, so a test sees a check fail on it:

  cached-zero         the repeat of a shared prefix reports cached_tokens 0 (no radix hit)
  one-short           every to-the-limit request ends one token short (still "length")
  neighbour-changed   after an abort, the neighbours still decoding go on with a wrong token
  abort-ignored       the victim runs on to the limit and ends "length"
  over-limit-taken    a request over the limit is answered, not refused

and one per long-context mutant of the catalogue (mtpmatrix.faults.catalogue.long_context) that changes answers, as
that mutant makes an MTP server answer:

  root-reads-short    (swa-verify-window-short) every token after the prefill one is the verify root's, which
                      cannot see its window's far edge: the sliding owner reads offset 51 instead of 63 (the next
                      highest designed score inside; docs/pairs.md "Long witness", window one narrower), the drafts
                      (the rule's tokens) are rejected, so each verify step commits that one token
  reserve-dropped     (spec-context-reserve-dropped) the tokenizer admits as if no draft slots were reserved
  view-drops-cached   (frozen-kv-view-drops-cached) the drafter's frozen-KV view of a request with a radix hit
                      leaves out its cached prefix, so it reads the wrong positions: every draft of that request
                      is rejected, its output unchanged

and drafter-side faults that change no output, only the per-request speculative counters (the long witness's drafter
is exact, so intact every verify step accepts all NUM_STEPS drafts: long_context.predicted_counters):

  first-round-lost    the first draft round after each prefill (every long prompt is chunked: > LONG_CHUNK) is
                      rejected whole, as with draft positions computed from the last chunk's extend length
  one-draft-lost      the first round after each prefill loses its last draft only (one accepted draft fewer)

and what intact sglang's no-MTP server does on the Triton backend (not a fault of the catalogue: measured on an H200,
0.5.17, 2026-12-05; known upstream sglang-triton-swa-decode-window-one-short):

  decode-one-short    (no MTP) the prefill's token is the rule's; every decode token reads through a window one key
                      short (long_witness.predicted_next with visible_max sliding_window - 2: offset 51)
  tree-by-index       (topk > 1) each verify step keeps the root's and its top child's tokens (the rule's: two
                      drafts accepted) and a bonus read through a short window (the depth-2 node's index is past its
                      depth); sglang 0.5.17's Triton extend kernel, measured on the topk 3 paged server the same day

and what intact sglang 0.5.13 does (measured on an H200, 2026-12-05; known upstream
sglang-0513-gemma4-swa-extend-window-one-wide: its Gemma 4 layers pass config.sliding_window where the Triton
backend's buffers hold sliding_window - 1):

  extend-one-wide     the prefill's token reads one key wide (the trap, 64 back); no MTP: every decode token one key
                      short; MTP: each verify step's root reads the edge (its draft kept) and every node below it one
                      key wide, the step keeping drafts while the two reads agree (as at topk 1; the fake verifies
                      topk 3 the same way, one of the trees 0.5.13 may serve)

``retract_after`` (not a fault) retracts every request once after that many verify steps: the re-prefill
of prompt + output yields one token without a verify step, as sglang's does (meta_info num_retractions 1).

(spec-overalloc-tail-kept changes no answer: sglang's idle leak check kills the server, test_long_pool_* reads it.)

The streams of an AbortMidBatch hold after their first token until the abort arrives (an event, with a long
timeout that only a broken client meets), or until a stream waits for the pool (then the others run on, as
sglang's decode does): the client sees every admitted request decoding, then aborts.

Admission, as sglang's PrefillAdder does it for these requests (schedule_policy.add_one_req, 0.5.13-0.5.23: a
request waits while input + max_new_tokens + page >= the pool left after what the running requests hold and may
still write; ignore_eos requests are counted at ratio 1.0 on 0.5.23, 0.7 decaying on 0.5.13/0.5.17, the same
verdict here): a stream gets its first token only once ceil_page(input) + max_new + page, summed over the streams
running with it, stays under LONG_POOL_TOKENS. Two 160-token requests to the limit fit (2 x 255 < 640), a third
does not, so a third stream waits until one finishes.

``victim_waits``: the abort victim is never admitted beside its neighbour (the topk 3 paged server on the H200,
2026-12-05: "a request finished first: [81, 0]"); the neighbour holds after its first decode step until the abort.

``queued_victim``: the abort victim is retracted after its second token and the abort finds it in the waiting
queue, as on the 16-page topk 3 server under sglang's spec-v2 worker (0.5.17, 0.5.23: each request's decode reserve
of 2 x 96 slots, allocation_sizing.get_alloc_reserve_per_decode, leaves no room for two 160-token requests to
decode together, so the later one is retracted at its first decode). sglang then answers the stream with its
waiting-queue abort (tokenizer_manager._handle_abort_req): output_ids only the last token, completion_tokens the
whole count, no num_retractions and no speculative counters, finish_reason message "Abort in waiting queue".
"""

from __future__ import annotations

import threading

from mtpmatrix.core import settings, smoke_servers
from mtpmatrix.pairs import long_witness
from mtpmatrix.tiers.surface import long_context

HOLD_S = 60.0
ROOT_SHORT_READ = 51  # the sliding owner's read with the edge (63 back) out of reach (docs/pairs.md, long witness)


TREE_KEPT = 2  # tree-by-index: drafts a verify step accepts before the node read short


class LongWitnessShapes:
    def __init__(
        self,
        topk: int | None,
        page: int = 1,
        broken: str = "",
        retract_after: int | None = None,
        queued_victim: bool = False,
        victim_waits: bool = False,
    ):
        self.topk, self.page, self.broken, self.retract_after = topk, page, broken, retract_after
        self.queued_victim = queued_victim
        self.victim_waits = victim_waits
        self.pool = threading.Condition()
        self.running: dict[int, int] = {}  # stream id -> the pool it holds at admission (ceil_page(input) + new + page)
        self.waiting = 0
        self.done = 0  # streams finished: once one has, the client sends no abort mid-batch
        self.seen: list[list[int]] = []  # every finished sequence (prompt + output): the radix tree
        self.lock = threading.Lock()
        self.aborted: set[str] = set()
        self.abort_heard = threading.Event()
        self.streams = 0
        self.wide_rounds: dict[tuple[int, ...], list[int]] = {}  # extend-one-wide: each prompt's verify steps

    # --- sglang's rules, as long_context derives them --------------------------------------------------------
    def _refusal(self, prompt: list[int], max_new: int) -> tuple[int, str] | None:
        topk = None if self.broken == "reserve-dropped" else self.topk
        admitted = long_context.admitted_new(topk, len(prompt))
        if max_new > admitted and self.broken != "over-limit-taken":
            return 400, (
                "Requested token count exceeds the model's maximum context length of "
                f"{long_context.LONG_CONTEXT_LEN} tokens."
            )
        return None

    def _length(self, prompt: list[int], max_new: int) -> int:
        n = min(max_new, (long_context.LONG_CONTEXT_LEN - 1) - len(prompt) - 1)
        return n - (self.broken == "one-short" and n > long_context.PREFIX_NEW)

    def _cached(self, prompt: list[int]) -> int:
        if self.broken == "cached-zero":
            return 0
        with self.lock:
            best = max((_common(prompt, s) for s in self.seen), default=0)
        pairs = bool(self.topk)  # under MTP the tree matches token pairs: one token fewer (cached_bounds)
        return (min(best, len(prompt) - 1) - pairs) // self.page * self.page

    def _extend_wide(self, prompt: list[int], n: int) -> list[int]:
        """extend-one-wide's ``n`` tokens; each verify step's accepted drafts kept for ``_meta`` (self.wide_rounds)."""
        text, window = long_context.pair_text(), long_context.WINDOW
        scores = long_witness.sliding_score_list(text, window)  # plain Python: the unit suite has no torch
        edge, short, wide = (max(range(m + 1), key=scores.__getitem__) for m in (window - 1, window - 2, window))

        def read(ids: list[int], offset: int) -> int:
            return long_witness.expected_continuation(ids, len(ids) + 1, window, read=offset)[0]

        ids, rounds = prompt + [read(prompt, wide)], []
        while len(ids) < len(prompt) + n:
            if not self.topk:
                ids.append(read(ids, short))
                continue
            ids.append(read(ids, edge))  # the root's token: the drafter's first draft, kept
            accepted = 1
            while len(ids) < len(prompt) + n:
                token = read(ids, wide)
                kept = accepted < settings.NUM_STEPS and token == read(ids, edge)
                ids.append(token)
                if not kept:
                    break
                accepted += 1
            rounds.append(accepted)
        with self.lock:
            self.wide_rounds[tuple(prompt)] = rounds
        return ids[len(prompt) :]

    def _rule(self, prompt: list[int], n: int) -> list[int]:
        if self.broken == "extend-one-wide" and n:
            return self._extend_wide(prompt, n)
        short = (self.broken == "decode-one-short" and not self.topk) or (
            self.broken == "tree-by-index" and (self.topk or 0) > 1
        )
        if short and n >= 2:
            ids = prompt + long_context.expected(prompt, 1)
            text = long_context.pair_text()
            while len(ids) < len(prompt) + n:
                k = len(ids) - len(prompt)  # output position; under the tree, every third from 3 is a step's bonus
                read_short = self.broken == "decode-one-short" or k % (TREE_KEPT + 1) == 0
                window = long_context.WINDOW - (2 if read_short else 1)
                ids.append(long_witness.predicted_next(ids, text, visible_max=window)[-1])
            return ids[len(prompt) :]
        if self.broken != "root-reads-short" or not self.topk or n < 2:
            return long_context.expected(prompt, n)
        first = long_context.expected(prompt, 1)
        rest = long_witness.expected_continuation(
            prompt + first, len(prompt) + n, long_context.WINDOW, read=ROOT_SHORT_READ
        )
        return first + rest

    def _rounds(self, n: int, cached: int, prompt: list[int] | None = None) -> tuple[list[int], int]:
        """Drafts accepted by each verify step of a request that gets ``n`` tokens, and its retractions."""
        if self.broken == "extend-one-wide":  # the steps that made the first n of the tokens _extend_wide served
            with self.lock:
                served = list(self.wide_rounds[tuple(prompt or ())])
            rounds, produced = [], 1
            while produced < n:
                rounds.append(served[len(rounds)])
                produced += rounds[-1] + 1
            return rounds, 0
        steps, produced, rounds, retractions = settings.NUM_STEPS, 1, [], 0  # the prefill yields the first token
        while produced < n:
            if self.retract_after is not None and len(rounds) == self.retract_after and not retractions:
                retractions, produced = 1, produced + 1  # the re-prefill's token
                continue
            accepted = steps
            if self.broken == "tree-by-index" and self.topk > 1:
                accepted = TREE_KEPT
            elif self.broken == "view-drops-cached" and cached:
                accepted = 0
            elif not rounds and self.broken in ("first-round-lost", "one-draft-lost"):
                accepted = 0 if self.broken == "first-round-lost" else steps - 1
            rounds.append(accepted)
            produced += accepted + 1
        return rounds, retractions

    def _meta(self, prompt, out, cached, reason) -> dict:
        meta = {
            "finish_reason": reason,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out),
            "cached_tokens": cached,
            "num_retractions": 0,
        }
        if not self.topk or not out:
            return meta
        rounds, meta["num_retractions"] = self._rounds(len(out), cached, prompt)
        if rounds:  # sglang's tokenizer_manager adds these only once a verify step ran
            steps = settings.NUM_STEPS
            meta.update(
                spec_verify_ct=len(rounds),
                spec_accept_length=len(out) / len(rounds),
                spec_num_correct_drafts=sum(rounds),
                spec_num_proposed_drafts=len(rounds) * (settings.DRAFT_TOKENS[self.topk] - 1),
                spec_correct_drafts_histogram=[rounds.count(k) for k in range(steps + 1)],
            )
        return meta

    # --- the fake's hooks ------------------------------------------------------------------------------------
    def __call__(self, path: str, payload: dict):
        prompt, max_new = payload["input_ids"], payload["sampling_params"]["max_new_tokens"]
        refused = self._refusal(prompt, max_new)
        if refused:
            return refused
        cached = self._cached(prompt)
        n = self._length(prompt, max_new)
        out = self._rule(prompt, n)
        with self.lock:
            self.seen.append(prompt + out)
        return {"output_ids": out, "meta_info": self._meta(prompt, out, cached, {"type": "length", "length": n})}

    def abort(self, rid: str) -> None:
        with self.lock:
            self.aborted.add(rid)
        with self.pool:
            self.abort_heard.set()
            self.pool.notify_all()

    def _admit(self, key: int, need: int) -> None:
        """Wait until the pool admits a request holding ``need`` slots (the module docstring's PrefillAdder rule)."""
        with self.pool:
            self.waiting += 1
            self.pool.notify_all()
            self.pool.wait_for(
                lambda: sum(self.running.values()) + need < smoke_servers.LONG_POOL_TOKENS, timeout=HOLD_S
            )
            self.waiting -= 1
            self.running[key] = need

    def _release(self, key: int) -> None:
        with self.pool:
            self.running.pop(key, None)
            self.done += 1
            self.pool.notify_all()

    def _hold(self, rid: str | None, abort_only: bool = False) -> None:
        """Hold until the abort arrives, or (unless ``abort_only``) until a stream waits for the pool (then decode
        goes on and frees it) or has finished (then no abort comes)."""
        with self.pool:
            self.pool.wait_for(
                lambda: self.abort_heard.is_set() or (not abort_only and (self.waiting > 0 or self.done > 0)),
                timeout=HOLD_S,
            )

    def _victim_waits(self):
        """``victim_waits``: the victim stays queued until the abort (answered as sglang's waiting-queue abort of a
        request that made no token) or until the others are done (then it runs)."""
        with self.pool:
            self.waiting += 1
            self.pool.notify_all()
            self.pool.wait_for(lambda: self.abort_heard.is_set() or self.done > 0, timeout=HOLD_S)
            self.waiting -= 1
        return self.abort_heard.is_set()

    def stream(self, payload: dict):
        prompt, max_new = payload["input_ids"], payload["sampling_params"]["max_new_tokens"]
        rid = payload.get("rid")
        n = self._length(prompt, max_new)
        rule = self._rule(prompt, n)
        key = id(payload)
        if rid is not None and self.victim_waits and self._victim_waits():
            reason = {"type": "abort", "message": "Abort in waiting queue"}
            yield {"output_ids": [], "meta_info": {"id": rid, "finish_reason": reason, "completion_tokens": 0}}
            return
        self._admit(key, -(-len(prompt) // self.page) * self.page + n + self.page)
        try:
            yield from self._decode(prompt, rid, n, rule)
        finally:
            self._release(key)

    def _decode(self, prompt: list[int], rid: str | None, n: int, rule: list[int]):
        queued = self.queued_victim and rid is not None
        out: list[int] = []
        for k in range(n):
            if self.victim_waits and rid is None and k == 2:  # past its first decode step beside a queued victim
                self._hold(rid, abort_only=True)
            elif k == (2 if queued else 1):  # held after the first token (a queued victim: retracted after its second)
                self._hold(rid)
            with self.lock:
                stopped = rid is not None and rid in self.aborted and self.broken != "abort-ignored"
            stopped = stopped and not (queued and k < 2)  # a queued victim was still running for its first two
            if stopped and queued:  # sglang's waiting-queue abort of a streamed request: the last token only
                reason = {"type": "abort", "message": "Abort in waiting queue"}
                meta = {"id": rid, "finish_reason": reason, "weight_version": "default", "completion_tokens": len(out)}
                yield {"output_ids": out[-1:], "meta_info": meta}
                return
            if stopped:
                meta = self._meta(prompt, out, 0, {"type": "abort", "message": "Abort before decode"})
                yield {"output_ids": list(out), "meta_info": meta}
                return
            changed = self.broken == "neighbour-changed" and self.abort_heard.is_set() and rid is None
            out.append(rule[k] + 1 if changed else rule[k])
            reason = {"type": "length", "length": n} if k == n - 1 else None
            yield {"output_ids": list(out), "meta_info": self._meta(prompt, out, 0, reason)}


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
