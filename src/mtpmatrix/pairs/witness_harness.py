"""The witness pairs' CPU draft harness: Frozen-KV MTP drafting done by hand with transformers' modules (the target's
hidden states and KV as sglang's cache holds them, the assistant fed them step by step), intact or with one input
of the hand-off broken on purpose (``ABLATIONS``), so the reference tier can show that a witness drafts right only
when every input is right.
"""

from __future__ import annotations

from mtpmatrix.pairs.witness import REFERENCE_DRAFT_PHASE, physical_kv_layers

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
    layer's K (after RoPE) and V, as sglang's KV cache holds them: every position, also for sliding layers (a cache
    without a config has full layers; the sliding layers' attention masks still apply the window), so sequences
    longer than the window (the long witness) are read back whole."""
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():  # as the reference tier runs its models
        out = target(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            use_cache=True,
            past_key_values=DynamicCache(),
            output_hidden_states=True,
        )
    hidden = out.hidden_states[-1]
    cache = out.past_key_values
    kv = {}
    for i, layer in enumerate(getattr(cache, "layers", [])):
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel():
            kv[i] = (keys, layer.values)
    return hidden, kv


def draft_rounds(
    target,
    assistant,
    ids,
    text: dict,
    *,
    steps: int = 5,
    start: int,
    ablation: str | None = None,
    draft_phase: int = REFERENCE_DRAFT_PHASE,
    ranked_second=None,
):
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
    return draft_rounds_each(
        target,
        assistant,
        ids,
        text,
        (ablation,),
        steps=steps,
        start=start,
        draft_phase=draft_phase,
        ranked_second=ranked_second,
    )[ablation]


def draft_rounds_each(
    target,
    assistant,
    ids,
    text: dict,
    ablations,
    *,
    steps: int = 5,
    start: int,
    draft_phase: int = REFERENCE_DRAFT_PHASE,
    ranked_second=None,
) -> dict:
    """``{ablation: draft_rounds(..., ablation=ablation)}`` for each of ``ablations`` (None: intact), computed
    together: one target forward for all of them, and each draft step one assistant forward whose batch stacks every
    ablation's rows (plus one for the sibling ablation's extra state). Each row sees only its own request's inputs,
    so a row drafts what it drafts alone; the tiny drafter's Python overhead per forward, not its arithmetic, is
    what the separate calls paid for."""
    import torch

    cases = list(dict.fromkeys(ablations))
    for ablation in cases:
        if ablation is not None and ablation not in ABLATIONS:
            raise ValueError(f"unknown ablation {ablation!r}; known: {', '.join(ABLATIONS)}")
    hidden, layer_kv = target_states(target, ids)
    phys = physical_kv_layers(text)
    embed = target.get_input_embeddings()
    B, T = ids.shape
    n = len(cases)
    rows = {a: slice(c * B, (c + 1) * B) for c, a in enumerate(cases)}  # each case's rows in the stacked batch

    def layers_read(ablation):
        use = {t: idx[-1] for t, idx in phys.items()}
        if ablation == "kv_other_sliding_layer":
            use["sliding_attention"] = phys["sliding_attention"][-2]
        if ablation == "kv_other_full_layer":
            use["full_attention"] = phys["full_attention"][-2]
        return use

    uses = {a: layers_read(a) for a in cases}
    sibling = rows.get("tree_sibling_parent")
    correct = {a: torch.zeros(steps) for a in cases}
    leading = {a: [] for a in cases}
    rounds = 0
    decoys = {a: [0, 0] for a in cases}  # inputs ranked_second flags, of them ranked decoy first / target second
    with torch.inference_mode():
        for P in range(start, T - steps):
            hs, kvs, poss = [], {t: ([], []) for t in phys}, []
            for a in cases:
                h = hidden[:, P - 2 if a == "hidden_previous_position" else P - 1][:, None]
                kv = {t: (layer_kv[i][0][:, :, :P], layer_kv[i][1][:, :, :P]) for t, i in uses[a].items()}
                if a == "other_request_rows":
                    h = h.roll(1, dims=0)
                    kv = {t: (k.roll(1, dims=0), v.roll(1, dims=0)) for t, (k, v) in kv.items()}
                hs.append(h)
                for t, (k, v) in kv.items():
                    kvs[t][0].append(k)
                    kvs[t][1].append(v)
                pos = P - 1 + draft_phase + {"position_plus_one": 1, "position_minus_one": -1}.get(a, 0)
                poss.append(torch.full((B, 1), pos, dtype=torch.long))
            kv = {t: (torch.cat(k), torch.cat(v)) for t, (k, v) in kvs.items()}
            position_ids = torch.cat(poss)
            truth_rows = ids.repeat(n, 1)
            token, state = truth_rows[:, P : P + 1], torch.cat(hs)
            ok_so_far = torch.ones(n * B, dtype=torch.bool)
            n_lead = torch.zeros(n * B)
            prev = None  # (logits, state) of the forward that drafted ``token``, for the sibling ablation
            for k in range(steps):
                if sibling is not None and k >= 2:
                    top2 = prev[0][sibling].topk(2, dim=-1).indices  # the parent's best alternative to its token
                    alt = torch.where(top2[..., 0] == token[sibling], top2[..., 1], top2[..., 0])
                    state = state.clone()
                    state[sibling] = _assist(
                        assistant,
                        embed,
                        alt,
                        prev[1][sibling],
                        {t: (kk[sibling], vv[sibling]) for t, (kk, vv) in kv.items()},
                        position_ids[sibling],
                    )[1]
                logits, new_state = _assist(assistant, embed, token, state, kv, position_ids)
                prev = (logits, state)
                truth = truth_rows[:, P + 1 + k]
                top2 = logits[:, 0].topk(2, dim=-1).indices
                hit = top2[:, 0] == truth
                if ranked_second is not None:
                    flagged = torch.tensor([bool(ranked_second(int(x))) for x in token[:, 0]])
                    second = (top2[:, 0] != truth) & (top2[:, 1] == truth)
                    for a, r in rows.items():
                        decoys[a][0] += int(flagged[r].sum())
                        decoys[a][1] += int((flagged[r] & second[r]).sum())
                    hit = torch.where(flagged, second, hit)
                    token = truth[:, None]  # verify follows the target's token down the tree
                else:
                    token = logits.argmax(-1)
                state = new_state
                for a, r in rows.items():
                    correct[a][k] += hit[r].float().sum()
                ok_so_far &= hit
                n_lead += ok_so_far.float()
            for a, r in rows.items():
                leading[a].append(n_lead[r])
            rounds += B
    out = {}
    for a in cases:
        acc = (correct[a] / max(1, rounds)).tolist()
        out[a] = {
            "rounds": rounds,
            "step_accuracy": [round(x, 4) for x in acc],
            "accepted_drafts": round(float(torch.cat(leading[a]).mean()), 4) if leading[a] else None,
        }
        if ranked_second is not None:
            d = decoys[a]
            out[a]["decoys_ranked"] = round(d[1] / d[0], 4) if d[0] else None
    return out


def _assist(assistant, embed, token, state, kv, position_ids):
    import torch

    x = torch.cat([embed(token).to(state.dtype), state], dim=-1)
    out = assistant(inputs_embeds=x, position_ids=position_ids, shared_kv_states=kv, use_cache=False)
    return out.logits, out.last_hidden_state
