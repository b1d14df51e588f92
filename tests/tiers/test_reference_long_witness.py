"""Reference tier (transformers, CPU): the long witness (mtpmatrix.pairs.long_witness), the pair whose next token is
decided by attention at the sliding window's edge and by a key token far outside it, proven against transformers'
own modules before any server runs it (issue #38).

  * ``test_long_witness_greedy_follows_rule``: plain greedy ``generate`` (transformers' sliding-window cache) from
    prompts longer than the window to the context limit equals the rule token for token;
  * ``test_long_witness_assisted_equals_greedy``: transformers' own assisted generation with the pair's drafter,
    to the context limit, equals the rule and accepts (nearly) every draft. transformers cannot crop a sliding-window
    cache that has seen more tokens than the window (``DynamicSlidingWindowLayer.crop`` raises; assisted decoding
    crops whenever a draft is rejected), so the target gets a cache of full layers (``DynamicCache()``, no config),
    as sglang's pool without hybrid SWA memory holds it; the sliding layers' masks still apply the window;
  * ``test_long_witness_faults_change_output``: a window one wider or narrower, a position offset between two
    chunks, a window on the full layers: each changes the output, to exactly the tokens the construction predicts;
  * ``test_long_witness_drafts_need_their_kv``: the drafter, fed as sglang feeds it, drafts every token right, and
    reading another layer's KV or drafting a position off takes it to (nearly) nothing.
"""

from __future__ import annotations

import json

import pytest

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.tiny.build import PAIR_NAMES
from mtpmatrix.tiers import reference_models
from mtpmatrix.tiers.reference_models import one_thread_torch

pytestmark = pytest.mark.reference

VARIANT = "long-witness"
PROMPT_LEN = 160  # two and a half windows: every generated token reads a body token 63 back, the key 158+ back
GREEDY_PROMPTS = 2  # two keys (groups 0 and 1), generated side by side
DRAFT_TOKENS = 3
ACCEPT_RATE_MIN = 0.95  # every draft of the intact drafter is right; the bar leaves room for rounding only
DRAFT_INTACT_MIN = 0.95
DRAFT_ABLATED_MAX = 0.25  # share of the intact accuracy a broken input may keep (the witness's bar)
DRAFT_SPAN = 12  # draft rounds per sequence in the harness (from PROMPT_LEN on): 24 rounds of 5 drafts in all
OFFSET_BOUNDARY = 128  # the position after which a "chunk" sits one position off
MIN_CHANGED = 32  # every fault must change at least this many of the predicted tokens


def _text(build_tiny_pair, name: str, variant: str = VARIANT) -> dict:
    return json.loads((build_tiny_pair(name, variant).target / "config.json").read_text())["text_config"]


def _first_diff(got: list[int], want: list[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"new token {i}: {got[i : i + 4]} vs {want[i : i + 4]}"


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", PAIR_NAMES)
def test_long_witness_greedy_follows_rule(load_pair, build_tiny_pair, record_property, name):
    """Plain greedy decoding (transformers' own sliding-window cache) past the window, to the context limit, follows
    the long witness's rule: each token from the member at the window's edge and the key's group 158+ tokens back."""
    from mtpmatrix.pairs import long_witness as lw

    torch = one_thread_torch()
    target, _assistant, _tok = load_pair(name, VARIANT)
    text = _text(build_tiny_pair, name)
    limit = text["max_position_embeddings"]
    prompts = lw.prompts(GREEDY_PROMPTS, PROMPT_LEN)
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=limit - PROMPT_LEN, do_sample=False
        )
    record_property("new_tokens", out.shape[1] - PROMPT_LEN)
    for row, prompt in enumerate(prompts):
        want = lw.expected_continuation(prompt, limit, text["sliding_window"])
        got = out[row, PROMPT_LEN:].tolist()
        if got != want:
            raise CheckFailure("mismatch", f"{name}: greedy breaks the long witness's rule at {_first_diff(got, want)}")


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", PAIR_NAMES)
def test_long_witness_assisted_equals_greedy(load_pair, build_tiny_pair, record_property, name):
    """transformers' own assisted generation with the long witness's drafter (built for transformers' draft phase),
    from a prompt longer than the window to the context limit: the rule's tokens, nearly every draft accepted."""
    from transformers import DynamicCache

    from mtpmatrix.pairs import long_witness as lw

    torch = one_thread_torch()
    target, assistant, _tok = load_pair(name, VARIANT)
    assistant.generation_config.num_assistant_tokens = DRAFT_TOKENS
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    text = _text(build_tiny_pair, name)
    limit = text["max_position_embeddings"]
    prompt = lw.prompts(1, PROMPT_LEN, seed=1)[0]
    stats: list = []  # (drafted, accepted, round) per verify round
    ids = torch.tensor([prompt])
    try:
        with torch.inference_mode(), reference_models.count_acceptance(stats):
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                assistant_model=assistant,
                past_key_values=DynamicCache(),  # full layers: transformers cannot crop a sliding one past the window
                max_new_tokens=limit - PROMPT_LEN,
                do_sample=False,
            )
    except Exception as exc:
        raise CheckFailure("crash", f"{name}: assisted generate failed: {type(exc).__name__}: {exc}") from exc
    want = lw.expected_continuation(prompt, limit, text["sliding_window"])
    got = out[0, PROMPT_LEN:].tolist()
    drafted, accepted = sum(d for d, _a, _r in stats), sum(a for _d, a, _r in stats)
    rate = accepted / drafted if drafted else 0.0
    record_property("rounds", len(stats))
    record_property("drafted", drafted)
    record_property("accepted", accepted)
    record_property("accept_rate", round(rate, 4))
    if got != want:
        raise CheckFailure("mismatch", f"{name}: assisted generation breaks the rule at {_first_diff(got, want)}")
    if rate < ACCEPT_RATE_MIN:
        raise CheckFailure(
            "acceptance",
            f"{name}: transformers accepts {accepted}/{drafted} long-witness drafts (bar {ACCEPT_RATE_MIN})",
        )


def _masks(torch, T: int, window: dict, batch: int):
    """Additive [batch, 1, T, T] masks per layer type: causal, and ``window[type]`` positions (None: no window)."""
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    out = {}
    for ltype, w in window.items():
        keep = (k <= q) & ((q - k < w) if w else torch.ones(T, T, dtype=torch.bool))
        m = torch.zeros(T, T).masked_fill(~keep, torch.finfo(torch.float32).min)
        out[ltype] = m[None, None].expand(batch, 1, T, T)
    return out


# fault -> (sliding window, full-layer window, positions shift after OFFSET_BOUNDARY); W = the pair's window
FAULTS = {
    "intact": (0, None, 0),
    "sliding_window_one_wider": (1, None, 0),
    "sliding_window_one_narrower": (-1, None, 0),
    "chunk_positions_one_back": (0, None, -1),
    "chunk_positions_two_on": (0, None, 2),
    "full_layer_windowed": (0, 0, 0),
}


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", PAIR_NAMES)
def test_long_witness_faults_change_output(load_pair, build_tiny_pair, record_property, name):
    """Each attention fault past the window changes the long witness's output deterministically: teacher forced over
    the rule's sequences (one forward each, the masks and positions given to the text model), the target's tokens
    equal ``long_witness.predicted_next`` under the fault, token for token, and the fault changes at least
    MIN_CHANGED of them. A window one wider reads the trap just outside; one narrower, the next-best offset inside;
    a chunk two positions on or one back, a neighbour (one on is absorbed: the trap then sits at the edge's
    token); a windowed full layer loses the key (null group)."""
    from mtpmatrix.pairs import long_witness as lw

    torch = one_thread_torch()
    target, _assistant, _tok = load_pair(name, VARIANT)
    text = _text(build_tiny_pair, name)
    W, limit = text["sliding_window"], text["max_position_embeddings"]
    seqs = [p + lw.expected_continuation(p, limit, W) for p in lw.prompts(GREEDY_PROMPTS, PROMPT_LEN)]
    ids = torch.tensor(seqs)
    lm = target.model.language_model
    start = PROMPT_LEN - 1  # predictions of the generated tokens
    intact = None
    problems = []
    for fault, (dw, full_w, shift) in FAULTS.items():
        pos = torch.arange(limit)
        pos = torch.where(pos >= OFFSET_BOUNDARY, pos + shift, pos)
        masks = _masks(
            torch, limit, {"sliding_attention": W + dw, "full_attention": full_w if full_w is None else W}, len(seqs)
        )
        with torch.inference_mode():
            hidden = lm(
                input_ids=ids, attention_mask=masks, position_ids=pos[None].expand(len(seqs), -1)
            ).last_hidden_state
            got = target.lm_head(hidden).argmax(-1)[:, start:-1].tolist()
        want = [
            lw.predicted_next(s, text, visible_max=W + dw - 1, positions=pos.tolist(), key_visible=full_w is None)[
                start:-1
            ]
            for s in seqs
        ]
        if fault == "intact":
            intact = want
            if want != [s[start + 1 :] for s in seqs]:
                problems.append("intact: the prediction is not the rule (the construction's model is wrong)")
        # positions whose read a repeated RoPE position splits are not predicted (None): left out of both
        got = [[g if w is not None else None for g, w in zip(gr, wr)] for gr, wr in zip(got, want)]
        changed = sum(a != b for w, i in zip(want, intact) for a, b in zip(w, i) if a is not None)
        record_property(fault, json.dumps({"changed": changed, "equal_prediction": got == want}))
        if got != want:
            problems.append(f"{fault}: {_first_diff(got[0], want[0])}")
        elif fault != "intact" and changed < MIN_CHANGED:
            problems.append(f"{fault}: changes only {changed} tokens")
    if problems:
        raise CheckFailure("mismatch", f"{name}: long witness under faults: " + "; ".join(problems))


@pytest.mark.check("acceptance")
@pytest.mark.parametrize("name,variant", [(n, v) for v in (VARIANT, f"{VARIANT}-sglang-phase") for n in PAIR_NAMES])
def test_long_witness_drafts_need_their_kv(load_pair, build_tiny_pair, record_property, name, variant):
    """The long witness's drafter (Frozen-KV seeding, the query at the draft phase its variant is built for) drafts
    every token right past the window, and each ablation of what it reads -- another physical layer's KV of either
    type, draft positions one off either way -- takes the accuracy of its drafts to at most DRAFT_ABLATED_MAX of
    that. It is blind by construction to the seed hidden state's content and to tree parents (the witness pairs
    check those hand-offs)."""
    from mtpmatrix.pairs import long_witness as lw
    from mtpmatrix.pairs.witness import harness
    from mtpmatrix.pairs.witness.phase import phase_of_variant

    torch = one_thread_torch()
    target, assistant, _tok = load_pair(name, variant)
    text = _text(build_tiny_pair, name, variant)
    W = text["sliding_window"]
    steps = 5
    end = PROMPT_LEN + DRAFT_SPAN + steps
    seqs = torch.tensor([p + lw.expected_continuation(p, end, W) for p in lw.prompts(GREEDY_PROMPTS, PROMPT_LEN)])
    plan = harness.RoundPlan(start=PROMPT_LEN, steps=steps, draft_phase=phase_of_variant(variant))
    drafted = harness.draft_rounds_each(target, assistant, seqs, text, (None, *lw.DRAFT_ABLATIONS), plan)
    base = sum(drafted[None]["step_accuracy"]) / steps
    record_property("intact", json.dumps(drafted[None]))
    if base < DRAFT_INTACT_MIN:
        raise CheckFailure("acceptance", f"{name}: intact {variant} drafter drafts only {base:.2f} right")
    blind = []
    for ablation in lw.DRAFT_ABLATIONS:
        hit = sum(drafted[ablation]["step_accuracy"]) / steps
        record_property(ablation, round(hit, 4))
        if hit > DRAFT_ABLATED_MAX * base:
            blind.append(f"{ablation} {hit:.2f}")
    if blind:
        raise CheckFailure("acceptance", f"{name}: {variant} drafter still drafts right with: {', '.join(blind)}")
