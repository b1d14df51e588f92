"""The witness pairs' CPU draft harness: Frozen-KV MTP drafting done by hand with transformers' modules (the target's
hidden states and KV as sglang's cache holds them, the assistant fed them step by step), intact or with one input
of the hand-off broken on purpose (``ABLATIONS``), so the reference tier can show that a witness drafts right only
when every input is right.
"""

from __future__ import annotations

from mtpmatrix.tiers.pairs.witness import REFERENCE_DRAFT_PHASE, physical_kv_layers

ABLATIONS = (
    "hidden_previous_position",  # the seed's hidden state comes from the position before the last accepted one
    "kv_other_sliding_layer",  # the sliding layers read another physical sliding layer's KV
    "kv_other_full_layer",  # the full layers read another physical full layer's KV
    "position_plus_one",  # draft queries one position later
    "position_minus_one",  # draft queries one position earlier
    "other_request_rows",  # hidden state and KV of the next request in the batch
    "tree_sibling_parent",  # topk > 1: from the third draft on, a node gets its parent's sibling's state
)


def target_states(target, ids):
    """One target forward over whole sequences: the post-norm hidden state at every position and each physical
    layer's K (after RoPE) and V, as sglang's KV cache holds them."""
    import torch

    with torch.inference_mode():  # as the reference tier runs its models
        out = target(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    cache = out.past_key_values
    kv = {}
    for i, layer in enumerate(getattr(cache, "layers", [])):
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel():
            kv[i] = (keys, layer.values)
    return hidden, kv


def draft_rounds(target, assistant, ids, text: dict, *, steps: int = 5, start: int, ablation: str | None = None,
                 draft_phase: int = REFERENCE_DRAFT_PHASE, ranked_second=None):
    """Draft ``steps`` tokens (greedy chain, the Frozen-KV seeding: bonus token + the target's hidden state at the
    last accepted position) from every bonus position ``P`` in ``start .. len - steps - 1`` of the known greedy
    sequences ``ids`` [batch, len], the query at ``draft_phase`` positions after the last accepted token's key (the
    target's keys sit at 0-based positions here), with every input intact or one ``ablation`` applied. Returns
    per-step accuracy (fraction of rounds whose k-th draft equals the target's token) and the mean number of leading
    correct drafts per round (what a verifier would accept).

    ``ranked_second(input token) -> bool`` (the decoy witness's decoy inputs): there the drafter is to rank the
    target's token second, behind a decoy. Then every step is fed the target's token (the tree branch verify
    follows, whatever its rank), a draft counts as right when the target's token is its first choice or, at those
    inputs, its second behind a wrong first; ``decoys_ranked`` is the share of those inputs where it was so.
    """
    import torch

    if ablation is not None and ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; known: {', '.join(ABLATIONS)}")
    hidden, layer_kv = target_states(target, ids)
    phys = physical_kv_layers(text)
    use = {t: idx[-1] for t, idx in phys.items()}
    if ablation == "kv_other_sliding_layer":
        use["sliding_attention"] = phys["sliding_attention"][-2]
    if ablation == "kv_other_full_layer":
        use["full_attention"] = phys["full_attention"][-2]
    embed = target.get_input_embeddings()
    B, T = ids.shape
    correct = torch.zeros(steps)
    leading = []
    rounds = 0
    decoys = [0, 0]  # inputs ranked_second flags, of them ranked decoy first / target second
    with torch.inference_mode():
        for P in range(start, T - steps):
            h = hidden[:, P - 2 if ablation == "hidden_previous_position" else P - 1][:, None]
            kv = {t: (layer_kv[i][0][:, :, :P], layer_kv[i][1][:, :, :P]) for t, i in use.items()}
            if ablation == "other_request_rows":
                h = h.roll(1, dims=0)
                kv = {t: (k.roll(1, dims=0), v.roll(1, dims=0)) for t, (k, v) in kv.items()}
            pos = P - 1 + draft_phase + {"position_plus_one": 1, "position_minus_one": -1}.get(ablation, 0)
            position_ids = torch.full((B, 1), pos, dtype=torch.long)
            token, state = ids[:, P:P + 1], h
            ok_so_far = torch.ones(B, dtype=torch.bool)
            n_lead = torch.zeros(B)
            prev = None  # (logits, state) of the forward that drafted ``token``, for the sibling ablation
            for k in range(steps):
                if ablation == "tree_sibling_parent" and k >= 2:
                    top2 = prev[0].topk(2, dim=-1).indices  # the parent's best alternative to the token it fed
                    sibling = torch.where(top2[..., 0] == token, top2[..., 1], top2[..., 0])
                    state = _assist(assistant, embed, sibling, prev[1], kv, position_ids)[1]
                logits, new_state = _assist(assistant, embed, token, state, kv, position_ids)
                prev = (logits, state)
                truth = ids[:, P + 1 + k]
                top2 = logits[:, 0].topk(2, dim=-1).indices
                hit = top2[:, 0] == truth
                if ranked_second is not None:
                    flagged = torch.tensor([bool(ranked_second(int(x))) for x in token[:, 0]])
                    second = (top2[:, 0] != truth) & (top2[:, 1] == truth)
                    decoys[0] += int(flagged.sum())
                    decoys[1] += int((flagged & second).sum())
                    hit = torch.where(flagged, second, hit)
                    token = truth[:, None]  # verify follows the target's token down the tree
                else:
                    token = logits.argmax(-1)
                state = new_state
                correct[k] += hit.float().sum()
                ok_so_far &= hit
                n_lead += ok_so_far.float()
            leading.append(n_lead)
            rounds += B
    acc = (correct / max(1, rounds)).tolist()
    out = {"rounds": rounds, "step_accuracy": [round(a, 4) for a in acc],
           "accepted_drafts": round(float(torch.cat(leading).mean()), 4) if leading else None}
    if ranked_second is not None:
        out["decoys_ranked"] = round(decoys[1] / decoys[0], 4) if decoys[0] else None
    return out


def _assist(assistant, embed, token, state, kv, position_ids):
    import torch

    x = torch.cat([embed(token).to(state.dtype), state], dim=-1)
    out = assistant(inputs_embeds=x, position_ids=position_ids, shared_kv_states=kv, use_cache=False)
    return out.logits, out.last_hidden_state
