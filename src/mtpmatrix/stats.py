"""Small, exact statistics for accuracy gates and A/B comparisons (stdlib only, no scipy).

* ``wilson_interval(k, n)``: Wilson score interval of a binomial proportion.
* ``mcnemar(b, c)``: exact (binomial) two-sided McNemar p-value for paired discordant counts.
* ``paired_compare(a, b)``: per-question correctness of two runs -> discordant counts, flipped question indices
  both ways, McNemar p-value.
* ``speedup`` / ``latency_speedup``: throughput ratios.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field


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

    def as_dict(self) -> dict:
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
        n=len(pairs), correct_a=sum(x for _, x, _ in pairs), correct_b=sum(y for _, _, y in pairs),
        both_correct=sum(x and y for _, x, y in pairs), both_wrong=sum(not x and not y for _, x, y in pairs),
        only_a=only_a, only_b=only_b, p_value=mcnemar(len(only_a), len(only_b)),
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

