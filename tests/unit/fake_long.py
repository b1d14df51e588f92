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

``retract_after`` (not a fault) retracts every request once after that many verify steps: the re-prefill
of prompt + output yields one token without a verify step, as sglang's does (meta_info num_retractions 1).

(spec-overalloc-tail-kept changes no answer: the server log's idle leak report shows it, test_long_pool_*.)

The streams of an AbortMidBatch hold after their first token until the abort arrives (an event, with a long
timeout that only a broken client meets): the client sees every request decoding, then aborts.
"""

from __future__ import annotations

import threading

from mtpmatrix.core import settings
from mtpmatrix.pairs import long_witness
from mtpmatrix.tiers.surface import long_context

HOLD_S = 60.0
ROOT_SHORT_READ = 51  # the sliding owner's read with the edge (63 back) out of reach (docs/pairs.md, long witness)


class LongWitnessShapes:
    def __init__(self, topk: int | None, page: int = 1, broken: str = "", retract_after: int | None = None):
        self.topk, self.page, self.broken, self.retract_after = topk, page, broken, retract_after
        self.seen: list[list[int]] = []  # every finished sequence (prompt + output): the radix tree
        self.lock = threading.Lock()
        self.aborted: set[str] = set()
        self.abort_heard = threading.Event()
        self.streams = 0

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

    def _rule(self, prompt: list[int], n: int) -> list[int]:
        if self.broken != "root-reads-short" or not self.topk or n < 2:
            return long_context.expected(prompt, n)
        first = long_context.expected(prompt, 1)
        rest = long_witness.expected_continuation(
            prompt + first, len(prompt) + n, long_context.WINDOW, read=ROOT_SHORT_READ
        )
        return first + rest

    def _rounds(self, n: int, cached: int) -> tuple[list[int], int]:
        """Drafts accepted by each verify step of a request that gets ``n`` tokens, and its retractions."""
        steps, produced, rounds, retractions = settings.NUM_STEPS, 1, [], 0  # the prefill yields the first token
        while produced < n:
            if self.retract_after is not None and len(rounds) == self.retract_after and not retractions:
                retractions, produced = 1, produced + 1  # the re-prefill's token
                continue
            accepted = steps
            if self.broken == "view-drops-cached" and cached:
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
        rounds, meta["num_retractions"] = self._rounds(len(out), cached)
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
        self.abort_heard.set()

    def stream(self, payload: dict):
        prompt, max_new = payload["input_ids"], payload["sampling_params"]["max_new_tokens"]
        rid = payload.get("rid")
        n = self._length(prompt, max_new)
        rule = self._rule(prompt, n)
        out: list[int] = []
        for k in range(n):
            if k == 1:  # every stream holds after its first token until an abort arrives
                self.abort_heard.wait(HOLD_S)
            with self.lock:
                stopped = rid is not None and rid in self.aborted and self.broken != "abort-ignored"
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
