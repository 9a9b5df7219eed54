"""Exact samplers: goodness of fit against the exact pmf, moments, exact Bernoullis.

Seeded with ``random.Random`` so nothing flakes; thresholds follow OpenDP:
chi-square rejects above df + 6 sqrt(2 df) with every bin expecting >= 5,
moments within 6 standard errors (false-alarm rate about 1e-6 per check).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy import samplers

N = 20_000


def _chi_square(samples: np.ndarray, pmf) -> tuple[float, int]:
    """Statistic and df; tails merged so each bin expects >= 5 (tails carry the remaining mass)."""
    support = np.arange(samples.min() - 50, samples.max() + 51)
    expected = pmf(support) * samples.size
    inner = support[expected >= 5]
    lo, hi = int(inner.min()), int(inner.max())
    probs = pmf(np.arange(lo, hi + 1))
    counts = np.array([np.count_nonzero(samples == v) for v in range(lo, hi + 1)], dtype=float)
    exp = probs * samples.size
    tail_lo, tail_hi = pmf(np.arange(lo - 4000, lo)).sum(), pmf(np.arange(hi + 1, hi + 4001)).sum()
    obs = [np.count_nonzero(samples < lo), np.count_nonzero(samples > hi)]
    for o, p in zip(obs, (tail_lo, tail_hi)):
        if p * samples.size >= 5:
            counts, exp = np.append(counts, o), np.append(exp, p * samples.size)
        else:  # fold a thin tail into the nearest bin
            idx = 0 if o is obs[0] else -1
            counts[idx] += o
            exp[idx] += p * samples.size
    stat = float(((counts - exp) ** 2 / exp).sum())
    return stat, counts.size - 1


def _critical(df: int) -> float:
    return df + 6 * math.sqrt(2 * df)


def _moments(pmf, reach: int) -> tuple[float, float, float]:
    k = np.arange(-reach, reach + 1, dtype=float)
    p = pmf(k)
    mean = float((k * p).sum())
    var = float(((k - mean) ** 2 * p).sum())
    m4 = float(((k - mean) ** 4 * p).sum())
    return mean, var, m4


LAPLACE_SCALES = [0.708, 1, Fraction(7, 2), 25.3]
GAUSS_SIGMA2 = [0.5, Fraction(9, 4), 30.25, 400]


@pytest.mark.parametrize("scale", LAPLACE_SCALES, ids=str)
def test_discrete_laplace_fits_exact_pmf(scale) -> None:
    y = samplers.discrete_laplace(scale, N, random.Random(12345))
    pmf = lambda k: samplers.discrete_laplace_pmf(k, float(scale))  # noqa: E731

    stat, df = _chi_square(y, pmf)
    mean, var, m4 = _moments(pmf, int(60 * float(scale)) + 60)

    assert stat < _critical(df), (stat, df)
    assert abs(y.mean() - mean) < 6 * math.sqrt(var / N)
    assert abs(y.var() - var) < 6 * math.sqrt((m4 - var**2) / N)


@pytest.mark.parametrize("sigma2", GAUSS_SIGMA2, ids=str)
def test_discrete_gaussian_fits_exact_pmf(sigma2) -> None:
    y = samplers.discrete_gaussian(sigma2, N, random.Random(2024))
    pmf = lambda k: samplers.discrete_gaussian_pmf(k, float(sigma2))  # noqa: E731

    stat, df = _chi_square(y, pmf)
    mean, var, m4 = _moments(pmf, int(40 * math.sqrt(float(sigma2))) + 40)

    assert stat < _critical(df), (stat, df)
    assert abs(y.mean() - mean) < 6 * math.sqrt(var / N)
    assert abs(y.var() - var) < 6 * math.sqrt((m4 - var**2) / N)


def test_chi_square_has_power_against_a_wrong_scale() -> None:
    """Positive control: the same test rejects samples drawn at 1.1x the scale."""
    y = samplers.discrete_laplace(Fraction(7, 2) * Fraction(11, 10), N, random.Random(12345))

    stat, df = _chi_square(y, lambda k: samplers.discrete_laplace_pmf(k, 3.5))

    assert stat > _critical(df)


def test_huge_grid_scales_use_exact_big_integers() -> None:
    """sigma in grid units ~ 2^20 (the release path) goes through the Python-int Bernoulli."""
    sigma2 = (Fraction(1.3) * 2**20) ** 2
    y = samplers.discrete_gaussian(sigma2, N, random.Random(7))
    sigma = math.sqrt(float(sigma2))

    assert abs(y.mean()) < 6 * sigma / math.sqrt(N)
    assert abs(y.var() - sigma**2) < 6 * sigma**2 * math.sqrt(2 / N)


@pytest.mark.parametrize(
    "num, den",
    [(0, 1), (1, 1), (1, 3), (5, 2), (7, 3), (3, 1 << 70), ((1 << 70) + 5, 1 << 70), (2**64 + 1, 3 * 2**63)],
    ids=str,
)
def test_bernoulli_exp_probability(num: int, den: int) -> None:
    n = 40_000
    dtype = np.int64 if num < 2**62 else object
    hits = samplers.bernoulli_exp(np.full(n, num, dtype=dtype), den, random.Random(num % 9973 + den % 101))
    p = math.exp(-num / den)

    assert abs(hits.mean() - p) <= 6 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_uniform_below_is_uniform() -> None:
    u = samplers.uniform_below(7, 70_000, random.Random(5))

    counts = np.bincount(u, minlength=7)
    stat = float(((counts - 10_000) ** 2 / 10_000).sum())

    assert u.min() >= 0 and u.max() <= 6
    assert stat < _critical(6)


def test_geometric_matches_closed_form_mean() -> None:
    s, t = 3, 10  # P(G=k) proportional to exp(-0.3 k)
    g = samplers.geometric_exp(s, t, N, random.Random(11))
    p = math.exp(-s / t)
    mean, var = p / (1 - p), p / (1 - p) ** 2

    assert g.min() >= 0
    assert abs(g.mean() - mean) < 6 * math.sqrt(var / N)


def test_seeded_rng_reproduces_and_default_is_os_csprng() -> None:
    a = samplers.discrete_laplace(3, 100, random.Random(1))
    b = samplers.discrete_laplace(3, 100, random.Random(1))

    np.testing.assert_array_equal(a, b)
    assert isinstance(samplers.default_rng(), random.SystemRandom)
    assert samplers.discrete_laplace(3, 10).shape == (10,)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "x"], ids=str)
def test_bad_scales_are_refused(bad) -> None:
    with pytest.raises(PrivacyError):
        samplers.discrete_laplace(bad, 3)
    with pytest.raises(PrivacyError):
        samplers.discrete_gaussian(bad, 3)
