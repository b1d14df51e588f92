"""The witness pairs' CPU draft harness: Frozen-KV MTP drafting done by hand with transformers' modules (the target's
hidden states and KV as sglang's cache holds them, the assistant fed them step by step), intact or with one input
of the hand-off broken on purpose (``ABLATIONS``), so the reference tier can show that a witness drafts right only
when every input is right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mtpmatrix.pairs.witness.layout import physical_kv_layers
from mtpmatrix.pairs.witness.phase import REFERENCE_DRAFT_PHASE

ABLATIONS = (
    "hidden_previous_position",  # the seed's hidden state comes from the position before the last accepted one
    "kv_other_sliding_layer",  # the sliding layers read another physical sliding layer's KV
    "kv_other_full_layer",  # the full layers read another physical full layer's KV
    "position_plus_one",  # draft queries one position later
    "position_minus_one",  # draft queries one position earlier
    "other_request_rows",  # hidden state and KV of the next request in the batch
    "tree_sibling_parent",  # topk > 1: from the third draft on, a node gets its parent's sibling's state
)


@dataclass(frozen=True)
class RoundPlan:
    """Which draft rounds to run over known greedy sequences, and how a draft is scored (``draft_rounds``)."""

    start: int  # the first bonus position
    steps: int = 5  # drafts per round
    draft_phase: int = REFERENCE_DRAFT_PHASE  # the query's position after the last accepted token's key
    ranked_second: Callable[[int], bool] | None = None  # inputs where the target's token is to rank second


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


def draft_rounds(target, assistant, ids, text: dict, plan: RoundPlan, ablation: str | None = None) -> dict:
    """Draft ``plan.steps`` tokens (greedy chain, the Frozen-KV seeding: bonus token + the target's hidden state at
    the last accepted position) from every bonus position ``P`` in ``plan.start .. len - steps - 1`` of the known
    greedy sequences ``ids`` [batch, len], the query at ``plan.draft_phase`` positions after the last accepted token's
    key (the target's keys sit at 0-based positions here), with every input intact or one ``ablation`` applied.
    Returns per-step accuracy (fraction of rounds whose k-th draft equals the target's token) and the mean number of
    leading correct drafts per round (what a verifier would accept).

    ``plan.ranked_second(input token) -> bool`` (the decoy witness's decoy inputs): there the drafter is to rank the
    target's token second, behind a decoy. Then every step is fed the target's token (the tree branch verify
    follows, whatever its rank), a draft counts as right when the target's token is its first choice or, at those
    inputs, its second behind a wrong first; ``decoys_ranked`` is the share of those inputs where it was so.
    """
    return draft_rounds_each(target, assistant, ids, text, (ablation,), plan)[ablation]


def draft_rounds_each(target, assistant, ids, text: dict, ablations, plan: RoundPlan) -> dict:
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
    B, T = ids.shape
    rows = {a: slice(c * B, (c + 1) * B) for c, a in enumerate(cases)}  # each case's rows in the stacked batch
    drafter = _Drafter(assistant, target.get_input_embeddings(), plan, sibling=rows.get("tree_sibling_parent"))
    uses = {a: _layers_read(phys, a) for a in cases}
    tally = _Tally(cases, rows, plan.steps)
    with torch.inference_mode():
        for P in range(plan.start, T - plan.steps):
            state, kv, position_ids = _round_inputs(hidden, layer_kv, uses, P, plan.draft_phase)
            leading = drafter.round(ids.repeat(len(cases), 1), P, state, kv, position_ids, tally)
            tally.add_round(leading, B)
    return tally.summary(plan.ranked_second is not None)


def _layers_read(phys: dict[str, list[int]], ablation: str | None) -> dict[str, int]:
    """The physical layer each attention type reads its KV from: the one sglang binds, or the other under an
    ablation of that type."""
    use = {t: idx[-1] for t, idx in phys.items()}
    if ablation == "kv_other_sliding_layer":
        use["sliding_attention"] = phys["sliding_attention"][-2]
    if ablation == "kv_other_full_layer":
        use["full_attention"] = phys["full_attention"][-2]
    return use


def _round_inputs(hidden, layer_kv, uses: dict, P: int, draft_phase: int):
    """The stacked seed state, KV and draft positions of the round at bonus position ``P``, every case's rows with
    its own ablation applied."""
    import torch

    B = hidden.shape[0]
    hs, kvs, poss = [], {t: ([], []) for t in next(iter(uses.values()))}, []
    for a, use in uses.items():
        h = hidden[:, P - 2 if a == "hidden_previous_position" else P - 1][:, None]
        kv = {t: (layer_kv[i][0][:, :, :P], layer_kv[i][1][:, :, :P]) for t, i in use.items()}
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
    return torch.cat(hs), kv, torch.cat(poss)


class _Drafter:
    """The assistant drafting one round's chains for every case at once (its rows stacked in one batch)."""

    def __init__(self, assistant, embed, plan: RoundPlan, sibling: slice | None):
        self.assistant, self.embed, self.plan = assistant, embed, plan
        self.sibling = sibling  # the rows of the sibling-parent ablation, if it is one of the cases

    def round(self, truth_rows, P: int, state, kv, position_ids, tally: _Tally):
        """Draft ``plan.steps`` tokens from bonus position ``P``; tallies each step, returns the leading correct
        drafts of every row."""
        import torch

        token = truth_rows[:, P : P + 1]
        ok_so_far = torch.ones(truth_rows.shape[0], dtype=torch.bool)
        n_lead = torch.zeros(truth_rows.shape[0])
        prev = None  # (logits, state) of the forward that drafted ``token``, for the sibling ablation
        for k in range(self.plan.steps):
            if self.sibling is not None and k >= 2:
                state = self._sibling_state(prev, token, state, kv, position_ids)
            logits, new_state = _assist(self.assistant, self.embed, token, state, kv, position_ids)
            prev = (logits, state)
            hit, token = self._score(logits, token, truth_rows[:, P + 1 + k], tally)
            state = new_state
            tally.add_step(k, hit)
            ok_so_far &= hit
            n_lead += ok_so_far.float()
        return n_lead

    def _sibling_state(self, prev, token, state, kv, position_ids):
        """The sibling-parent rows' state replaced by what their parent's best alternative token would hand on."""
        import torch

        s = self.sibling
        top2 = prev[0][s].topk(2, dim=-1).indices  # the parent's best alternative to its token
        alt = torch.where(top2[..., 0] == token[s], top2[..., 1], top2[..., 0])
        state = state.clone()
        state[s] = _assist(
            self.assistant,
            self.embed,
            alt,
            prev[1][s],
            {t: (kk[s], vv[s]) for t, (kk, vv) in kv.items()},
            position_ids[s],
        )[1]
        return state

    def _score(self, logits, token, truth, tally: _Tally):
        """(whether each row drafted right, the token each row is fed next)."""
        import torch

        top2 = logits[:, 0].topk(2, dim=-1).indices
        hit = top2[:, 0] == truth
        if self.plan.ranked_second is None:
            return hit, logits.argmax(-1)
        flagged = torch.tensor([bool(self.plan.ranked_second(int(x))) for x in token[:, 0]])
        second = (top2[:, 0] != truth) & (top2[:, 1] == truth)
        tally.add_decoys(flagged, second)
        return torch.where(flagged, second, hit), truth[:, None]  # verify follows the target's token down the tree


class _Tally:
    """Per case: right drafts per step, leading right drafts per round, and the decoy inputs ranked as built."""

    def __init__(self, cases: list, rows: dict, steps: int):
        import torch

        self.rows = rows
        self.correct = {a: torch.zeros(steps) for a in cases}
        self.leading: dict = {a: [] for a in cases}
        self.decoys = {
            a: [0, 0] for a in cases
        }  # inputs ranked_second flags, of them ranked decoy first / target second
        self.rounds = 0

    def add_step(self, k: int, hit) -> None:
        for a, r in self.rows.items():
            self.correct[a][k] += hit[r].float().sum()

    def add_decoys(self, flagged, second) -> None:
        for a, r in self.rows.items():
            self.decoys[a][0] += int(flagged[r].sum())
            self.decoys[a][1] += int((flagged[r] & second[r]).sum())

    def add_round(self, n_lead, batch: int) -> None:
        for a, r in self.rows.items():
            self.leading[a].append(n_lead[r])
        self.rounds += batch

    def summary(self, with_decoys: bool) -> dict:
        import torch

        out = {}
        for a, correct in self.correct.items():
            acc = (correct / max(1, self.rounds)).tolist()
            out[a] = {
                "rounds": self.rounds,
                "step_accuracy": [round(x, 4) for x in acc],
                "accepted_drafts": round(float(torch.cat(self.leading[a]).mean()), 4) if self.leading[a] else None,
            }
            if with_decoys:
                d = self.decoys[a]
                out[a]["decoys_ranked"] = round(d[1] / d[0], 4) if d[0] else None
        return out


def _assist(assistant, embed, token, state, kv, position_ids):
    import torch

    x = torch.cat([embed(token).to(state.dtype), state], dim=-1)
    out = assistant(inputs_embeds=x, position_ids=position_ids, shared_kv_states=kv, use_cache=False)
    return out.logits, out.last_hidden_state
