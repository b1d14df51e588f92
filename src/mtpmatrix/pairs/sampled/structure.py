"""A sampled check that sees structure: per-group, per-position, transition, verify-depth and first-token tests on the
sampled pair's tokens (the plan's and the mixed_sampling family's), beside the pooled chi-square of
pairs.sampled.ring.check_outputs, which is blind to a per-position bias that cancels when pooled, serial correlation with
exact marginals, opposite biases in two groups and a wrong first token in every request.

Why every test has the same null. Under a lossless sampler each request's output is the target's own autoregressive
sample; the target's law given the whole history depends only on the previous token's offset class, which is the
same everywhere, so a request's offsets are i.i.d. with its group's closed form (``group_law``), independent across
requests. Hence the offset at position i, given ANY function of the past (position, previous offset, the run of d3
before it, which request group), still has the group's closed form: each test is Pearson's chi-square of the offset
counts in strata of such a function against the closed form (sum over strata, df = sum of (kept offsets - 1)); by the
martingale central limit theorem the statistic is chi-square under the null even though stratum sizes are random.

Tests (``TESTS``), on the tokens of every sampled request, each request's first token excluded except in "first":
  group       strata = request group (the plan's two T 0.7 groups apart, hot and cold): opposite biases in two groups
              that share a closed form, and a group sampled with another group's temperature / top-k / top-p;
  position    strata = (group, position in the output // 16): a drift along the output;
  period6     strata = (group, position mod 6): a bias alternating with the position (parity, period 3 or 6: a
              verify step that keeps all 6 tokens);
  transition  strata = (group, previous offset): serial correlation with exact marginals;
  depth       strata = (group, (run of d3 just before the token) mod 6). At topk 1 the drafter always proposes d3
              (ring.DRAFT_LOGITS) and a residual never is d3 (the rejected draft is removed), so a verify step is
              k accepted d3 then a non-d3 residual (k < 5) or 5 d3 then a bonus token: the stratum IS the token's
              depth in its verify step (5 = bonus), read from the output alone (the first token comes from prefill,
              verify steps start after it). On other servers it is a past-measurable stratum like the others;
  first       the first token of each request (prefill's sampler, not verify): per group, the exact multinomial
              probability of a chi-square at least as large (enumerated; the counts are too small for the chi-square
              tail), Bonferroni over the groups.
Strata whose smallest expected count is below MIN_EXPECTED are pooled per group into one leftover stratum (dropped if
that is still too small): the chi-square tail is accurate only above it.

False alarms: each of the M tests rejects at FAMILY_ALPHA / M, so the whole family at most FAMILY_ALPHA = 1e-4 per
server (Bonferroni; the existing pooled check keeps its own 1e-4). Calibration and power: tests/unit/
test_surface_sampling.py (null runs of the full request plan; each test's target fault).
Tokens off a group's kept offsets are a failure outright (probability 0 under the closed form).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from mtpmatrix.core import stats
from mtpmatrix.pairs.sampled import ring

FAMILY_ALPHA = 1e-4
TESTS = ("group", "position", "period6", "transition", "depth", "first")
TEST_ALPHA = FAMILY_ALPHA / len(TESTS)  # Bonferroni
MIN_EXPECTED = 5.0
POSITION_BLOCK = 16
D3 = ring.OFFSETS.index(ring.KEPT_OFFSETS[-1])  # category of the topk-1 draft (the drafter's argmax)


@cache
def group_law(vocab: int, group: ring.SamplingGroup) -> tuple[float, ...]:
    """The group's closed form over the four offsets (0 where cut), the same for sglang's joint sampler and verify's
    top-k-first order; ValueError when the two differ, a boundary sits within BOUNDARY_MARGIN, or mass is left off
    the four offsets."""
    laws = []
    for order in ("joint", "top_k_first"):
        d = ring.token_distribution(vocab, group, order)
        if d["top_p_margin"] < ring.BOUNDARY_MARGIN or d["other"] > 0:
            raise ValueError(f"{group.name} ({order}): top-p margin {d['top_p_margin']:.3f}, other mass {d['other']}")
        laws.append(tuple(d[o] for o in ring.OFFSETS))
    if max(abs(a - b) for a, b in zip(*laws)) > 1e-12:
        raise ValueError(f"{group.name}: joint and top-k-first laws differ: {laws}")
    return laws[0]


def categories(prev: int, tokens) -> np.ndarray:
    """Index into ring.OFFSETS of each token's offset from the one before (prev = the prompt's last token);
    -1 for an offset off the four or a token off the ring."""
    out = np.full(len(tokens), -1, dtype=np.int64)
    for i, tok in enumerate(tokens):
        d = ring.offset_of(prev, tok)
        if d in ring.OFFSETS:
            out[i] = ring.OFFSETS.index(d)
        prev = tok
    return out


def d3_run_before(cat: np.ndarray) -> np.ndarray:
    """For each position i >= 1: the number of consecutive d3 offsets just before i, counted from position 1 (the
    verify steps start after the prefill token); 0 at position 0."""
    cat = np.asarray(cat)
    run = np.zeros(len(cat), dtype=np.int64)
    if len(cat) < 2:
        return run
    is3 = cat == D3
    is3[0] = False  # the prefill token starts no run: verify steps begin after it
    idx = np.arange(len(cat))
    last_break = np.maximum.accumulate(np.where(is3, 0, idx))
    run[1:] = (idx - last_break)[:-1]  # the run of d3 ending at i - 1
    return run


@dataclass
class TestResult:
    name: str
    statistic: float
    df: int
    p_value: float
    strata: int
    dropped: int  # tokens in strata too small even pooled
    worst: str = ""  # the stratum contributing most, for the message

    @property
    def passed(self) -> bool:
        return self.p_value >= TEST_ALPHA


@dataclass
class StructureCheck:
    n: int
    off_support: int
    first_off_support: tuple | None  # (stream label, position, prev, token, group)
    tests: list[TestResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.off_support == 0 and all(t.passed for t in self.tests)

    @property
    def failed(self) -> list[TestResult]:
        return [t for t in self.tests if not t.passed]

    def summary(self) -> str:
        parts = [
            (
                f"{t.name}: chi2 {t.statistic:.1f} df {t.df} p {t.p_value:.3g}"
                if t.df
                else f"{t.name}: exact p {t.p_value:.3g} (Bonferroni over {t.strata} groups)"
            )
            + (f" (worst {t.worst})" if not t.passed and t.worst else "")
            for t in self.tests
        ]
        return (
            f"{self.n} offsets, {self.off_support} off the kept offsets; "
            + "; ".join(parts)
            + f"; each test at alpha {TEST_ALPHA:.3g} (family {FAMILY_ALPHA:g}, Bonferroni over {len(TESTS)})"
        )


def _chi2_strata(name, groups, laws, names, keys, cats, key_names) -> TestResult:
    """Pearson chi-square summed over strata (group, key) against each group's law, small strata pooled per group."""
    stat, df, strata, dropped, worst = 0.0, 0, 0, 0, (0.0, "")
    for g in np.unique(groups):
        law = np.array(laws[g])
        kept = law > 0
        sel = groups == g
        k, c = keys[sel], cats[sel]
        leftover = np.zeros(len(law))
        rows = []
        for key in np.unique(k):
            counts = np.bincount(c[k == key], minlength=len(law)).astype(float)
            if counts.sum() * law[kept].min() < MIN_EXPECTED:
                leftover += counts
            else:
                rows.append((key_names(key), counts))
        if leftover.sum():
            if leftover.sum() * law[kept].min() < MIN_EXPECTED:
                dropped += int(leftover.sum())
            else:
                rows.append(("pooled small strata", leftover))
        for label, counts in rows:
            e = counts.sum() * law[kept]
            s = float((((counts[kept] - e) ** 2) / e).sum())
            stat += s
            df += int(kept.sum()) - 1
            strata += 1
            if s > worst[0]:
                freq = ", ".join(
                    f"{ring.OFFSETS[i]}: {counts[i] / counts.sum():.3f} vs {law[i]:.3f}" for i in np.flatnonzero(kept)
                )
                worst = (s, f"{names[g]} {label}: n {int(counts.sum())}, {freq}")
    p = stats.chi2_sf(stat, df) if df else 1.0
    return TestResult(name, stat, df, p, strata, dropped, worst[1])


@cache
def _exact_table(n: int, law: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Chi-square statistic of every count vector of Multinomial(n, law's kept cells) (sorted) and the upper tail of
    their probabilities: P(statistic >= table[i]) = tail[i]."""
    p = np.array([x for x in law if x > 0])
    c = len(p)
    cuts = np.array(list(itertools.combinations(range(n + c - 1), c - 1)), dtype=np.int64).reshape(-1, c - 1)
    x = np.diff(np.concatenate([np.full((len(cuts), 1), -1), cuts, np.full((len(cuts), 1), n + c - 1)], axis=1)) - 1
    e = n * p
    chi = (((x - e) ** 2) / e).sum(axis=1)
    lg = np.array([math.lgamma(v + 1) for v in range(n + 1)])
    logpmf = math.lgamma(n + 1) - lg[x].sum(axis=1) + (x * np.log(p)).sum(axis=1)
    order = np.argsort(chi)
    chi, pmf = chi[order], np.exp(logpmf[order])
    tail = np.cumsum(pmf[::-1])[::-1]
    return chi, tail


def exact_chi2_p(counts, law) -> float:
    """P(chi-square >= observed) for Multinomial(n, law) over its kept cells, by enumeration (small n)."""
    law = tuple(float(v) for v in law)
    kept = [i for i, v in enumerate(law) if v > 0]
    obs = np.array([counts[i] for i in kept], dtype=float)
    n = int(obs.sum())
    if n == 0:
        return 1.0
    p = np.array([law[i] for i in kept])
    stat = float((((obs - n * p) ** 2) / (n * p)).sum())
    chi, tail = _exact_table(n, law)
    i = int(np.searchsorted(chi, stat - 1e-9 * max(1.0, stat)))
    return float(min(1.0, tail[i])) if i < len(tail) else 0.0


def check_streams(streams, vocab: int) -> StructureCheck:
    """``streams``: (label, group, prompt, output ids) of every sampled request counted (repeat copies excluded)."""
    items, off, first_off = [], 0, None
    for label, group, prompt, out in streams:
        law = group_law(vocab, group)
        cat = categories(prompt[-1], out)
        bad = [i for i, c in enumerate(cat) if c < 0 or law[c] == 0]
        off += len(bad)
        if bad and first_off is None:
            i = bad[0]
            first_off = (label, i, prompt[-1] if i == 0 else out[i - 1], out[i], group.name)
        items.append((group, cat))
    check = check_categories(items, vocab)
    check.off_support, check.first_off_support = off, first_off
    return check


def check_categories(items, vocab: int) -> StructureCheck:
    """The tests on (group, offset categories) per request (categories as ``categories`` gives them)."""
    groups_seen: list = []
    G, P, C, R, PREV = [], [], [], [], []
    n = 0
    for group, cat in items:
        if group not in groups_seen:
            groups_seen.append(group)
        cat = np.asarray(cat, dtype=np.int64)
        n += len(cat)
        G.append(np.full(len(cat), groups_seen.index(group)))
        P.append(np.arange(len(cat)))
        C.append(cat)
        R.append(d3_run_before(cat))
        PREV.append(np.concatenate(([-1], cat[:-1])) if len(cat) else cat)
    laws = [group_law(vocab, grp) for grp in groups_seen]
    names = [grp.name for grp in groups_seen]
    off_table = np.array([[law[i] == 0 for i in range(len(ring.OFFSETS))] for law in laws] or [[True]])
    check = StructureCheck(n, 0, None)
    if not G:
        return check
    g, pos, cat, run, prev = (np.concatenate(a) for a in (G, P, C, R, PREV))
    on = cat >= 0
    on[on] = ~off_table[g[on], cat[on]]
    check.off_support = int((~on).sum())
    later = on & (pos >= 1)
    specs = {
        "group": (later, np.zeros_like(pos), lambda k: "all positions >= 1"),
        "position": (
            later,
            pos // POSITION_BLOCK,
            lambda k: f"positions {k * POSITION_BLOCK}-{k * POSITION_BLOCK + POSITION_BLOCK - 1}",
        ),
        "period6": (later, pos % 6, lambda k: f"positions = {k} mod 6"),
        "transition": (later & (prev >= 0), prev, lambda k: f"after offset {ring.OFFSETS[k]}"),
        "depth": (later, run % 6, lambda k: f"depth {k}" + (" (bonus at topk 1)" if k == 5 else "")),
    }
    for name in TESTS[:-1]:
        mask, key, key_name = specs[name]
        check.tests.append(_chi2_strata(name, g[mask], laws, names, key[mask], cat[mask], key_name))
    # first token: exact per group, Bonferroni over the groups
    firsts = on & (pos == 0)
    ps, worst = [], ""
    for gi in np.unique(g[pos == 0]):
        counts = np.bincount(cat[firsts & (g == gi)], minlength=len(ring.OFFSETS))
        pg = exact_chi2_p(counts, laws[gi])
        ps.append(pg)
        if pg == min(ps):
            freq = ", ".join(
                f"{ring.OFFSETS[i]}: {int(counts[i])} vs {laws[gi][i] * counts.sum():.1f}"
                for i in range(len(counts))
                if laws[gi][i] > 0
            )
            worst = f"{names[gi]}: n {int(counts.sum())}, {freq}"
    p_first = min(1.0, len(ps) * min(ps)) if ps else 1.0
    check.tests.append(TestResult("first", float("nan"), 0, p_first, len(ps), 0, worst))
    return check
