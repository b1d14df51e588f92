"""mtpmatrix.core.stats against published and hand-computed reference values."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest

from mtpmatrix.core import stats


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3 (Wilson score,
# no continuity correction), z = 1.96, to 4 decimals.
@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_table(k, n, lo, hi):
    got = stats.wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=6e-5) and got[1] == pytest.approx(hi, abs=6e-5)


def _wilson_decimal(k, n, z):
    getcontext().prec = 50
    k, n, z = Decimal(k), Decimal(n), Decimal(str(z))
    p = k / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * (p * (1 - p) / n + z2 / (4 * n * n)).sqrt() / denom
    return float(centre - half), float(centre + half)


@pytest.mark.parametrize(
    "k,n,z", [(10, 20, 1.96), (130, 200, 1.96), (200, 200, 1.96), (89, 200, 2.576), (1, 1319, 1.0)]
)
def test_wilson_high_precision(k, n, z):
    lo, hi = stats.wilson_interval(k, n, z)
    rlo, rhi = _wilson_decimal(k, n, z)
    assert lo == pytest.approx(max(0.0, rlo), abs=1e-12) and hi == pytest.approx(min(1.0, rhi), abs=1e-12)


def test_wilson_edges():
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = stats.wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    with pytest.raises(ValueError):
        stats.wilson_interval(3, 2)


def _mcnemar_exact(b, c):
    n, m = b + c, min(b, c)
    return min(Fraction(1), 2 * sum(Fraction(math.comb(n, i), 2**n) for i in range(m + 1)))


@pytest.mark.parametrize(
    "b,c,expected",
    [
        (0, 0, 1.0),
        (3, 3, 1.0),
        (0, 5, 0.0625),
        (5, 0, 0.0625),
        (1, 6, 0.125),  # 2*(1+7)/2^7
        (2, 8, 0.109375),  # 2*(1+10+45)/1024
        (0, 1, 1.0),
        (4, 5, 1.0),
    ],
)
def test_mcnemar_hand_values(b, c, expected):
    assert stats.mcnemar(b, c) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("b,c", [(10, 20), (7, 31), (100, 140), (0, 1200), (600, 700)])
def test_mcnemar_exact_fraction(b, c):
    assert stats.mcnemar(b, c) == pytest.approx(float(_mcnemar_exact(b, c)), rel=1e-12)


def test_mcnemar_large_n_no_underflow():
    # 2 * P(X <= 450), X ~ Bin(1100, 1/2): ~1e-9, from terms like 2^-1100 that a float loop would underflow
    p = stats.mcnemar(450, 650)
    assert p == pytest.approx(float(_mcnemar_exact(450, 650)), rel=1e-12) and 0.0 < p < 1e-8
    assert stats.binom_cdf_half(2, 4) == pytest.approx(11 / 16)


def test_paired_compare_lists_and_maps():
    a = [True, True, False, False, True, False]
    b = [True, False, True, False, True, True]
    cmp = stats.paired_compare(a, b)
    assert (cmp.n, cmp.correct_a, cmp.correct_b, cmp.both_correct, cmp.both_wrong) == (6, 3, 4, 2, 1)
    assert cmp.only_a == [1] and cmp.only_b == [2, 5]
    assert cmp.p_value == 1.0 and not cmp.significant()
    assert cmp.delta == pytest.approx(1 / 6)
    d = cmp.as_dict()
    assert d["acc_a"] == 0.5 and d["only_b"] == [2, 5]
    cm = stats.paired_compare({0: True, 5: False, 9: True}, {5: True, 9: False, 11: True})
    assert cm.n == 2 and cm.only_a == [9] and cm.only_b == [5]
    with pytest.raises(ValueError):
        stats.paired_compare([True], [True, False])


def test_paired_compare_significant():
    a = [True] * 20 + [False] * 20
    b = [False] * 20 + [True] * 20
    b[:2] = [True, True]  # 18 lost, 20 gained: not significant
    assert not stats.paired_compare(a, b).significant()
    b2 = [False] * 20 + [False] * 20  # 20 lost, 0 gained
    assert stats.paired_compare(a, b2).p_value == pytest.approx(2 / 2**20)


def test_speedups():
    assert stats.speedup(100.0, 250.0) == 2.5
    assert stats.speedup(0, 1) is None and stats.speedup(None, 1) is None
    assert stats.latency_speedup(10.0, 4.0) == 2.5
    assert stats.latency_speedup(1.0, 0) is None
