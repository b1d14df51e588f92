"""Small, exact statistics for accuracy gates and A/B comparisons (stdlib only, no scipy).

* ``wilson_interval(k, n)``: Wilson score interval of a binomial proportion.
* ``mcnemar(b, c)``: exact (binomial) two-sided McNemar p-value for paired discordant counts.
* ``paired_compare(a, b)``: per-question correctness of two runs -> discordant counts, flipped question indices
  both ways, McNemar p-value.
* ``speedup`` / ``latency_speedup``: throughput ratios.
* ``chi2_sf`` / ``chi2_isf`` / ``ncx2_sf``: chi-square tails (central and noncentral), ``pearson_chi2``: Pearson's
  goodness-of-fit test, ``min_detectable_tv``: the smallest total-variation deviation it detects with a given
  power (the sampled pair's lossless-in-distribution check, mtpmatrix.pairs.sampled).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (0.0, 1.0) when n == 0."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k} n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact (big-integer arithmetic, no underflow for large n)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)


def mcnemar(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: 2 * P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), capped at 1.

    ``b`` = pairs right only in A, ``c`` = right only in B. No discordant pairs -> 1.0.
    """
    if b < 0 or c < 0:
        raise ValueError("counts must be >= 0")
    n = b + c
    if n == 0:
        return 1.0
    m = min(b, c)
    if 2 * m == n:
        return 1.0
    return min(1.0, sum(math.comb(n, i) for i in range(m + 1)) / (1 << (n - 1)))


@dataclass
class PairedComparison:
    n: int
    correct_a: int
    correct_b: int
    both_correct: int
    both_wrong: int
    only_a: list[int] = field(default_factory=list)  # indices right in A, wrong in B (B lost them)
    only_b: list[int] = field(default_factory=list)  # indices right in B, wrong in A (B gained them)
    p_value: float = 1.0

    @property
    def acc_a(self) -> float:
        return self.correct_a / self.n if self.n else 0.0

    @property
    def acc_b(self) -> float:
        return self.correct_b / self.n if self.n else 0.0

    @property
    def delta(self) -> float:
        """acc_b - acc_a."""
        return self.acc_b - self.acc_a

    def significant(self, alpha: float = 0.05) -> bool:
        return self.p_value < alpha

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acc_a=self.acc_a, acc_b=self.acc_b, delta=self.delta)
        return d


def paired_compare(a: Sequence[bool] | Mapping[int, bool], b: Sequence[bool] | Mapping[int, bool]) -> PairedComparison:
    """Compare per-question correctness of run A and run B on the same questions.

    Sequences must have equal length (position = question index); mappings (index -> correct) are compared on
    the indices both have.
    """
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        da = dict(a) if isinstance(a, Mapping) else dict(enumerate(a))
        db = dict(b) if isinstance(b, Mapping) else dict(enumerate(b))
        keys = sorted(set(da) & set(db))
        pairs = [(k, bool(da[k]), bool(db[k])) for k in keys]
    else:
        if len(a) != len(b):
            raise ValueError(f"paired comparison needs equal lengths, got {len(a)} and {len(b)}")
        pairs = [(i, bool(x), bool(y)) for i, (x, y) in enumerate(zip(a, b))]
    only_a = [i for i, x, y in pairs if x and not y]
    only_b = [i for i, x, y in pairs if y and not x]
    return PairedComparison(
        n=len(pairs),
        correct_a=sum(x for _, x, _ in pairs),
        correct_b=sum(y for _, _, y in pairs),
        both_correct=sum(x and y for _, x, y in pairs),
        both_wrong=sum(not x and not y for _, x, y in pairs),
        only_a=only_a,
        only_b=only_b,
        p_value=mcnemar(len(only_a), len(only_b)),
    )


def speedup(baseline: float, candidate: float) -> float | None:
    """Throughput ratio candidate / baseline (tokens/s or requests/s); None when the baseline is not positive."""
    if baseline is None or candidate is None or baseline <= 0:
        return None
    return candidate / baseline


def latency_speedup(baseline_s: float, candidate_s: float) -> float | None:
    """Latency ratio baseline / candidate (> 1 means the candidate is faster); None on non-positive input."""
    if baseline_s is None or candidate_s is None or baseline_s <= 0 or candidate_s <= 0:
        return None
    return baseline_s / candidate_s


# --- chi-square goodness of fit ---------------------------------------------------------------------------------
# Stdlib only: this module is installed into every row's venv (no scipy there); tests/unit/test_sampled.py checks
# these against scipy.


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x): a series for x < a + 1, a continued fraction beyond (both converge
    to double precision within a few hundred terms for the a, x of a chi-square test)."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # P(a, x) = front/a * sum_n x^n / ((a+1)...(a+n))
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Lentz's continued fraction for Q(a, x)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _gamma_q(df / 2, x / 2)


def chi2_isf(alpha: float, df: int) -> float:
    """The critical value c with chi2_sf(c, df) = alpha (bisection; 0 < alpha < 1)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo, hi = 0.0, 1.0
    while chi2_sf(hi, df) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return (lo + hi) / 2


def ncx2_sf(x: float, df: int, nc: float) -> float:
    """P(X >= x) for X ~ noncentral chi-square (df, noncentrality nc): a Poisson(nc/2) mixture of central tails."""
    if nc <= 0:
        return chi2_sf(x, df)
    lam = nc / 2
    total = 0.0
    j0 = int(lam)  # sum outwards from the Poisson mode, so large nc neither underflows nor needs many terms
    for direction in (range(j0, j0 + 100_000), range(j0 - 1, -1, -1)):
        for j in direction:
            w = math.exp(-lam + j * math.log(lam) - math.lgamma(j + 1))
            total += w * chi2_sf(x, df + 2 * j)
            if w < 1e-17 and abs(j - lam) > 5 * math.sqrt(lam) + 5:
                break
    return min(1.0, total)


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    df: int
    p_value: float


def pearson_chi2(counts: Sequence[int], probs: Sequence[float]) -> ChiSquareResult:
    """Pearson's goodness-of-fit statistic sum (O - E)^2 / E of ``counts`` against ``probs`` (all > 0, summing to
    1), df = categories - 1, p-value from the chi-square tail."""
    if len(counts) != len(probs) or len(counts) < 2:
        raise ValueError(f"need >= 2 categories and one probability per count, got {len(counts)} / {len(probs)}")
    if any(p <= 0 for p in probs) or abs(sum(probs) - 1) > 1e-9:
        raise ValueError(f"probabilities must be > 0 and sum to 1, got {list(probs)}")
    n = sum(counts)
    if n <= 0:
        raise ValueError("no observations")
    stat = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))
    df = len(counts) - 1
    return ChiSquareResult(statistic=stat, df=df, p_value=chi2_sf(stat, df))


def detectable_noncentrality(df: int, alpha: float, power: float) -> float:
    """The noncentrality at which a chi-square test at level ``alpha`` rejects with probability ``power``."""
    crit = chi2_isf(alpha, df)
    lo, hi = 0.0, 1.0
    while ncx2_sf(crit, df, hi) < power:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ncx2_sf(crit, df, mid) < power else (lo, mid)
    return hi


def min_detectable_tv(probs: Sequence[float], n: int, alpha: float, power: float) -> float:
    """Every alternative at total variation >= this from ``probs`` gives Pearson's test on ``n`` observations
    noncentrality >= detectable_noncentrality(df, alpha, power), so it is detected with at least ``power``
    (asymptotically). Why: for q - p = d with TV(q, p) = e and S = {d > 0}, Cauchy-Schwarz on S and on its
    complement gives sum d^2/p >= e^2/p(S) + e^2/(1 - p(S)) = e^2/(p(S)(1 - p(S))) >= e^2/max_S p(S)(1 - p(S)).
    """
    k = len(probs)
    lam = detectable_noncentrality(k - 1, alpha, power)
    best = 0.0
    for mask in range(1, 2**k - 1):
        ps = sum(p for i, p in enumerate(probs) if mask >> i & 1)
        best = max(best, ps * (1 - ps))
    return math.sqrt(lam / n * best)
