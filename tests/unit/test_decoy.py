"""The decoy witness's accept-length prediction (mtpmatrix.pairs.decoy) against an independent brute force: a
plain numpy copy of sglang's draft tree (select_top_k_tokens' beam over cumulative scores, organize_draft_results'
best draft_tokens - 1 candidates, build_tree's parents) and its greedy verify, run on the decoy drafter's logits
table (right token LOGIT_PEAK, decoy DECOY_LOGIT, the rest spread below LOGIT_PEAK * (1 - code margin); a node fed a
wrong state drafts peaked garbage, a node fed a decoy token the damped, nearly flat distribution), with and without
the softcap. Broken copies of the tree / verify must miss the prediction.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtpmatrix.core import settings
from mtpmatrix.pairs import decoy
from mtpmatrix.pairs.witness.weights import LOGIT_PEAK
from mtpmatrix.tiers import smoke

V = 512
DECOYS = (V - 1, V - 2)
CODE_MARGIN = 0.49  # the built pairs' (marker: witness.codes.code_margin)


class Drafter:
    """The decoy drafter's probabilities, by (input token, whether the state it is fed is its own)."""

    def __init__(self, cap: float | None, seed: int = 0, damped_bound: float = 0.43):
        self.cap, self.rng, self.bound = cap, np.random.default_rng(seed), damped_bound
        self.cache: dict = {}

    def _softmax(self, logits):
        if self.cap:
            logits = self.cap * np.tanh(logits / self.cap)
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def probs(self, token: int, clean: bool):
        key = (token, clean)
        if key not in self.cache:
            if token in DECOYS:  # the damper: every logit within +-bound
                logits = self.rng.uniform(-self.bound, self.bound, V)
            elif not clean:  # an uncancelled nuisance: a peaked, unrelated draft
                logits = self.rng.uniform(-LOGIT_PEAK, LOGIT_PEAK, V)
            else:
                logits = self.rng.uniform(-1, 1, V) * LOGIT_PEAK * (1 - CODE_MARGIN)
                logits[list(DECOYS)] = 0.0
                logits[(token + 1) % V] = LOGIT_PEAK
                if decoy.is_decoy_input(token):
                    logits[DECOYS[token % 2]] = decoy.DECOY_LOGIT
            self.cache[key] = self._softmax(logits)
        return self.cache[key]


def _top(p, k):
    idx = np.argsort(-p, kind="stable")[:k]
    return p[idx], idx


def sglang_round(
    bonus: int,
    topk: int,
    steps: int,
    draft_tokens: int,
    drafter: Drafter,
    *,
    parent_bug: bool = False,
    verify_first: bool = False,
) -> int:
    """Accepted drafts of one sglang draft + verify round (spec_utils.select_top_k_tokens, eagle_utils.
    organize_draft_results / build_tree_kernel_efficient, greedy tree verify). ``parent_bug``: every beam node is fed
    the output state of the previous level's first beam node (selected_input_index all 0); ``verify_first``: verify
    accepts each node's first child unchecked."""
    p, idx = _top(drafter.probs(bonus, True), topk)  # the seed: bonus token + the target's own hidden state
    scores = p
    cand_scores, cand_tokens = list(p), list(idx)
    parent_list = [-1] + list(range(topk))
    # beam entry: (token, its candidate index, unused, (input, clean) of the forward whose output state it is fed)
    beam = [(int(t), c, None, (bonus, True)) for c, t in enumerate(idx)]
    for i in range(1, steps):
        # each beam node's forward: input = its token, state = the output of the forward that drafted it
        outs = []
        for tok, _c, _ok, (src_tok, src_clean) in beam:
            clean = src_clean and tok == src_tok + 1 and tok not in DECOYS
            outs.append((_top(drafter.probs(tok, clean), topk), clean))
        expand = np.array([[scores[b] * outs[b][0][0][k] for k in range(topk)] for b in range(len(beam))])
        flat = expand.flatten()
        sel = np.argsort(-flat, kind="stable")[:topk]
        base = topk + topk * topk * (i - 1)
        cand_scores += list(flat)
        cand_tokens += [int(outs[b][0][1][k]) for b in range(len(beam)) for k in range(topk)]
        if i < steps - 1:
            parent_list += [base + int(s) for s in sel]
        fed = [0 if parent_bug else int(s) // topk for s in sel]  # the forward whose output state each is fed
        beam = [
            (int(outs[s // topk][0][1][s % topk]), base + int(s), None, (beam[f][0], outs[f][1]))
            for s, f in zip(sel, fed)
        ]
        scores = flat[sel]
    chosen = sorted(np.argsort(-np.array(cand_scores), kind="stable")[: draft_tokens - 1].tolist())
    children: dict[int, list[int]] = {}
    for c in chosen:
        parent = parent_list[c // topk]
        if parent == -1 or parent in chosen:
            children.setdefault(parent, []).append(c)
    node, token, accepted = -1, bonus, 0
    while children.get(node):
        kids = children[node]
        nxt = kids[0] if verify_first else next((c for c in kids if cand_tokens[c] == token + 1), None)
        if nxt is None:
            break
        node, token, accepted = nxt, cand_tokens[nxt], accepted + 1
    return accepted


def sglang_request(prompt, topk, steps, draft_tokens, drafter, max_new=smoke.MAX_NEW_TOKENS, **bugs) -> list[int]:
    """Accepted drafts of each verify step of a greedy request (each yields accepted + 1 tokens after the prefill's
    one; sglang counts them uncapped)."""
    bonus, produced, accepted = prompt[-1] + 1, 1, []
    while produced < max_new:
        a = sglang_round(bonus, topk, steps, draft_tokens, drafter, **bugs)
        produced, bonus = produced + a + 1, bonus + a + 1
        accepted.append(a)
    return accepted


def sglang_meta(accepted: list[int], max_new=smoke.MAX_NEW_TOKENS) -> dict:
    """The request's meta_info counters as sglang 0.5.17 fills them (tokenizer_manager, batch_result_processor)."""
    hist = [accepted.count(n) for n in range(max(accepted) + 1)]
    return {
        "completion_tokens": max_new,
        "spec_verify_ct": len(accepted),
        "spec_num_correct_drafts": sum(accepted),
        "spec_correct_drafts_histogram": hist,
        "spec_accept_length": max_new / len(accepted),
    }


PROMPTS = smoke.id_prompts(V)
CAPS = [pytest.param(decoy.SOFTCAP, id="softcap"), pytest.param(None, id="raw")]


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("topk,draft_tokens", [(1, 6), (3, 12), (2, 8), (3, 9), (3, 7), (3, 5), (2, 4)])
def test_prediction_matches_brute_force_tree(cap, topk, draft_tokens):
    drafter = Drafter(cap)
    steps = settings.NUM_STEPS
    for prompt in PROMPTS:
        want = sglang_request(prompt, topk, steps, draft_tokens, drafter)
        got = decoy.request_rounds(
            prompt, topk=topk, steps=steps, draft_tokens=draft_tokens, max_new_tokens=smoke.MAX_NEW_TOKENS
        )
        assert [a for _b, a in got] == want, (prompt[-1], topk, draft_tokens, got, want)
        predicted = decoy.predicted_counters(
            prompt, topk=topk, steps=steps, draft_tokens=draft_tokens, max_new_tokens=smoke.MAX_NEW_TOKENS
        )
        assert decoy.counter_mismatches(predicted, sglang_meta(want)) == []
        for bonus in range(prompt[-1] + 1, prompt[-1] + smoke.MAX_NEW_TOKENS):
            assert decoy.round_accepts(bonus, topk=topk, steps=steps, draft_tokens=draft_tokens) == sglang_round(
                bonus, topk, steps, draft_tokens, drafter
            ), bonus


def test_smoke_predictions():
    """The smoke servers' per-request values: topk 1 loses a round or more to the decoys, topk 3 none."""
    per = {
        k: [
            decoy.predicted_accept(
                p,
                topk=k,
                steps=settings.NUM_STEPS,
                draft_tokens=settings.DRAFT_TOKENS[k],
                max_new_tokens=smoke.MAX_NEW_TOKENS,
            )
            for p in PROMPTS
        ]
        for k in (1, 3)
    }
    assert per[1] == [3.5556, 3.5556, 3.5556, 4.0, 3.5556, 3.5556, 3.5556, 3.5556]
    assert per[3] == [5.3333] * 8  # the plain witness's: the tree recovers every decoy
    depths = {1: set(), 3: set()}
    for k in (1, 3):
        for p in PROMPTS:
            for bonus, accepted in decoy.request_rounds(
                p,
                topk=k,
                steps=settings.NUM_STEPS,
                draft_tokens=settings.DRAFT_TOKENS[k],
                max_new_tokens=smoke.MAX_NEW_TOKENS,
            ):
                depths[k] |= {
                    d for d in range(settings.NUM_STEPS) if decoy.is_decoy_input(bonus + d) and (k > 1 or d == accepted)
                }
    assert depths[1] == depths[3] == set(range(settings.NUM_STEPS))


def test_every_topk3_request_passes_a_decoy_where_a_wrong_parent_shows():
    """At topk 3 a node fed another node's parent state shows only past a decoy at depth <= steps - 3 (the right
    node there is its level's second branch; two levels on it drafts): every smoke request has one."""
    for p in PROMPTS:
        rounds = decoy.request_rounds(
            p,
            topk=3,
            steps=settings.NUM_STEPS,
            draft_tokens=settings.DRAFT_TOKENS[3],
            max_new_tokens=smoke.MAX_NEW_TOKENS,
        )
        assert any(decoy.is_decoy_input(b + d) for b, _a in rounds for d in range(settings.NUM_STEPS - 2)), p


@pytest.mark.parametrize("bug", ["parent_bug", "verify_first"])
def test_broken_tree_or_verify_misses_the_prediction(bug):
    """What the smoke check sees: a tree that feeds every node the first beam node's parent (topk 3) or a verify that
    accepts the first-ranked draft unchecked (topk 1). With the per-step histogram (0.5.13-0.5.23 report it) every
    request misses its prediction; the accept length alone (completion / verify) still misses on some requests (a
    round that loses fewer tokens than the last step's overshoot does not add a verify step)."""
    drafter = Drafter(decoy.SOFTCAP)
    topk = 3 if bug == "parent_bug" else 1
    missed = missed_by_ratio = 0
    for prompt in PROMPTS:
        predicted = decoy.predicted_counters(
            prompt,
            topk=topk,
            steps=settings.NUM_STEPS,
            draft_tokens=settings.DRAFT_TOKENS[topk],
            max_new_tokens=smoke.MAX_NEW_TOKENS,
        )
        meta = sglang_meta(
            sglang_request(prompt, topk, settings.NUM_STEPS, settings.DRAFT_TOKENS[topk], drafter, **{bug: True})
        )
        missed += bool(decoy.counter_mismatches(predicted, meta))
        ratio_only = {k: meta[k] for k in ("completion_tokens", "spec_verify_ct")}
        missed_by_ratio += bool(decoy.counter_mismatches(predicted, ratio_only))
    assert missed == len(PROMPTS)
    assert missed_by_ratio >= (2 if bug == "parent_bug" else len(PROMPTS))


def test_prediction_for_the_wrong_topk_differs():
    for p in PROMPTS:
        assert decoy.predicted_accept(p, topk=1, steps=5, draft_tokens=6, max_new_tokens=32) != decoy.predicted_accept(
            p, topk=3, steps=5, draft_tokens=12, max_new_tokens=32
        )


def test_decoy_inputs_and_tokens():
    offs = sorted(decoy.DECOY_OFFSETS)
    gaps = [b - a for a, b in zip(offs, offs[1:] + [offs[0] + decoy.DECOY_PERIOD])]
    assert min(gaps) == decoy.MIN_GAP >= settings.NUM_STEPS
    # no request of the smoke tier ever needs a decoy token: prompts and their 32 successors stay below them
    top = max(p[-1] for p in PROMPTS) + smoke.MAX_NEW_TOKENS
    assert top < min(DECOYS) and min(min(p) for p in PROMPTS) > 15


def test_round_accepts_rejects_what_it_was_not_derived_for():
    with pytest.raises(ValueError, match="chain"):
        decoy.round_accepts(40, topk=1, steps=5, draft_tokens=12)
    with pytest.raises(ValueError, match="need topk"):
        decoy.round_accepts(40, topk=0, steps=5, draft_tokens=6)
    with pytest.raises(ValueError, match="one per round"):
        decoy.round_accepts(40, topk=3, steps=8, draft_tokens=12)


def test_chain_accepts_is_transformers_schedule():
    """transformers drafts min(num_assistant_tokens, room) per round: a shorter chain stops earlier or equally."""
    assert decoy.chain_accepts(40, 5) == 0  # 40 is a decoy input: depth 0
    assert decoy.chain_accepts(41, 5) == 5 and decoy.chain_accepts(43, 5) == 4 and decoy.chain_accepts(43, 3) == 3
