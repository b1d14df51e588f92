"""Decoy witness: the witness pair (``mtpmatrix.pairs.witness``) whose drafter, at a known set of inputs,
ranks a wrong *decoy* token first and the right token second, so verify must reject drafts and the accepted path
runs through non-first tree branches. The accept length of every request is predicted exactly, per topk.

Why: every plain-witness draft is right as its first choice, so the smoke tier ran only the top-1 chain: a topk-3
tree bug off the first branch, or a verify that accepts drafts without checking them, passed (issue #19).

Construction (on top of the witness; the target is unchanged: next = token + 1)
------------------------------------------------------------------------------
Decoy inputs: ``t`` with ``t mod DECOY_PERIOD`` in ``DECOY_OFFSETS`` (``is_decoy_input``). Consecutive decoy inputs
are at least ``MIN_GAP`` (5 = the smoke tier's draft steps) apart, so a draft round of 5 inputs meets at most one.
The drafter cannot see its draft depth (its state carries none), so the set is a function of the input token; the
depth a decoy lands at follows from where each round starts, and over the smoke prompts it takes every value 0-4
(0: the seed step, drafted from the bonus token and the target's hidden state).
Decoy tokens: two ids no request ever needs (vocab - 1 and, for the centroid head, the first of vocab - 2, 15, 14
in another centroid cluster), so a decoy never coincides with the right token.

Every target embedding row gets one more unit part (the others shrink to keep rows at unit norm), a "switch":
  * a decoy input t carries a one-hot that selects its decoy d(t) (for the centroid head, one whose cluster is not
    cluster(t+1));
  * a decoy token carries a *damper*;
  * every other token carries a *filler*.
The assistant's pre_projection maps them (token half only; the recurrent half never reads them) to
  * decoy select i  ->  DECOY_NUISANCE * u_i in the nuisance dims (u_i orthonormal), plus, for the centroid head,
    ZETA_CLUSTER on cluster(d_i);
  * filler          ->  FILLER in an assistant dim nothing reads, FILLER = the norm of the decoy vector above, so
    the residual has the same norm at every intact step and the final RMSNorm divides by the same R: the recurrent
    state a decoy step hands on is exactly the witness's (next = c(t+1)), and its right child cancels as before;
  * damper          ->  DAMPER in an assistant dim nothing reads.
The assistant head: decoy row d_i reads only u_i (code part zero) so that its raw logit at a decoy step is exactly
DECOY_LOGIT; every other row's nuisance readout is projected off span(u) (renormalised), so the decoy vector adds
nothing to them. Raw logits at a decoy step: decoy DECOY_LOGIT = 22, right LOGIT_PEAK = 20, every other token
<= LOGIT_PEAK * (1 - code_margin) (~10.2 at the built pairs' margin 0.49). sglang's plain head applies the 30.0
softcap (decoy 18.75, right 17.49: 1.26 nats), its centroid head and transformers' head do not (2 nats). From the
logits table (``drafter_probabilities``, every input of the built pairs): p_decoy 0.78 / 0.88 (softcapped / not),
p_right 0.219 / 0.119, third choice < 9e-5; at any other intact step p_right >= 0.992, second choice < 6e-4.

A node fed a decoy token (the decoy's child) sees the damper: DAMPER dominates its residual norm, so after the final
norm every logit is within +-``damped_logit_bound`` of 0 (0.42 e-series, 0.31 the others; |code| <= 1, |nuisance|
<= 2 ALPHA + 4 BETA whatever state it got): its children get probabilities q <= e^(2 bound) / N (N = the tokens the
head scores: 128 for the centroid head's 4 clusters of 32, else 512), so everything under a decoy scores at most
p_decoy * q <= 0.016. Every right-path node scores at least p_right * 0.992^4 >= 0.119 (one decoy per round), every
third choice at most 6e-4: the right path outranks both by >= 2.0 nats (e-series, no softcap; 2.7 softcapped,
3.6-4.3 for the other families; ``tree_margins``, written to the pair's marker under "decoy"). bf16 rounds a logit
near 20 by <= 0.0625, far inside these margins, and inside the 1.26-nat decoy-over-right gap at topk 1.

What sglang does with it (0.5.13, 0.5.17 and 0.5.23: the same ``select_top_k_tokens`` / ``organize_draft_results``
/ greedy tree verify)
-----------------------------------------------------------------------------------------------------------
Draft round from bonus token b: level k (0..steps-1) is drafted from input b + k (the seed forward at level 0).
topk 1: a chain; the draft from a decoy input is the decoy, verify rejects it, so the round accepts
  k = the depth of the first decoy input (``steps`` when none) and the bonus becomes b + k + 1.
topk 3: every level keeps the ``topk`` best cumulative scores (parent score x child probability) as the next
  level's parents, and the tree is the ``draft_tokens - 1`` best of all levels' candidates. With the probabilities
  above, the right path (score ~1 before the decoy, ~p_right after) and the decoy node (~p_decoy) outrank every
  garbage or third-choice node, so ranked by score the tree lists the path in order with the decoy just before the
  right node of its level: the right node of level k is in the tree iff (k + 1) + (decoys at levels <= k) <=
  draft_tokens - 1 (11 at topk 3: always, with at most one decoy per round). Verify then accepts every level: the
  accepted path runs through the decoy's sibling (the second branch), and the level after it through a node whose
  parent was not the first of its level: it drafts right only if it was fed its own parent's state.
Per request: the prefill yields the first token, each verify step yields accepted + 1; sglang counts every verify
step (spec_verify_ct) until the request has max_new_tokens (the last step may overshoot: its extra tokens are cut
from completion_tokens). So accept length = max_new_tokens / (verify steps), exactly: ``predicted_accept``.

transformers' assisted generation (``SinglePositionMultiTokenCandidateGenerator``) is a greedy chain of
``min(num_assistant_tokens, room)`` drafts per round: ``chain_accepts`` per round, as topk 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mtpmatrix.core import settings
from mtpmatrix.pairs.witness.codes import orthogonal_columns
from mtpmatrix.pairs.witness.layout import D_NUISANCE
from mtpmatrix.pairs.witness.weights import ALPHA, BETA, LOGIT_PEAK, ZETA_CLUSTER, make_witness

DECOY_PERIOD = 40
DECOY_OFFSETS = (0, 7, 14, 19, 26, 33)  # gaps 7 7 5 7 7 7: depths 0-4 at topk 1 over the smoke prompts
MIN_GAP = 5  # no two decoy inputs closer: one decoy per 5-input draft round at most
DECOY_LOGIT = 22.0  # raw logit of the decoy at a decoy step (the right token's is LOGIT_PEAK = 20)
DECOY_NUISANCE = 1.0  # norm of the decoy vector in the nuisance dims
DAMPER = 4000.0  # residual size of a decoy token's damper (module docstring)
SOFTCAP = 30.0  # the tiny pairs' final_logit_softcapping (sglang's plain head applies it)
N_DECOYS = 2


def is_decoy_input(token: int) -> bool:
    """Whether the drafter, fed ``token`` with the right state, ranks a decoy first and ``token + 1`` second."""
    return token % DECOY_PERIOD in DECOY_OFFSETS


def chain_accepts(bonus: int, drafts: int) -> int:
    """Drafts a greedy chain of ``drafts`` from ``bonus`` gets accepted: up to the first decoy input."""
    return next((k for k in range(drafts) if is_decoy_input(bonus + k)), drafts)


def round_accepts(bonus: int, *, topk: int, steps: int, draft_tokens: int) -> int:
    """Drafts sglang's verify accepts in one round from ``bonus`` (module docstring, "What sglang does")."""
    if topk < 1 or steps < 1 or draft_tokens < 2:
        raise ValueError(
            f"topk {topk}, steps {steps}, draft_tokens {draft_tokens}: need topk, steps >= 1 and draft_tokens >= 2"
        )
    if topk == 1:
        if draft_tokens != steps + 1:
            raise ValueError(f"topk 1 drafts a chain of steps + 1 = {steps + 1} tokens, not {draft_tokens}")
        return chain_accepts(bonus, steps)
    if MIN_GAP < steps:
        raise ValueError(
            f"the decoy inputs are {MIN_GAP} apart: more than one per round of {steps} steps is "
            f"outside what the construction's margins were derived for"
        )
    ranked = 0  # tree nodes that outrank the next right node
    for level in range(steps):
        ranked += 1 + is_decoy_input(bonus + level)
        if ranked > draft_tokens - 1:
            return level
    return steps


def request_rounds(
    prompt_ids: list[int], *, topk: int, steps: int, draft_tokens: int, max_new_tokens: int
) -> list[tuple[int, int]]:
    """(bonus token, accepted drafts) of every verify step sglang runs for a greedy request on ``prompt_ids``."""
    if max_new_tokens < 1 or not prompt_ids:
        raise ValueError("need a prompt and max_new_tokens >= 1")
    bonus, produced, rounds = prompt_ids[-1] + 1, 1, []  # the prefill yields the first token
    while produced < max_new_tokens:
        accepted = round_accepts(bonus, topk=topk, steps=steps, draft_tokens=draft_tokens)
        rounds.append((bonus, accepted))
        produced += accepted + 1
        bonus += accepted + 1
    return rounds


def predicted_verify_steps(
    prompt_ids: list[int], *, topk: int, steps: int, draft_tokens: int, max_new_tokens: int
) -> int:
    """sglang's spec_verify_ct for the request."""
    return len(
        request_rounds(prompt_ids, topk=topk, steps=steps, draft_tokens=draft_tokens, max_new_tokens=max_new_tokens)
    )


def predicted_accept(prompt_ids: list[int], *, topk: int, steps: int, draft_tokens: int, max_new_tokens: int) -> float:
    """The request's accept length as sglang reports it: completion tokens / spec_verify_ct."""
    verify = predicted_verify_steps(
        prompt_ids, topk=topk, steps=steps, draft_tokens=draft_tokens, max_new_tokens=max_new_tokens
    )
    return round(max_new_tokens / verify, 4) if verify else float("nan")


# --------------------------------------------------------------------------------------- probabilities (stated)


def drafter_probabilities(codes, decoys: list[int], tokens, cap: float | None) -> dict:
    """The intact drafter's probabilities over ``tokens`` (inputs), from its logits table: raw logit of j at input t
    = LOGIT_PEAK c(j).c(t+1) (0 for decoy tokens), the selected decoy DECOY_LOGIT at a decoy input; ``cap`` the
    softcap (None: none). Every token counts in the softmax (the centroid head scores fewer: only larger right-token
    probabilities). Returns the worst cases the tree argument needs."""
    import torch

    V = codes.shape[0]
    t = torch.as_tensor(list(tokens))
    right = (t + 1) % V
    logits = LOGIT_PEAK * codes[right].double() @ codes.double().T  # [inputs, V]
    logits[:, decoys] = 0.0
    is_decoy = torch.tensor([is_decoy_input(int(x)) for x in t])
    logits[is_decoy, decoys[0]] = DECOY_LOGIT  # which decoy does not matter here: both rows are alike
    if cap:
        logits = cap * torch.tanh(logits / cap)
    p = torch.softmax(logits, dim=-1)
    p_right = p.gather(1, right[:, None])[:, 0]
    ranked = p.sort(dim=-1, descending=True).values
    plain, dec = ~is_decoy, is_decoy
    return {
        "right_min_plain": float(p_right[plain].min()),
        "second_max_plain": float(ranked[plain, 1].max()),
        "decoy_min": float(p[dec, decoys[0]].min()),
        "decoy_max": float(p[dec, decoys[0]].max()),
        "right_min_decoy": float(p_right[dec].min()),
        "third_max_decoy": float(ranked[dec, 2].max()),
        "decoy_ranked_first": bool((p[dec, decoys[0]] > p_right[dec]).all()),
        "right_ranked_second": bool((p_right[dec] >= ranked[dec, 1]).all()),
    }


def damped_logit_bound(sq: float) -> float:
    """|logit| bound of a node fed a decoy token: a head row has norm <= max(LOGIT_PEAK, DECOY_LOGIT /
    DECOY_NUISANCE) * R per unit of residual, the residual's code part is <= 1 and its nuisance part <= 2 ALPHA (own
    code vs state) + 4 BETA (two anchors, two attention outputs), and the final norm divides by |residual| / sqrt(A)
    >= DAMPER / sqrt(A); R sqrt(A) = sqrt(sq)."""
    reach = 1.0 + 2 * ALPHA + 4 * BETA
    return max(LOGIT_PEAK, DECOY_LOGIT / DECOY_NUISANCE) * math.sqrt(sq) * reach / DAMPER


def tree_margins(probs: dict, damped_bound: float, scored_tokens: int, steps: int) -> dict:
    """The tree argument's numbers (module docstring): the lowest right-path score after a decoy, the highest score
    under a decoy node (damped children: q <= e^(2 bound) / scored tokens) and of a third choice, in nats apart."""
    right_path = probs["right_min_decoy"] * probs["right_min_plain"] ** (steps - 1)
    garbage = probs["decoy_max"] * math.exp(2 * damped_bound) / scored_tokens
    third = max(probs["third_max_decoy"], probs["second_max_plain"])
    return {
        "right_path_min": right_path,
        "under_decoy_max": garbage,
        "third_choice_max": third,
        "margin_nats": math.log(right_path / max(garbage, third)),
    }


# --------------------------------------------------------------------------------------- the weights


@dataclass
class DecoyExtension:
    """What ``make_witness(extension=...)`` adds for the decoy witness (module docstring)."""

    centroid: bool
    backbone_parts = (("switch", 2 + N_DECOYS),)  # filler, decoy select x N_DECOYS, damper
    assistant_parts = (("filler", 1), ("damper", 1))
    embed_parts = 1

    @property
    def filler(self) -> float:
        return math.hypot(DECOY_NUISANCE, ZETA_CLUSTER if self.centroid else 0.0)

    @property
    def extra_sq(self) -> float:
        return self.filler**2

    def decoys(self, vocab: int, cluster_of) -> list[int]:
        first = vocab - 1
        if cluster_of is None:
            return [first, vocab - 2]
        other = next(t for t in (vocab - 2, 15, 14) if int(cluster_of[t]) != int(cluster_of[first]))
        return [first, other]

    def select(self, t: int, vocab: int, cluster_of) -> int:
        """Which decoy input ``t`` ranks first: alternating, but never one in the right token's cluster."""
        i = (t // DECOY_PERIOD) % N_DECOYS
        if cluster_of is not None:
            decoys = self.decoys(vocab, cluster_of)
            if int(cluster_of[decoys[i]]) == int(cluster_of[(t + 1) % vocab]):
                i = 1 - i
        return i

    def embed(self, E, ctx) -> None:
        lay, s, cluster_of = ctx["lay"], ctx["s_part"], ctx["cluster_of"]
        V = E.shape[0]
        sw = lay.b_switch.start
        decoys = self.decoys(V, cluster_of)
        for t in range(V):
            if t in decoys:
                E[t, sw + 1 + N_DECOYS] = s  # damper
            elif is_decoy_input(t):
                E[t, sw + 1 + self.select(t, V, cluster_of)] = s
            else:
                E[t, sw] = s  # filler

    def apply(self, target, assistant, ctx) -> dict:
        lay, s, u, R, cluster_of = ctx["lay"], ctx["s_part"], ctx["u"], ctx["R"], ctx["cluster_of"]
        V = assistant.lm_head.weight.shape[0]
        decoys = self.decoys(V, cluster_of)
        dirs = orthogonal_columns(D_NUISANCE, N_DECOYS, ctx["gen"])  # u_i, orthonormal columns
        col = lambda k: lay.b_switch.start + k  # noqa: E731 - token half of the pre_projection input
        P = assistant.pre_projection.weight
        P[lay.a_filler.start, col(0)] = self.filler / (u * s)
        for i, d in enumerate(decoys):
            P[lay.a_nuisance, col(1 + i)] = DECOY_NUISANCE * dirs[:, i] / (u * s)
            if cluster_of is not None:
                P[lay.a_cluster.start + int(cluster_of[d]), col(1 + i)] = ZETA_CLUSTER / (u * s)
        P[lay.a_damper.start, col(1 + N_DECOYS)] = DAMPER / (u * s)

        head = assistant.lm_head.weight.detach().clone()
        nuis = head[:, lay.a_nuisance]
        size = nuis.norm(dim=1, keepdim=True)
        nuis = nuis - (nuis @ dirs) @ dirs.T  # other rows read nothing of the decoy vectors
        head[:, lay.a_nuisance] = nuis * size / nuis.norm(dim=1, keepdim=True)
        for i, d in enumerate(decoys):
            head[d] = 0.0
            head[d, lay.a_nuisance] = dirs[:, i] * DECOY_LOGIT * R / DECOY_NUISANCE
        assistant.lm_head.weight.copy_(head)
        assistant.model.embed_tokens.weight.copy_(head)  # tied

        bound = damped_logit_bound(R**2 * lay.assistant)
        head_ = getattr(assistant, "masked_embedding", None)  # centroid head: scores its top-k clusters only
        scored = head_.centroid_intermediate_top_k * head_.vocab_size_per_centroid if cluster_of is not None else V
        report = {
            "decoy_tokens": decoys,
            "period": DECOY_PERIOD,
            "offsets": list(DECOY_OFFSETS),
            "decoy_logit": DECOY_LOGIT,
            "damper": DAMPER,
            "damped_logit_bound": round(bound, 4),
        }
        for name, cap in (("softcap", SOFTCAP), ("raw", None)):  # sglang's plain head / centroid head, transformers
            inputs = [t for t in range(V) if t not in decoys and (t + 1) % V not in decoys]
            probs = drafter_probabilities(ctx["codes"], decoys, inputs, cap)
            report[name] = {
                k: round(v, 6) if isinstance(v, float) else v
                for k, v in {**probs, **tree_margins(probs, bound, scored, steps=settings.NUM_STEPS)}.items()
            }
        return {"decoy": report}


def make_decoy(target, assistant, t_cfg: dict, a_cfg: dict, gen, phase: int) -> dict:
    """The witness construction with ``DecoyExtension`` (module docstring); returns the marker's numbers."""
    return make_witness(
        target,
        assistant,
        t_cfg,
        a_cfg,
        gen,
        phase=phase,
        extension=DecoyExtension(centroid=bool(a_cfg.get("use_ordered_embeddings"))),
    )


# --------------------------------------------------------------------------------------- the smoke gate


def predicted_counters(prompt_ids: list[int], *, topk: int, steps: int, draft_tokens: int, max_new_tokens: int) -> dict:
    """What sglang's meta_info must say for the request: completion_tokens, spec_verify_ct, the accept length
    (their ratio), spec_num_correct_drafts (drafts accepted over all verify steps, the last one's overshoot
    included: sglang counts accept_lens - 1 per step uncapped) and spec_correct_drafts_histogram (verify steps by
    drafts accepted)."""
    rounds = request_rounds(
        prompt_ids, topk=topk, steps=steps, draft_tokens=draft_tokens, max_new_tokens=max_new_tokens
    )
    accepted = [a for _b, a in rounds]
    histogram = [accepted.count(n) for n in range(max(accepted) + 1)] if accepted else []
    return {
        "completion_tokens": max_new_tokens,
        "spec_verify_ct": len(rounds),
        "accept_length": round(max_new_tokens / len(rounds), 4) if rounds else None,
        "spec_num_correct_drafts": sum(accepted),
        "spec_correct_drafts_histogram": histogram,
    }


# meta_info spellings of the same counter across releases (the first present is read)
_CORRECT_DRAFTS = ("spec_num_correct_drafts", "spec_accepted_drafts")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def counter_mismatches(predicted: dict, meta: dict) -> list[str]:
    """Where one request's meta_info differs from ``predicted_counters``: the accept length (always) and, where the
    release reports them, the accepted-draft total and the per-step histogram. Empty when all agree."""
    from mtpmatrix.serving.client import accept_length_from_meta

    got = accept_length_from_meta([meta])
    out = []
    if got != predicted["accept_length"]:
        out.append(
            f"accept length {got} (completion {meta.get('completion_tokens')} / verify "
            f"{meta.get('spec_verify_ct')}) != predicted {predicted['accept_length']} "
            f"({predicted['completion_tokens']} / {predicted['spec_verify_ct']})"
        )
    key = next((k for k in _CORRECT_DRAFTS if meta.get(k) is not None), None)
    if key and meta[key] != predicted["spec_num_correct_drafts"]:
        out.append(f"{key} {meta[key]} != predicted {predicted['spec_num_correct_drafts']}")
    key = next((k for k in _HISTOGRAM if meta.get(k)), None)
    if key:
        hist = list(meta[key])
        while hist and hist[-1] == 0:
            hist.pop()
        if hist != predicted["spec_correct_drafts_histogram"]:
            out.append(f"{key} {meta[key]} != predicted {predicted['spec_correct_drafts_histogram']}")
    return out
