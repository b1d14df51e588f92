"""Long witness: a tiny Gemma 4 target whose next token is decided by attention past the sliding window, and a
drafter that reads the target's frozen KV the same way (issue #38).

Why: every other tiny pair's target layers write nothing to the residual stream (the witness, decoy and sampled
targets compute their rule from the token embedding alone), and the random pair, whose layers do read attention,
only ever gets prompts inside the 64-token window. No check crossed the window where the output depends on it.

The rule (``expected_continuation``)
------------------------------------
Tokens: body tokens ``body_token(g, m)`` (ids 256-511) carry a group g (0-7) and a member m (0-31); key tokens
``key_token(g)`` (ids 16-22) carry a key group g (0-6). A prompt is BOS, one key token, then body tokens. With the
sliding window W (64 in the tiny configs) the target's next token after position p is

    x[p + 1] = body_token(key group, succ(member of x[p - (W - 1)]))

succ(m) = m + 1 mod 31 on members 0-30; member 31 (and the member of any non-body token: BOS, the key) is the null
member, its own successor. Group 7 is the null group: what comes out when no key token is visible.
  * The member comes from the target's last physical sliding layer (the one sglang binds for the drafter): its
    query is position-only and reads the token at the window's far edge, W - 1 back. Its score profile has an even
    higher peak one position further out (the *trap*, W back), just outside the window: with the window one too wide,
    the layer reads the trap; one too narrow, it reads its next-best offset inside (``sliding_read``); either way
    the output changes, to a token ``expected_continuation(..., read=...)`` predicts.
  * The group comes from the target's last physical full layer: its query is content-only and scores the key token
    (a flag in a dim RoPE leaves alone) FULL_SCORE nats above every other token, so it reads the key however far back
    it lies. With a window on that layer the key drops out of sight past W tokens and the group becomes the null one.
So from position W + 1 on, every token depends on one token at the window's edge and one far outside it; a shifted
window, a position offset between chunks one back (the read lands on a neighbour) or a lost key each change the
output deterministically. What a read tells apart (``read_sets``): the edge; "short", any window of 52-63 keys (the
best offset inside is 51 for all of them); "wide", any window of 65 keys or more, or none (the trap at 64 wins).
So "one key short" and "one key wide" are what the measured causes are, not all the pair can see; and a chunk's
positions one on are absorbed (the read lands where it should: docs/pairs.md).

The construction and the drafter: ``pairs/long_witness_weights.py``.

Margins (``make_long_witness`` returns them for the pair's marker; bf16 rounds a score by ~0.4% of its size):
sliding target: trap over edge and edge over every other offset 0..W-2, in nats; drafter: its peak over every
other offset -2..W + 8; full: FULL_SCORE against ln(context) for the rest of the attention; logits: HALF_LOGIT.
"""

from __future__ import annotations

import random

from mtpmatrix.pairs.witness.positions import pair_amplitudes, rope_inv_freq
from mtpmatrix.pairs.witness.weights import SCORE_GAIN

GROUPS, NULL_GROUP, KEY_GROUPS = 8, 7, 7
MEMBERS, NULL_MEMBER, CYCLE = 32, 31, 31
KEY_BASE, BODY_BASE = 16, 256
BOS_ID = 2
CONTEXT_LEN = 256  # the variant's max_position_embeddings: four windows, so a request can run to its limit cheaply
COUNTER = 8  # draft steps a round can count (the smoke tier drafts 5, the reference tier 3)
TRAP_WEIGHT = 1.5  # the trap peak's weight against the edge peak's: margins 0.059 / 0.077 per unit score
TARGET_SCORE_GAIN = 320.0  # -> ~19 nats trap over edge, ~24 nats edge over the rest (printed in the marker)
DRAFT_SCORE_GAIN = SCORE_GAIN  # the witness's: ~20 nats peak over every other offset
FULL_SCORE = 24.0  # the key token's score: the other <= 255 tokens of a 256-token context keep < 1e-8 of attention
HALF_LOGIT = 12.0
DRAFT_ABLATIONS = ("kv_other_sliding_layer", "kv_other_full_layer", "position_plus_one", "position_minus_one")


def body_token(group: int, member: int) -> int:
    return BODY_BASE + group * MEMBERS + member


def key_token(group: int) -> int:
    return KEY_BASE + group


def member_of(token: int) -> int:
    return (token - BODY_BASE) % MEMBERS if token >= BODY_BASE else NULL_MEMBER


def key_group_of(token: int) -> int | None:
    return token - KEY_BASE if KEY_BASE <= token < KEY_BASE + KEY_GROUPS else None


def succ(member: int) -> int:
    return NULL_MEMBER if member == NULL_MEMBER else (member + 1) % CYCLE


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens: BOS, the key of group i mod 7, then body tokens of random groups whose
    members (0-30) differ from both neighbours' and from the one two back (so a read one or two positions off reads
    another member)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [BOS_ID, key_token(i % KEY_GROUPS)]
        members: list[int] = []
        while len(ids) < length:
            m = rng.choice([m for m in range(CYCLE) if m not in members[-2:]])
            members.append(m)
            ids.append(body_token(rng.randrange(GROUPS), m))
        out.append(ids)
    return out


def _group(ids: list[int], key_visible: bool) -> int:
    """The group the full owner reads: the key's (one key group in ``ids``), else the null group."""
    keys = {g for g in map(key_group_of, ids) if g is not None}
    if len(keys) > 1:
        raise ValueError(f"keys of groups {sorted(keys)}: the full layer would read a mixture (one key a prompt)")
    return keys.pop() if keys and key_visible else NULL_GROUP


def expected_continuation(
    prompt: list[int], total: int, window: int, *, read: int | None = None, key_visible: bool = True
) -> list[int]:
    """The tokens after ``prompt`` up to ``total`` tokens in all, by the rule (module docstring): the member read
    ``read`` positions back (default the edge, window - 1), the group of the prompt's key (the null group when
    ``key_visible`` is false or there is no key). Positions whose read falls before position 0 are not predicted."""
    read = window - 1 if read is None else read
    group = _group(prompt, key_visible)
    ids = list(prompt)
    while len(ids) < total:
        p = len(ids) - 1
        if p - read < 0:
            raise ValueError(f"prompt of {len(prompt)} tokens: position {p} reads before the start")
        ids.append(body_token(group, succ(member_of(ids[p - read]))))
    return ids[len(prompt) :]


def predicted_next(
    ids: list[int], text: dict, *, visible_max: int | None = None, positions=None, key_visible: bool = True
) -> list[int | None]:
    """The target's next token after every position of ``ids``, from the construction alone: the sliding owner reads
    the visible token (``visible_max`` positions back at most, default sliding_window - 1) with the highest designed
    score at its RoPE distance (``positions``, default 0, 1, 2, ...; a position offset between chunks moves those
    distances, not the mask), the full owner the key's group (the null group when ``key_visible`` is false). Teacher
    forced: each prediction reads ``ids`` as given. None where the read lands on a RoPE position two keys share (a
    positions fault that repeats one): attention then splits between them. The model itself must agree
    (tests/tiers/test_reference_long_witness.py)."""
    visible_max = text["sliding_window"] - 1 if visible_max is None else visible_max
    positions = list(range(len(ids))) if positions is None else [int(x) for x in positions]
    scores = sliding_score_list(text, max(positions) - min(positions) + 1)
    group = _group(ids, key_visible)
    out = []
    for p in range(len(ids)):
        seen = range(max(0, p - visible_max), p + 1)
        j = max(seen, key=lambda j: scores[positions[p] - positions[j]])
        tied = sum(positions[i] == positions[j] for i in seen) > 1  # two keys at one RoPE position share the read
        out.append(None if tied else body_token(group, succ(member_of(ids[j]))))
    return out


# What each output token of a served long-witness request is, teacher forced on the ids served (``read_kinds``): the
# sliding read at the window's edge (the rule, transformers' window), the read of a window one key short (sglang's
# Triton decode kernel: update_sliding_window_buffer keeps min(seq_len, sliding_window_size) keys, one fewer than its
# extend kernel and transformers; sgl-project/sglang#32087, unmerged), both (the two reads carry one member), the read
# of a window one key wide (the trap just outside: sglang 0.5.13's extend rows past a segment's first, whose Gemma 4
# layers pass config.sliding_window where the backend's buffers hold sliding_window - 1; sglang#26147, fixed in
# 0.5.14; H200 2026-12-05), or none of these.
READ_RULE, READ_SHORT, READ_BOTH, READ_WIDE, READ_OTHER = "r", "s", "=", "w", "x"


def read_sets(prompt: list[int], output: list[int], text: dict) -> list[str]:
    """Per token of ``output``, which of three reads give it, as letters in this order: READ_RULE (the window's
    edge), READ_SHORT (a window one key short), READ_WIDE (a window one key wide); "" when none does. Each read is
    predicted from ``prompt`` + ``output`` as served (``predicted_next``). The set, not one letter, is what a
    deviation that mixes reads is told by (long_deviations.extend_reads_wide: sglang 0.5.13)."""
    ids = list(prompt) + list(output)
    w = text["sliding_window"]
    try:
        by_read = {
            READ_RULE: predicted_next(ids, text, visible_max=w - 1),
            READ_SHORT: predicted_next(ids, text, visible_max=w - 2),
            READ_WIDE: predicted_next(ids, text, visible_max=w),
        }
    except ValueError:  # an output holding another group's key token: the rule predicts none of it
        return [""] * len(output)
    return [
        "".join(read for read, predicted in by_read.items() if predicted[p] == ids[p + 1])
        for p in range(len(prompt) - 1, len(ids) - 1)
    ]


def _kind_of(reads: str) -> str:
    """The one letter (READ_*) a token's ``read_sets`` entry is shown as: the edge's read first (READ_BOTH when the
    short window's gives it too), then the short window's, the wide one's, none."""
    if READ_RULE in reads:
        return READ_BOTH if READ_SHORT in reads else READ_RULE
    return READ_SHORT if READ_SHORT in reads else READ_WIDE if READ_WIDE in reads else READ_OTHER


def kinds_of(sets: list[str]) -> str:
    """``read_sets``' entries as one letter a token (READ_*)."""
    return "".join(map(_kind_of, sets))


def read_kinds(prompt: list[int], output: list[int], text: dict) -> str:
    """One letter per token of ``output`` (READ_*, ``kinds_of`` its ``read_sets``): whether the read at the window's
    edge, the read of a window one key short, both, the read of a window one key wide or none gives it."""
    return kinds_of(read_sets(prompt, output, text))


def peak_query(inv, amps, offset: float):
    """Query pair coefficients (first, second component) whose score peaks ``offset`` positions back (witness)."""
    import torch

    back = inv.double() * offset
    return amps.double() * torch.cos(back), -amps.double() * torch.sin(back)


def _unit_scores(inv, amps, alpha, beta, offsets):
    """Score of the query (alpha, beta), unit-normalised, on position-only keys of amplitudes ``amps`` at
    ``offsets`` positions back: sum_i a_i (alpha_i cos(w_i d) - beta_i sin(w_i d)) / |q| (RoPE as transformers)."""
    import torch

    norm = (alpha.square().sum() + beta.square().sum()).sqrt()
    d = torch.as_tensor(offsets, dtype=torch.float64)[:, None]
    w = inv.double()[None, :]
    return (amps.double()[None, :] * (alpha[None, :] * torch.cos(w * d) - beta[None, :] * torch.sin(w * d))).sum(
        -1
    ) / norm


def target_query(text: dict):
    """The target sliding owner's query pairs: the edge peak (window - 1 back) plus TRAP_WEIGHT times the trap peak
    (window back)."""
    _hd, inv = rope_inv_freq(text, "sliding_attention")
    amps = pair_amplitudes(inv)
    w = text["sliding_window"]
    a1, b1 = peak_query(inv, amps, w - 1)
    a2, b2 = peak_query(inv, amps, w)
    return inv, amps, a1 + TRAP_WEIGHT * a2, b1 + TRAP_WEIGHT * b2


def target_sliding_scores(text: dict, max_offset: int | None = None):
    """The target sliding owner's scores (nats) on keys 0..max_offset positions back."""
    inv, amps, alpha, beta = target_query(text)
    top = max_offset if max_offset is not None else text["max_position_embeddings"]
    return TARGET_SCORE_GAIN * _unit_scores(inv, amps, alpha, beta, range(top + 1))


def sliding_score_list(text: dict, max_offset: int) -> list[float]:
    """``target_sliding_scores`` in plain Python (the smoke tier reads served outputs where no torch need be): the same
    query, amplitudes and float32 frequencies (1e-5 nats apart on the tiny configs). ``predicted_next`` reads it, and
    the reference tier holds that to transformers' own forward under each window fault
    (tests/tiers/test_reference_long_witness.py)."""
    import math
    from array import array

    rope = text["rope_parameters"]["sliding_attention"]
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"long witness: sliding RoPE {rope.get('rope_type')!r}; the plain scores know 'default' only")
    hd, theta = text["head_dim"], rope["rope_theta"]
    inv = list(array("f", [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]))
    raw = [1.0 / (1.0 + 4.0 * (1.0 - min(w, 1.0))) if w > 0 else 0.0 for w in inv]
    amps = list(array("f", [a / math.sqrt(sum(x * x for x in raw)) for a in raw]))
    win = text["sliding_window"]
    alpha = [a * (math.cos(w * (win - 1)) + TRAP_WEIGHT * math.cos(w * win)) for a, w in zip(amps, inv)]
    beta = [-a * (math.sin(w * (win - 1)) + TRAP_WEIGHT * math.sin(w * win)) for a, w in zip(amps, inv)]
    norm = math.sqrt(sum(x * x for x in alpha) + sum(x * x for x in beta))
    return [
        TARGET_SCORE_GAIN
        * sum(a * (al * math.cos(w * d) - be * math.sin(w * d)) for a, al, be, w in zip(amps, alpha, beta, inv))
        / norm
        for d in range(max_offset + 1)
    ]


def sliding_read(text: dict, visible_max: int, position: int | None = None) -> int:
    """The offset the target's sliding owner reads when offsets 0..visible_max are visible (the window's edge is
    sliding_window - 1; ``position``: the query's, which bounds the offsets that exist)."""
    top = visible_max if position is None else min(visible_max, position)
    return int(target_sliding_scores(text, top).argmax())


def margins(text: dict, phase: int) -> dict:
    """The margins the construction relies on (module docstring), rounded for the pair's marker."""
    import math

    w = text["sliding_window"]
    s = target_sliding_scores(text, w)
    _hd, inv = rope_inv_freq(text, "sliding_attention")
    amps = pair_amplitudes(inv)
    draft = []
    offsets = list(range(-2, w + 9))
    for k in range(COUNTER):
        a, b = peak_query(inv, amps, draft_offset(w, phase, k))
        ds = DRAFT_SCORE_GAIN * _unit_scores(inv, amps, a, b, offsets)
        peak = offsets.index(draft_offset(w, phase, k))
        draft.append(float(ds[peak] - max(x for i, x in enumerate(ds.tolist()) if i != peak)))
    return {
        "sliding_trap_over_edge_nats": round(float(s[w] - s[w - 1]), 2),
        "sliding_edge_over_inside_nats": round(float(s[w - 1] - s[: w - 1].max()), 2),
        "sliding_read_one_narrower": int(s[: w - 1].argmax()),
        "draft_peak_margin_nats": round(min(draft), 2),
        "full_key_score_nats": FULL_SCORE,
        "full_rest_attention_bound": float(f"{(CONTEXT_LEN - 1) * math.exp(-FULL_SCORE):.2g}"),
        "half_logit": HALF_LOGIT,
        "draft_phase": phase,
        "counter": COUNTER,
    }


def draft_offset(window: int, phase: int, k: int) -> int:
    return window - 2 + phase - k
