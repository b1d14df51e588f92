"""Weights of the sampled pair: the ring of mtpmatrix.pairs.sampled.ring (its closed-form law) and the bonus region of
mtpmatrix.pairs.sampled.bonus, written into freshly initialised target and assistant models (tiny.build.build_pair)."""

from __future__ import annotations

import math

from mtpmatrix.pairs.sampled import bonus
from mtpmatrix.pairs.sampled.ring import (
    DRAFT_LOGITS,
    DRAFT_OTHER_LOGIT,
    EMBED_VALUE,
    OFFSETS,
    OTHER_LOGIT,
    RING_SIZE,
    RING_START,
    SOFTCAP,
    TARGET_LOGITS,
    check_exact,
)


def make_sampled(target, assistant, t_cfg: dict, a_cfg: dict) -> dict:
    """Overwrite freshly initialised fp32 ``target`` / ``assistant`` weights with the sampled construction; returns
    what the pair's marker keeps."""
    import torch

    from mtpmatrix.pairs.weights import centroid_cluster_of, write_target_head, zero_residual_writers

    text = t_cfg["text_config"]
    V, H = text["vocab_size"], text["hidden_size"]
    A = a_cfg["text_config"]["hidden_size"]
    if text.get("final_logit_softcapping") != SOFTCAP:
        raise ValueError(
            f"sampled pair assumes final_logit_softcapping {SOFTCAP}, template has "
            f"{text.get('final_logit_softcapping')}"
        )
    if 1 + RING_SIZE > min(H, A) or RING_START + RING_SIZE > V:
        raise ValueError(f"sampled pair: ring of {RING_SIZE} at {RING_START} does not fit (H {H}, A {A}, V {V})")
    if not bonus.fits(H, A, V):
        raise ValueError(
            f"sampled pair: region 2 ({bonus.R2_SIZE} tokens at {bonus.R2_START}, hidden dims from "
            f"{bonus.DIM_BASE}) does not fit (H {H}, A {A}, V {V})"
        )
    h = check_exact(H)
    f_of = [(t - RING_START) % RING_SIZE for t in range(V)]

    E = torch.zeros(V, H)
    E[:, 0] = EMBED_VALUE
    E[torch.arange(V), 1 + torch.tensor(f_of)] = EMBED_VALUE
    W = torch.zeros(V, H)
    W[:, 0] = OTHER_LOGIT / h
    Wa = torch.zeros(V, A)  # drafter head; its values need not be exact (the null does not depend on the drafter)
    ha = math.sqrt(A / 2)
    Wa[:, 0] = DRAFT_OTHER_LOGIT / ha
    for g in range(RING_SIZE):
        j = RING_START + g
        for d, lg, dl in zip(OFFSETS, TARGET_LOGITS, DRAFT_LOGITS):
            W[j, 1 + (g - d) % RING_SIZE] = (lg - OTHER_LOGIT) / h
            Wa[j, 1 + (g - d) % RING_SIZE] = (dl - DRAFT_OTHER_LOGIT) / ha
    # assistant: the token half of its input is sqrt(H) * E[t]; dims 0 and 1 + f go to the same assistant dims
    P = torch.zeros(A, 2 * H)
    scale = 1.0 / (H**0.5 * EMBED_VALUE)
    P[torch.arange(1 + RING_SIZE), torch.arange(1 + RING_SIZE)] = scale
    # region 2 (pairs.sampled.bonus): other tokens and hidden dims, the ring's entries untouched
    bonus.write_target(E, W, h)
    bonus.write_drafter(Wa, P, ha, scale)

    with torch.no_grad():
        write_target_head(target, E, W, "sampled")
        assistant.pre_projection.weight.copy_(P)
        assistant.model.embed_tokens.weight.copy_(Wa)  # tied lm_head
        assistant.lm_head.weight.copy_(Wa)
        zero_residual_writers(assistant.model)
        assistant.model.norm.weight.fill_(1.0)
        if a_cfg.get("use_ordered_embeddings"):  # centroid head: clusters holding the offsets' tokens score > 0
            C = a_cfg["num_centroids"]
            cluster_of = centroid_cluster_of(assistant, V, C)
            cw = torch.zeros(C, A)
            for f in range(RING_SIZE):
                for d in OFFSETS:
                    cw[cluster_of[RING_START + (f + d) % RING_SIZE], 1 + f] += 1.0
            if int((cw[:, 1 : 1 + RING_SIZE] > 0).sum(0).max()) > a_cfg["centroid_intermediate_top_k"]:
                raise ValueError("sampled pair: the offsets' tokens span more clusters than the centroid head keeps")
            bonus.write_centroids(cw, cluster_of, a_cfg["centroid_intermediate_top_k"])
            assistant.masked_embedding.centroids.weight.copy_(cw)
    return {
        "sampled": {
            "ring_start": RING_START,
            "ring_size": RING_SIZE,
            "offsets": list(OFFSETS),
            "target_logits": list(TARGET_LOGITS),
            "draft_logits": list(DRAFT_LOGITS),
            "normed_hidden": h,
            "bonus": bonus.marker(),
        }
    }
