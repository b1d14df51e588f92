"""A CPU model of sglang's sampled speculative verify on the sampled pair, correct or deliberately broken, to show
what the smoke tier's sampled check (pairs.sampled.ring.check_outputs) detects at its sample size.

Verify model: ``tree_speculative_sampling_target_only`` (sgl-kernel speculative_sampling.cuh, used by sglang
0.5.13-0.5.23 whenever a batch is not all greedy). Drafts are deterministic (the drafter's top-k), so q is a point
mass and "accept with min(1, p/q)" reads "accept with p". Per tree level, one coin u for the current node: its
children are tried in draft order with a running sum prob_acc of their target probabilities, and child c is accepted
when ``u <= prob_acc / threshold_acc`` or ``p(c) >= threshold_single`` (both thresholds 1.0 by default: exactly
"sample x ~ p and accept the child equal to x"). When no child is accepted, the rejected children's probabilities
are removed from p and the token is drawn from the rest with a fresh coin scaled by its sum (``u * sum``): the
residual renormalised. When every level is accepted, the bonus token is drawn from p itself.

Target probabilities in verify: softmax(logits / T), top_k_renorm, top_p_renorm (top-k first); the normal sampler
(no-MTP server) applies top-k and top-p jointly. Both are pairs.sampled.ring.token_distribution. The target's distribution
depends only on the offset from the previous token, so one vector over ring offsets serves every tree node.

Tree model (topk > 1): sglang's EAGLE tree: ``NUM_STEPS`` levels, each beam expands its topk children by draft
score, the best topk of them become the next beams, and the best ``draft_tokens - 1`` of all generated nodes by
cumulative draft log-probability form the tree (ancestors score higher than their children, so it is a tree).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mtpmatrix.core import settings
from mtpmatrix.pairs.sampled import ring

VOCAB = 512  # the tiny pairs' vocabulary (tiny.vocab.VOCAB)

# Broken verifies: name -> what is broken (each a catalogue class of issue #19).
BUGS = {
    "none": "correct verify (the null: must pass at the stated false-alarm rate)",
    "temperature_ignored": "verify's target softmax at temperature 1, not the request's",
    "top_k_skipped": "verify skips top_k_renorm_prob",
    "top_p_skipped": "verify skips top_p_renorm_prob",
    "renorm_skipped": "verify skips both top-k and top-p renormalisation",
    "threshold_acc_0.5": "accept when u <= 2 * prob_acc (speculative_accept_threshold_acc 0.5)",
    "threshold_single_0.15": "also accept any draft with target probability >= 0.15 (threshold_single 0.15)",
    "prob_acc_not_summed": "sibling k accepted when u <= p(sibling k), not the running sum over siblings",
    "residual_not_renormalised": "residual drawn with u, not u * sum: the leftover mass falls to the last valid id",
    "rejected_not_removed": "residual drawn from p, rejected drafts left in",
    "row_one_position_early": "after an accepted draft, the residual/bonus token is drawn from the row of the "
    "position before (the target's distribution given the wrong previous token)",
}


def _offset_vector(dist: dict) -> list[float]:
    """Probability per ring offset 0..RING_SIZE-1 (the off-offset mass of a broken filter is negligible here)."""
    v = [0.0] * ring.RING_SIZE
    for d in ring.OFFSETS:
        v[d % ring.RING_SIZE] = dist[d]
    return v


def verify_probs(group: ring.SamplingGroup, bug: str) -> list[float]:
    kw = {}
    if bug == "temperature_ignored":
        kw["temperature"] = 1.0
    if bug in ("top_k_skipped", "renorm_skipped"):
        kw["apply_top_k"] = False
    if bug in ("top_p_skipped", "renorm_skipped"):
        kw["apply_top_p"] = False
    return _offset_vector(ring.token_distribution(VOCAB, group, "top_k_first", **kw))


def draft_tree(topk: int) -> list[tuple[int, int]]:
    """Nodes (parent index, offset) in draft order, parent -1 = the last accepted token; children of a node appear
    in the drafter's rank order."""
    z = [math.exp(x) for x in ring.DRAFT_LOGITS]
    logq = {d: math.log(w / sum(z)) for d, w in zip(ring.OFFSETS, z)}
    ranked = sorted(ring.OFFSETS, key=lambda d: -logq[d])[:topk]
    if topk == 1:
        return [(i - 1, ranked[0]) for i in range(settings.NUM_STEPS)]
    nodes: list[tuple[float, int, int]] = []  # (score, parent, offset)
    beams = [(0.0, -1)]
    for _ in range(settings.NUM_STEPS):
        cand = []
        for score, parent in beams:
            for d in ranked:
                nodes.append((score + logq[d], parent, d))
                cand.append((score + logq[d], len(nodes) - 1))
        beams = sorted(cand, key=lambda c: -c[0])[:topk]
    keep = sorted(sorted(range(len(nodes)), key=lambda i: -nodes[i][0])[: settings.DRAFT_TOKENS[topk] - 1])
    index = {old: new for new, old in enumerate(keep)}
    return [(index.get(nodes[i][1], -1) if nodes[i][1] >= 0 else -1, nodes[i][2]) for i in keep]


def verify_round(
    p: list[float], tree: list[tuple[int, int]], bug: str, rng: random.Random, ring_index: int
) -> list[int]:
    """One verify: the offsets it emits (accepted drafts, then the residual or bonus token)."""
    children: dict[int, list[int]] = {}
    for i, (parent, _d) in enumerate(tree):
        children.setdefault(parent, []).append(i)
    thr_acc = 0.5 if bug == "threshold_acc_0.5" else 1.0
    thr_single = 0.15 if bug == "threshold_single_0.15" else 1.0
    out: list[int] = []
    cur, rejected = -1, []
    while True:
        u, acc, taken = rng.random(), 0.0, None
        rejected = []
        for c in children.get(cur, []):
            pc = p[tree[c][1]]
            acc = pc if bug == "prob_acc_not_summed" else acc + pc
            if u <= acc / thr_acc or pc >= thr_single:
                taken = c
                break
            rejected.append(tree[c][1])
        if taken is None:
            break
        out.append(tree[taken][1])
        cur = taken
    res = list(p)  # at a leaf (every level accepted) nothing was rejected: the bonus token comes from p itself
    if bug != "rejected_not_removed":
        for d in rejected:
            res[d] = 0.0
    total = sum(res)
    u = rng.random() * (1.0 if bug == "residual_not_renormalised" else total)
    cum, pick = 0.0, None
    for d in range(len(res)):
        cum += res[d]
        if res[d] > 0 and cum > u:
            pick = d
            break
    if pick is None:  # the kernel's fallback: the last valid (largest) token id of the residual
        f = (ring_index + sum(out)) % ring.RING_SIZE
        pick = max((d for d in range(len(res)) if res[d] > 0), key=lambda d: (f + d) % ring.RING_SIZE)
    if bug == "row_one_position_early" and out:  # drawn as the successor of the token before the last accepted
        pick = (pick - out[-1]) % ring.RING_SIZE
    return out + [pick]


def normal_sample(p: list[float], rng: random.Random) -> int:
    return rng.choices(range(len(p)), weights=p)[0]


@dataclass(frozen=True)
class ServerModel:
    topk: int | None  # None: the no-MTP server (normal sampler, top-k and top-p jointly)
    bug: str = "none"

    def outputs(
        self, rng: random.Random, n_requests: int = ring.N_REQUESTS, new_tokens: int = ring.NEW_TOKENS
    ) -> tuple[list, list]:
        """(prompts, outputs) of the smoke request plan, as token ids."""
        plan = ring.request_plan(n_requests, new_tokens)
        tree = draft_tree(self.topk) if self.topk else None
        probs = {}
        for g in ring.GROUPS:
            if self.topk:
                probs[g] = verify_probs(g, self.bug)
            else:
                probs[g] = _offset_vector(ring.token_distribution(VOCAB, g, "joint"))
        prompts, outputs = [], []
        for req in plan:
            tok, out = req.prompt[-1], []
            while len(out) < req.new_tokens:
                if tree is None:
                    offs = [normal_sample(probs[req.group], rng)]
                else:
                    offs = verify_round(probs[req.group], tree, self.bug, rng, ring.ring_index(tok))
                for d in offs:
                    tok = ring.next_token(tok, d)
                    out.append(tok)
            prompts.append(req.prompt)
            outputs.append(out[: req.new_tokens])
        return prompts, outputs


def detection_rate(model: ServerModel, replicates: int, seed: int = 0) -> tuple[float, list[float]]:
    """Share of ``replicates`` simulated smoke runs whose check fails, and their p-values (0 for off-support)."""
    rng = random.Random(seed)
    fails, pvals = 0, []
    for _ in range(replicates):
        prompts, outputs = model.outputs(rng)
        check = ring.check_outputs(prompts, outputs, VOCAB)
        fails += not check.passed
        pvals.append(0.0 if check.off_support else check.p_value)
    return fails / replicates, pvals
