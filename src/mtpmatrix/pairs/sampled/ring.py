"""Sampled pair: a tiny Gemma 4 target whose next-token distribution is known in closed form, and a drafter that
proposes a different one, so sampled (temperature > 0) speculative decoding can be held to the target's own
distribution: lossless in distribution, not just on the greedy chain.

Target (every tiny family; weights built by ``weights.make_sampled``)
-------------------------------------------------------------
The target depends only on the previous token, through offsets on a ring of ``RING_SIZE`` tokens starting at
``RING_START``: for a token t with ring index f = (t - RING_START) mod RING_SIZE (any token, ring or not),

    logit(RING_START + (f + d_i) mod RING_SIZE) = TARGET_LOGITS[i]   for the offsets d_i in OFFSETS,
    logit(anything else)                        = OTHER_LOGIT,

before Gemma 4's final softcap 30 * tanh(x / 30). Offsets are read back as (next - prev) mod RING_SIZE.

Why the logits are exact in bf16 (sglang runs the lm_head in bf16 on the GPU): every layer writes nothing to the
residual stream (``weights.zero_residual_writers``), so the target's hidden state at position p is exactly
sqrt(H) * E[x_p] (as for the witness). E[t] has two nonzero entries, both 1/2: dim 0 and dim 1 + f. Whatever bf16
does to sqrt(H) and to the product, both entries round alike, so the final RMSNorm (weight 1) maps them to
sqrt(H / 2) = 8 for H = 128, up to eps = 1e-6 (relative 1e-8, far below bf16's half ulp 2^-9, so the bf16 output is
exactly 8). The output head's row of token j has W[j, 0] = OTHER_LOGIT / 8 and, for a ring token j = RING_START + g,
W[j, 1 + (g - d_i) mod RING_SIZE] = (TARGET_LOGITS[i] - OTHER_LOGIT) / 8. Every one of these is a dyadic number with
at most 8 significant bits (checked by ``check_exact``), so each logit is a sum of two exact products, exact in
fp32 accumulation and exactly representable in bf16. The softcap (fp32 on the GPU) and softmax then add only fp32
rounding (~1e-7 relative), far below the deviation the test can see (``detectable_tv``, ~0.03).

Distribution (``token_distribution``; float64, over the whole vocabulary): p = softmax(softcap(logit) / T), then
top-k, then top-p. sglang's normal sampler applies top-k and top-p jointly to p (flashinfer's
``top_k_top_p_sampling_from_probs(..., filter_apply_order="joint")``; the pytorch backend computes the top-p
cumulative sum before the top-k mask, also joint), while verify renormalises after top-k and applies top-p to that
(``top_k_renorm_prob`` then ``top_p_renorm_prob``, eagle_info.py in 0.5.13, eagle_utils.py in 0.5.17 / 0.5.23), and
transformers' logits processors do top-k first too. The sampling groups below are chosen so both orders keep the same
tokens, every top-p boundary at least ``BOUNDARY_MARGIN`` away from a cumulative sum (``closed_form`` raises
otherwise) and no top-k boundary on a tie. Two groups of requests, same temperature, same kept set {d1, d2, d3} and
so the same closed form, but a different binding constraint:

  * ``top-k binds``: top_k 3 cuts d4; top_p 0.95 keeps d4 if top-k were skipped (cumsum before d4 is 0.906);
  * ``top-p binds``: top_k 4 keeps d4; top_p 0.83 cuts it (cumsum before d3 0.744, before d4 0.906).
So skipping the top-k renormalisation shows d4 in the first group, skipping top-p in the second, and d4 (like every
token off the three kept offsets) has probability exactly 0 under a correct sampler.

Drafter: proposes over the same offsets with DRAFT_LOGITS, ranking d3 > d2 > d4 > d1 (the target's least likely
kept offset first, its most likely last). At topk 1 every draft is d3 (target probability 0.178: accepted 18% of the
time, so verify's coins and residual resampling decide most tokens); at topk 3 the siblings d3, d2, d4 leave d1 to
the residual. The three siblings are never the whole kept set: sglang's tree kernel would then reject all of them
only when a float32 coin exceeds the float32 sum of the renormalised probabilities (~1e-7 per level), and sample
from an all-zero residual (it returns token vocab - 1); a drafter that cannot trigger that keeps the check's false
alarms at the stated rate.

Second region (``pairs.sampled.bonus``): tokens 480..500 on hidden dims 33..53, written by
``weights.make_sampled`` into the same two models, where the drafter drafts five-token chains the target follows with probability ~1, so every
verify step accepts all five drafts and its bonus token is sampled at T > 0 from a closed form (the ring above
almost never gets there: all five drafts accepted in < 0.4 % of its steps). The ring's weights and logits are
unchanged by it: a ring token's hidden state is zero on those dims, and no E row outside 480..500 changes.

Test (``check_outputs``)
------------------------
Independence: under a lossless sampler each output is distributed as the target's own autoregressive sampling. The
target's next-token distribution given the whole history is the same offset law at every position (it depends on the
previous token only through the offset), so the offsets of successive tokens are i.i.d. with the closed form,
within a request and across requests (requests share nothing). Truncating at max_new_tokens does not bias them.
So the pooled offset counts are Multinomial(n, closed form), with every position of every request counted.
  1. Any token whose offset is off the kept set fails the check (probability exactly 0 under the null).
  2. Pearson's chi-square on the three kept offsets (df 2) rejects at p < ALPHA = 1e-4, the check's false-alarm
     rate. At n = N_REQUESTS * NEW_TOKENS = 8192 the chi-square tail is accurate: the exact multinomial probability
     of the rejection region is computed by enumeration in tests/unit/test_sampled.py, and the p-values of
     simulated null runs are uniform there.
  3. Power: every deviation of total variation >= ``detectable_tv(n)`` (0.030 at n = 8192) from the closed form is
     detected with probability >= 0.9 (stats.min_detectable_tv; confirmed by simulation in the unit tests). The
     CPU model of sglang's verify (``mtpmatrix.pairs.sampled.verify_model``) shows each broken verify detected.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from mtpmatrix.core import stats

RING_START = 256  # inside the byte-fallback ids: no special token, no EOS, on the ring or next to it
RING_SIZE = 32
OFFSETS = (1, 3, 7, 12)  # d1..d4 by target preference; no offset is another's sum or difference (mod RING_SIZE),
# so a verify that reads the distribution of a neighbouring position yields offsets off the kept set
TARGET_LOGITS = (2.0, 1.625, 1.25, 0.875)
OTHER_LOGIT = -24.0
EMBED_VALUE = 0.5  # the two nonzero entries of a target embedding row
DRAFT_LOGITS = (0.0, 4.0, 6.0, 2.0)  # per offset d1..d4: ranks d3 > d2 > d4 > d1
DRAFT_OTHER_LOGIT = -8.0
SOFTCAP = 30.0  # the tiny templates' final_logit_softcapping (tiny.configs.text_config); make_sampled checks it
TEMPERATURE = 0.7
BOUNDARY_MARGIN = 0.04  # float32 cumulative sums err by < 1e-6; the rest keeps broken-verify models clear of it


@dataclass(frozen=True)
class SamplingGroup:
    name: str
    top_k: int
    top_p: float
    temperature: float = TEMPERATURE


GROUPS = (SamplingGroup("top-k binds", top_k=3, top_p=0.95), SamplingGroup("top-p binds", top_k=4, top_p=0.83))
KEPT_OFFSETS = OFFSETS[:3]

# Sample size: N_REQUESTS requests of NEW_TOKENS tokens per server (8192 offsets, detectable TV 0.030); the prompts
# (PROMPT_LEN + NEW_TOKENS) stay inside the smoke servers' 512-token context.
N_REQUESTS = 64
NEW_TOKENS = 128
PROMPT_LEN = 12
ALPHA = 1e-4  # false-alarm rate of one server's check
POWER = 0.9
SEED_BASE = 7_000  # sampling_seed of request i is SEED_BASE + i (distinct, see ``payload``)
# The reference tier's check of transformers' own sampling (tests/tiers/test_reference.py) draws the same n = 8192
# offsets as REFERENCE_REQUESTS requests of REFERENCE_TOKENS tokens, one generate call per group: the pooled offsets are
# Multinomial(8192, closed form) under the null however they are split into requests (see Independence below), so the
# test, its false-alarm rate and its power are the smoke tier's. Wide and short because a decode step of a tiny target
# costs about as much for 256 rows as for 32 (issue #31).
REFERENCE_REQUESTS = 512
REFERENCE_TOKENS = 16


def softcap(x: float, cap: float = SOFTCAP) -> float:
    return cap * math.tanh(x / cap)


def ring_index(token: int) -> int:
    return (token - RING_START) % RING_SIZE


def next_token(token: int, offset: int) -> int:
    return RING_START + (ring_index(token) + offset) % RING_SIZE


def offset_of(prev: int, token: int) -> int | None:
    """(token - prev) on the ring; None for a token off the ring."""
    if not RING_START <= token < RING_START + RING_SIZE:
        return None
    return (token - prev) % RING_SIZE if RING_START <= prev < RING_START + RING_SIZE else None


# ---------------------------------------------------------------------------------------------- closed form


def _logits(vocab: int, logits=TARGET_LOGITS, other=OTHER_LOGIT) -> list[float]:
    """Pre-softcap logits of every token after a token at ring index 0 (any index gives the same by symmetry)."""
    out = [other] * vocab
    for d, lg in zip(OFFSETS, logits):
        out[RING_START + d % RING_SIZE] = lg
    return out


def token_distribution(
    vocab: int,
    group: SamplingGroup,
    order: str = "joint",
    temperature: float | None = None,
    apply_top_k: bool = True,
    apply_top_p: bool = True,
) -> dict:
    """Float64 next-token distribution after a ring token, as {offset: probability, "other": probability of every
    token off the four offsets}, with its top-p margins. ``order``: "joint" (sglang's sampler: top-k and top-p both on
    the temperature softmax) or "top_k_first" (verify, transformers: top-p on the top-k-renormalised distribution).
    The flags and ``temperature`` exist to model broken verifies (verify_model)."""
    t = group.temperature if temperature is None else temperature
    z = [softcap(x) / t for x in _logits(vocab)]
    m = max(z)
    w = [math.exp(v - m) for v in z]
    s = sum(w)
    p = [v / s for v in w]
    ranked = sorted(range(vocab), key=lambda i: -p[i])
    kept = set(range(vocab))
    if apply_top_k and group.top_k < vocab:
        if p[ranked[group.top_k - 1]] == p[ranked[group.top_k]]:
            raise ValueError(f"top_k {group.top_k} falls on a tie")
        kept = set(ranked[: group.top_k])
    margin = math.inf
    if apply_top_p and group.top_p < 1:
        base = [i for i in ranked if i in kept] if order == "top_k_first" else ranked
        total = sum(p[i] for i in base)
        cum, top_p_kept = 0.0, set()
        for i in base:
            if cum / total < group.top_p:
                top_p_kept.add(i)
                below = cum / total
            else:  # the first token cut: the boundary lies between the two cumulative sums
                margin = min(group.top_p - below, cum / total - group.top_p)
                break
            cum += p[i]
        kept &= top_p_kept
    z_kept = sum(p[i] for i in kept)
    out: dict = {d: 0.0 for d in OFFSETS}
    out["other"] = 0.0
    for i in kept:
        d = (i - RING_START) % RING_SIZE if RING_START <= i < RING_START + RING_SIZE else None
        out[d if d in out else "other"] += p[i] / z_kept
    out["top_p_margin"] = margin
    return out


def closed_form(vocab: int) -> dict[int, float]:
    """The null: probability of each kept offset, the same for every group and both filter orders (ValueError when a
    group's kept set differs, or a top-p boundary is within BOUNDARY_MARGIN of a cumulative sum)."""
    ref = None
    for group in GROUPS:
        for order in ("joint", "top_k_first"):
            dist = token_distribution(vocab, group, order)
            if dist["top_p_margin"] < BOUNDARY_MARGIN:
                raise ValueError(
                    f"{group.name} ({order}): top_p {group.top_p} within {dist['top_p_margin']:.3f} of a cumulative sum"
                )
            kept = {d: dist[d] for d in KEPT_OFFSETS}
            if dist["other"] or any(dist[d] for d in OFFSETS if d not in KEPT_OFFSETS):
                raise ValueError(f"{group.name} ({order}) keeps more than offsets {KEPT_OFFSETS}: {dist}")
            if ref is not None and any(abs(kept[d] - ref[d]) > 1e-12 for d in KEPT_OFFSETS):
                raise ValueError(f"{group.name} ({order}) differs from the first group: {kept} vs {ref}")
            ref = ref or kept
    return ref


def detectable_tv(n: int, vocab: int) -> float:
    """Total variation from the closed form detected with probability >= POWER at n offsets (stats.min_detectable_tv)."""
    return stats.min_detectable_tv([closed_form(vocab)[d] for d in KEPT_OFFSETS], n, ALPHA, POWER)


# ---------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class SampledRequest:
    prompt: tuple[int, ...]
    group: SamplingGroup
    seed: int
    new_tokens: int = NEW_TOKENS


def request_plan(n: int = N_REQUESTS, new_tokens: int = NEW_TOKENS) -> list[SampledRequest]:
    """``n`` token-id prompts on the ring (their last tokens cover the ring), the groups alternating."""
    return [
        SampledRequest(
            prompt=tuple(RING_START + (5 * i + 3 * j) % RING_SIZE for j in range(PROMPT_LEN)),
            group=GROUPS[i % len(GROUPS)],
            seed=SEED_BASE + i,
            new_tokens=new_tokens,
        )
        for i in range(n)
    ]


def payload(req: SampledRequest) -> dict:
    """The /generate body of one request of the plan (``body``)."""
    return body(req.prompt, req.group, req.new_tokens, req.seed)


def body(prompt, group: SamplingGroup, new_tokens: int, seed: int) -> dict:
    """The /generate body of a sampled request of ``group``. ``sampling_seed`` exists in sglang 0.5.13-0.5.23 but is
    honoured only with --enable-deterministic-inference (sampling_batch_info: seeds are dropped otherwise); there, a
    request without one gets seed 42, so requests with equal prompts would draw the same coins and stop being
    independent. Each request therefore carries its own seed, always."""
    return {
        "input_ids": list(prompt),
        "sampling_params": {
            "temperature": group.temperature,
            "top_k": group.top_k,
            "top_p": group.top_p,
            "max_new_tokens": new_tokens,
            "ignore_eos": True,
            "sampling_seed": seed,
        },
    }


# ---------------------------------------------------------------------------------------------- the check


@dataclass
class DistributionCheck:
    n: int  # offsets counted
    counts: dict  # kept offset -> count
    off_support: int  # tokens whose offset is not a kept one (or that are off the ring)
    first_off_support: tuple | None  # (request, position, prev, token)
    expected: dict  # kept offset -> probability
    statistic: float
    p_value: float
    detectable_tv: float

    @property
    def passed(self) -> bool:
        return self.off_support == 0 and self.p_value >= ALPHA

    def summary(self) -> str:
        freq = ", ".join(
            f"{d}: {self.counts[d] / max(1, self.n):.4f} (closed form {self.expected[d]:.4f})" for d in KEPT_OFFSETS
        )
        return (
            f"{self.n} offsets; {freq}; off the kept set: {self.off_support}; chi-square {self.statistic:.2f} "
            f"(df {len(KEPT_OFFSETS) - 1}), p = {self.p_value:.3g} (alpha {ALPHA:g}); detectable TV "
            f"{self.detectable_tv:.3f} at power {POWER}"
        )


def count_offsets(prompts, outputs) -> tuple[Counter, int, tuple | None]:
    """Kept-offset counts, tokens off the kept set and the first of those, over every position of every output."""
    counts: Counter = Counter()
    off, first = 0, None
    for r, (prompt, out) in enumerate(zip(prompts, outputs)):
        prev = prompt[-1]
        for pos, tok in enumerate(out):
            d = offset_of(prev, tok)
            if d in KEPT_OFFSETS:
                counts[d] += 1
            else:
                off += 1
                first = first or (r, pos, prev, tok)
            prev = tok
    return counts, off, first


def check_outputs(prompts, outputs, vocab: int) -> DistributionCheck:
    expected = closed_form(vocab)
    counts, off, first = count_offsets(prompts, outputs)
    n = sum(counts.values()) + off
    if sum(counts.values()) == 0:
        return DistributionCheck(n, dict(counts), off, first, expected, math.inf, 0.0, math.inf)
    res = stats.pearson_chi2([counts[d] for d in KEPT_OFFSETS], [expected[d] for d in KEPT_OFFSETS])
    return DistributionCheck(
        n=n,
        counts={d: counts[d] for d in KEPT_OFFSETS},
        off_support=off,
        first_off_support=first,
        expected=expected,
        statistic=res.statistic,
        p_value=res.p_value,
        detectable_tv=detectable_tv(max(1, n), vocab),
    )


# ---------------------------------------------------------------------------------------------- weights


def exact_bf16(x: float) -> bool:
    """x is a dyadic number with at most 8 significant bits (bf16's precision) and in bf16's normal range."""
    if x == 0:
        return True
    m, e = math.frexp(abs(x))  # x = m * 2^e, 0.5 <= m < 1
    return (m * 2**8).is_integer() and -125 <= e <= 128


def check_exact(hidden: int) -> float:
    """The final normed hidden value sqrt(hidden / 2); ValueError unless it and every head entry and logit are exact
    in bf16 (module docstring)."""
    h = math.sqrt(hidden / 2)
    entries = [OTHER_LOGIT / h] + [(lg - OTHER_LOGIT) / h for lg in TARGET_LOGITS]
    bad = [v for v in (EMBED_VALUE, h, OTHER_LOGIT, *TARGET_LOGITS, *entries) if not exact_bf16(v)]
    if bad:
        raise ValueError(f"sampled pair: values not exact in bf16 at hidden size {hidden}: {bad}")
    return h
