"""The sampled pair's second region: chains the drafter gets right at every temperature, so that every verify step
accepts all its drafts and its 6th token is the bonus token, sampled at T > 0 from a closed form.

On the ring (pairs.sampled.ring) the drafter proposes the target's third choice, so a verify step accepts all five
drafts in < 0.4 % of steps and the bonus token sampled after a fully accepted step is effectively never tested.
This region lives in the same target and drafter (``weights.make_sampled`` calls ``write_target`` /
``write_drafter``), on tokens and hidden dimensions the ring does not use, so the ring's weights, logits and outputs
do not change.

Tokens (``R2_START`` = 480 .. 500, <unused> ids above every id the other requests' prompts use)
------------------------------------------------------------------------------------------------
A spread token ``SPREAD`` = 480 and N_STARTS = 4 chains of STEPS = 5 tokens, ``CHAINS[j]`` = (481 + 5j, ..., 485 +
5j); ``CHAINS[j][0]`` is chain j's start. The target's next-token law, by the previous token alone:

    CHAINS[j][i] -> CHAINS[j][i + 1] (i < 4),   CHAINS[j][4] -> SPREAD    logit CHAIN_LOGIT = 40, the rest -24;
    SPREAD -> CHAINS[j][0] with logit SPREAD_LOGITS[j] = (1.5, 1.0, 0.5, 0.0), the rest -24,

before the softcap 30 * tanh(x / 30). Peakedness: softcap(40) = 26.10, softcap(-24) = -19.92, a gap of 46.03, so at
T <= 1.5 each of the 511 other tokens has probability <= exp(-46.03 / 1.5) = 4.7e-14 and the chain successor
>= 1 - 2.4e-11 (``chain_deviation_bound``); top-k and top-p only remove other tokens and renormalise, which can only
raise it (the successor is the argmax, always kept). Over a server's 16 x 384 tokens a chain token leaves the chain
with probability < 2e-7 under a correct sampler.

Exact in bf16, as the ring (pairs.sampled.ring): every layer writes nothing to the residual stream, so the final normed
hidden state of token t is 8 at dim 0 and 8 at ``dim(t)`` = 33 + (t - R2_START) (dims 33..53; the ring uses 0 and
1..32, hidden size 128), zero elsewhere: E[t] has 0.5 at those two dims instead of the ring's dim 1 + f. The head
row of a successor j of t has W[j, dim(t)] = (logit - (-24)) / 8: 8 for the chain, 3.1875, 3.125, 3.0625, 3 for the
spread, each with at most 8 significant bits (``check_exact``), so each logit is a sum of two exact products: -24 +
64 = 40, -24 + 25.5 = 1.5, ... exact in fp32 and in bf16. The ring's logits are unchanged bit for bit: a ring token's
hidden state is zero on dims 33..53, the only columns this region writes, and its E row is untouched (so is every
token's outside 480..500).

Drafter. The assistant's pre-projection carries target dims 33..53 to its own dims 33..53 (as it carries the
ring's 0..32; hidden 64), its head puts the chain successor at DRAFT_CHAIN_LOGIT = 16 against -8 (each other token
at e^-24 = 4e-11 of it, e^-22.5 if the drafter softcaps), and for the centroid head (e-series) the successor's cluster is the only one scoring > 0, so
it is always among the clusters kept. So from any chain token, the input it sees, it drafts the target's successor:
after a start CHAINS[j][0] the five drafts are CHAINS[j][1..4], SPREAD, exactly the target's chain. At the spread
token it would draft DRAFT_SPREAD_LOGITS, the reverse of the target's ranking; it never drafts there in an intact
run (SPREAD is always the fifth draft), the law exists for the power calculation ("the bonus drawn from the drafter's
law").

Alignment: every 6th output token is a bonus token
-------------------------------------------------
A request's prompt ends with SPREAD (``prompt``). Output o_0 comes from prefill: a start, drawn from the spread law.
Claim: for every k, o_6k is a start CHAINS[j][0] drawn from the spread law, o_6k+i = CHAINS[j][i] (i = 1..4) and
o_6k+5 = SPREAD; with MTP, verify step k + 1 (k >= 0) takes o_6k as its input token and yields o_6k+1 .. o_6k+6, all
five drafts accepted and o_6k+6 the bonus token. Induction on k: the verify step's input token is o_6k = CHAINS[j][0]
(k = 0: prefill's token; k > 0: the previous step's bonus, which the drafter reads as its input token), so its five
drafts are CHAINS[j][1..4], SPREAD (topk 1; at topk 3 they are the first-ranked branch at every depth, the siblings'
scores ~1e-10 against ~1, so the whole chain is inside the 11 tree nodes). The target's probability of each draft is
>= 1 - 2.4e-11, and sglang's verify accepts a draft when its coin falls under the target's (cumulative) probability,
so all five are accepted; the token after the fifth, at depth 5 a leaf with no rejected sibling, is sampled from the
target's law at SPREAD, the spread law at the request's temperature / top-k / top-p: o_6k+6, a start. So the bonus
positions are 6, 12, ..., and NEW_TOKENS = 384 gives 63 of them per request (6..378). Without MTP the same positions
are plain decode steps. Either way, a token whose previous token is SPREAD has, given the whole history, the spread
law of its request's group (the target depends on the previous token only), so the spread tokens at positions >= 1
are i.i.d. per group across requests and positions: their counts are Multinomial(n_group, spread law).

Test (``check_streams``)
-----------------------
  1. Chain: every token after a chain token must be its successor (probability >= 1 - 2.4e-11 each): one deviation
     fails the check; so does a token after SPREAD off the group's kept starts (probability exactly 0: top-k cuts
     it). A request is read up to its first deviation.
  2. Bonus: Pearson's chi-square of the start counts at positions >= 1, per group against its spread law, summed over
     the groups (df 3 + 2 = 5), rejects at p < P_THRESHOLD = 8e-5: the exact multinomial probability of that region
     at the smoke sample size is 9.85e-5 <= ALPHA = 1e-4, the check's false-alarm rate (the chi-square tail at
     1e-4 would be 1.21e-4 exactly there). The prefill token (position 0, another sampler) is held to the support
     only.
Sample: 16 requests x 384 tokens per server, 8 per group: 504 bonus tokens per group, 1,008 per server (6,144 tokens,
1,024 verify steps at 6 tokens each: a fraction of the ring's ~16k sampled tokens at ~1.2 per step). Expected counts
are >= 0.048 x 504 = 24 per cell. Power (tests/unit/test_sampled_bonus.py: exact noncentral chi-square and simulated
runs): the bonus drawn greedily (the argmax), from the drafter's law, or at temperature 1 instead of the request's,
each detected with probability >= 0.99 (temperature 1: 0.9995 asymptotic, 0.996 in 2,000 simulated runs; the other
two: 1 to machine precision). The false-alarm rate is computed exactly there (convolution of the two groups'
enumerated statistics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mtpmatrix.core import stats
from mtpmatrix.pairs.sampled import ring
from mtpmatrix.pairs.sampled.ring import SamplingGroup

R2_START = 480
STEPS = 5  # --speculative-num-steps (settings.NUM_STEPS): chain length, the period is STEPS + 1
N_STARTS = 4
SPREAD = R2_START
CHAINS = tuple(tuple(R2_START + 1 + STEPS * j + i for i in range(STEPS)) for j in range(N_STARTS))
STARTS = tuple(c[0] for c in CHAINS)
R2_SIZE = 1 + N_STARTS * STEPS
DIM_BASE = 1 + ring.RING_SIZE  # the ring uses hidden dims 0 .. RING_SIZE
CHAIN_LOGIT = 40.0
SPREAD_LOGITS = (1.5, 1.0, 0.5, 0.0)  # distinct: no top-k tie; per start j
DRAFT_CHAIN_LOGIT = 16.0
DRAFT_SPREAD_LOGITS = (0.0, 2.0, 4.0, 6.0)  # the reverse of the target's ranking (never drafted in an intact run)
MAX_TEMPERATURE = 1.5  # the highest temperature any request on the sampled servers uses

SUCCESSOR = {c[i]: c[i + 1] for c in CHAINS for i in range(STEPS - 1)} | {c[-1]: SPREAD for c in CHAINS}
START_INDEX = {s: j for j, s in enumerate(STARTS)}

GROUPS = (
    SamplingGroup("bonus T0.6 k4", top_k=4, top_p=1.0, temperature=0.6),
    SamplingGroup("bonus T1.4 k3", top_k=3, top_p=1.0, temperature=1.4),
)
ALPHA = 1e-4  # the check's false-alarm rate on one server
# The chi-square's p-value threshold: Pearson's tail at 1e-4 is 1.21e-4 exactly at 504 tokens per group (cells down
# to 24 expected), so the threshold is lowered until the exact rate is <= ALPHA: 9.85e-5 (tests/unit/test_sampled_bonus.py)
P_THRESHOLD = 8e-5
POWER = 0.99


def dim(token: int) -> int:
    """The hidden dimension (target and drafter) of a region-2 token."""
    return DIM_BASE + token - R2_START


def successor_logits() -> list[tuple[int, int, float]]:
    """(token, successor, pre-softcap logit) of every transition the target's head carries in region 2."""
    out = [(t, s, CHAIN_LOGIT) for t, s in SUCCESSOR.items()]
    return out + [(SPREAD, s, lg) for s, lg in zip(STARTS, SPREAD_LOGITS)]


def chain_deviation_bound(vocab: int, temperature: float = MAX_TEMPERATURE) -> float:
    """Upper bound on the probability that a chain token is followed by anything but its successor, before top-k /
    top-p (which only lower it)."""
    gap = ring.softcap(CHAIN_LOGIT) - ring.softcap(ring.OTHER_LOGIT)
    return (vocab - 1) * math.exp(-gap / temperature)


def spread_law(vocab: int, group: SamplingGroup, temperature: float | None = None) -> tuple[float, ...]:
    """Probability of each start after SPREAD under the group's temperature and top-k (top-p must be 1), float64;
    the mass off the starts is zero when top-k <= N_STARTS (ValueError otherwise, or on a top-k tie)."""
    if group.top_p < 1 or not 1 <= group.top_k <= N_STARTS:
        raise ValueError(f"{group.name}: the spread law needs top_p 1 and top_k in 1..{N_STARTS}")
    t = group.temperature if temperature is None else temperature
    z = [ring.softcap(x) / t for x in SPREAD_LOGITS]
    order = sorted(range(N_STARTS), key=lambda i: -z[i])
    if group.top_k < N_STARTS and z[order[group.top_k - 1]] == z[order[group.top_k]]:
        raise ValueError(f"{group.name}: top_k {group.top_k} falls on a tie")
    kept = set(order[: group.top_k])
    m = max(z)
    w = [math.exp(v - m) if i in kept else 0.0 for i, v in enumerate(z)]
    s = sum(w)
    return tuple(v / s for v in w)


def draft_spread_law() -> tuple[float, ...]:
    """The drafter's law over the starts at SPREAD (softmax of DRAFT_SPREAD_LOGITS; the other tokens, at -8, hold
    4e-4 together and are left out)."""
    w = [math.exp(v) for v in DRAFT_SPREAD_LOGITS]
    return tuple(v / sum(w) for v in w)


def prompt(i: int, length: int = 12) -> tuple[int, ...]:
    """Request i's prompt: whole periods of the region (a start, its chain, SPREAD), chains varying with i, ending
    with SPREAD so that the first output token is a start (the module docstring's alignment)."""
    toks: list[int] = []
    k = 0
    while len(toks) < length:
        toks = list(CHAINS[(i + k) % N_STARTS]) + [SPREAD] + toks
        k += 1
    return tuple(toks[-length:])


# ---------------------------------------------------------------------------------------------- the check


@dataclass
class BonusCheck:
    n_bonus: int  # tokens after SPREAD at positions >= 1 (the bonus positions with MTP)
    n_first: int  # tokens after SPREAD at position 0 (prefill)
    counts: dict  # group name -> counts per start (positions >= 1)
    laws: dict  # group name -> spread law
    deviations: int  # requests with a token off the chain or off the kept starts
    first_deviation: tuple | None  # (label, position, previous token, token, what was due)
    misaligned: int  # bonus-position tokens not at a multiple of STEPS + 1 (0 whenever deviations is 0)
    statistic: float
    df: int
    p_value: float

    @property
    def passed(self) -> bool:
        return self.deviations == 0 and self.p_value >= P_THRESHOLD

    def summary(self) -> str:
        parts = []
        for name, c in self.counts.items():
            n = max(1, sum(c))
            freq = ", ".join(f"{x / n:.3f} vs {p:.3f}" for x, p in zip(c, self.laws[name]))
            parts.append(f"{name}: n {sum(c)}, starts {freq}")
        return (
            f"{self.n_bonus} bonus-position tokens (+{self.n_first} prefill); "
            + "; ".join(parts)
            + f"; chi-square {self.statistic:.2f} df {self.df}, p = {self.p_value:.3g} (rejects below {P_THRESHOLD:g}: "
            f"false-alarm rate {ALPHA:g})"
        )


def read_stream(prev: int, out, law) -> tuple[list[tuple[int, int]], tuple | None]:
    """(position, start index) of every token after SPREAD, and the first deviation (position, previous token,
    token, what was due) or None; the stream is read up to its first deviation."""
    spread: list[tuple[int, int]] = []
    for pos, tok in enumerate(out):
        if prev == SPREAD:
            j = START_INDEX.get(tok)
            if j is None or law[j] == 0:
                return spread, (
                    pos,
                    prev,
                    tok,
                    f"a start of the group's kept set {[STARTS[i] for i in range(N_STARTS) if law[i] > 0]}",
                )
            spread.append((pos, j))
        elif SUCCESSOR.get(prev) != tok:
            return spread, (pos, prev, tok, SUCCESSOR.get(prev, "a region-2 chain (previous token is off it)"))
        prev = tok
    return spread, None


def check_streams(streams, vocab: int) -> BonusCheck:
    """``streams``: (label, group, prompt, output ids) of every bonus request."""
    laws = {g.name: spread_law(vocab, g) for g in GROUPS}
    counts = {g.name: [0] * N_STARTS for g in GROUPS}
    n_first = misaligned = deviations = 0
    first = None
    for label, group, prompt_ids, out in streams:
        law = spread_law(vocab, group)
        laws.setdefault(group.name, law)
        c = counts.setdefault(group.name, [0] * N_STARTS)
        spread, dev = read_stream(prompt_ids[-1], out, law)
        for pos, j in spread:
            if pos == 0:
                n_first += 1
                continue
            c[j] += 1
            misaligned += pos % (STEPS + 1) != 0
        if dev is not None:
            deviations += 1
            first = first or (label, *dev)
    stat, df = 0.0, 0
    for name, c in counts.items():
        n = sum(c)
        if n == 0:
            continue
        kept = [i for i in range(N_STARTS) if laws[name][i] > 0]
        res = stats.pearson_chi2([c[i] for i in kept], [laws[name][i] for i in kept])
        stat += res.statistic
        df += len(kept) - 1
    p = stats.chi2_sf(stat, df) if df else 1.0
    return BonusCheck(
        n_bonus=sum(map(sum, counts.values())),
        n_first=n_first,
        counts=counts,
        laws=laws,
        deviations=deviations,
        first_deviation=first,
        misaligned=misaligned,
        statistic=stat,
        df=df,
        p_value=p,
    )


def power(vocab: int, n_per_group: int, fault) -> float:
    """Probability that the chi-square (df summed over GROUPS) rejects at P_THRESHOLD when group g's bonus tokens follow
    ``fault(g)`` (a law over the starts) instead of the spread law: 1 when the fault puts mass off the kept starts
    (the support test fails at once with probability >= that of one such token in n), else the noncentral
    chi-square tail (asymptotic; simulated in the unit tests)."""
    nc, df, off = 0.0, 0, 0.0
    for g in GROUPS:
        p, q = spread_law(vocab, g), fault(g)
        off_mass = sum(qi for pi, qi in zip(p, q) if pi == 0)
        off = max(off, 1 - (1 - off_mass) ** n_per_group)
        kept = [i for i in range(N_STARTS) if p[i] > 0]
        qk = [q[i] for i in kept]
        s = sum(qk) or 1.0
        nc += n_per_group * sum((qk[a] / s - p[i]) ** 2 / p[i] for a, i in enumerate(kept))
        df += len(kept) - 1
    return max(off, stats.ncx2_sf(stats.chi2_isf(P_THRESHOLD, df), df, nc))


# ---------------------------------------------------------------------------------------------- weights


def check_exact(h: float) -> list[float]:
    """The head entries (logit - OTHER_LOGIT) / h of region 2; ValueError unless they and the logits are exact in
    bf16 (the argument of the ring's check_exact)."""
    entries = [(lg - ring.OTHER_LOGIT) / h for _t, _s, lg in successor_logits()]
    logits = [CHAIN_LOGIT, *SPREAD_LOGITS]
    bad = [v for v in (*entries, *logits) if not ring.exact_bf16(v)]
    if bad:
        raise ValueError(f"sampled pair, region 2: values not exact in bf16 at normed hidden {h}: {bad}")
    return entries


def fits(hidden: int, assistant_hidden: int, vocab: int) -> bool:
    return DIM_BASE + R2_SIZE <= min(hidden, assistant_hidden) and R2_START + R2_SIZE <= vocab


def write_target(E, W, h: float) -> None:
    """Region 2 into the target's embedding E (V x H) and head W (V x H), already holding the ring."""
    check_exact(h)
    for t in range(R2_START, R2_START + R2_SIZE):
        E[t, 1:DIM_BASE] = 0.0  # the ring dim 1 + f this token had
        E[t, dim(t)] = ring.EMBED_VALUE
    for t, s, lg in successor_logits():
        W[s, dim(t)] = (lg - ring.OTHER_LOGIT) / h


def write_drafter(Wa, P, ha: float, pre_scale: float) -> None:
    """Region 2 into the assistant's head Wa (V x A) and pre-projection P (A x 2H)."""
    for t in range(R2_START, R2_START + R2_SIZE):
        P[dim(t), dim(t)] = pre_scale
    for t, s in SUCCESSOR.items():
        Wa[s, dim(t)] = (DRAFT_CHAIN_LOGIT - ring.DRAFT_OTHER_LOGIT) / ha
    for s, lg in zip(STARTS, DRAFT_SPREAD_LOGITS):
        Wa[s, dim(SPREAD)] = (lg - ring.DRAFT_OTHER_LOGIT) / ha


def write_centroids(cw, cluster_of, top_k: int) -> None:
    """Centroid head (ordered embeddings): at a region-2 token, only the clusters holding its drafts score > 0."""
    for t, s in SUCCESSOR.items():
        cw[cluster_of[s], dim(t)] = 1.0
    for s in STARTS:
        cw[cluster_of[s], dim(SPREAD)] = 1.0
    if int((cw[:, dim(SPREAD)] > 0).sum()) > top_k:
        raise ValueError("sampled pair, region 2: the starts span more clusters than the centroid head keeps")


def marker() -> dict:
    return {
        "r2_start": R2_START,
        "r2_size": R2_SIZE,
        "spread": SPREAD,
        "chains": [list(c) for c in CHAINS],
        "chain_logit": CHAIN_LOGIT,
        "spread_logits": list(SPREAD_LOGITS),
        "draft_chain_logit": DRAFT_CHAIN_LOGIT,
        "draft_spread_logits": list(DRAFT_SPREAD_LOGITS),
    }
