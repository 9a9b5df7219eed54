"""Pool the sites' noisy evaluation counts into one federated accuracy with a 95 % confidence set.

Each site releases (correct, total) with independent discrete Laplace noise of scale ``b``
(its ``count-noise-scale``, 2 / ``eval_epsilon``): ``P(k) ∝ exp(-|k| / b)`` on each count.
Summed over the sites, ``S_C = X + V`` and ``S_T = N + W`` where ``N`` is the (unknown) number of
evaluation records, ``X`` the number classified correctly, and ``V``, ``W`` are independent,
each distributed as the sum of the sites' discrete Laplaces; that distribution is public (the
scales are), and is computed here exactly by convolution (tails below ~1e-12 dropped).

The interval is a test inversion with the nuisance ``N`` handled by a Bonferroni step
(Berger–Boos):

1. From ``S_T`` alone, an exact confidence set for the total: ``N ∈ [N_lo, N_hi]`` (``N >= 0``)
   with ``P(N outside) <= ALPHA_TOTAL``.
2. Given ``N``, ``X ~ Binomial(N, p)``: ``p`` is kept when neither tail of ``X + V`` at the
   observed ``S_C`` is below ``(ALPHA - ALPHA_TOTAL) / 2`` (equal-tailed exact test).
3. The set is the union over ``N ∈ [N_lo, N_hi]``. ``X + V`` grows stochastically with ``N`` and
   with ``p``, so the union's upper end is the test's at ``N_lo`` and its lower end the test's at
   ``N_hi``: two root searches.

Coverage is at least ``1 - ALPHA`` whatever ``N`` is, by construction, under the model that
each evaluation record is correct independently with probability ``p`` (the pooled target).
Sites with different accuracies make ``X`` a Poisson-binomial, whose tails are lighter than the
binomial's with the same mean (Hoeffding 1956), so the test is then conservative; the tests
measure coverage by seeded simulation, also with unequal sites. The interval is inside [0, 1]
by construction; it is conservative (the Bonferroni split and the union over ``N``).

A result is *not estimable* when the counts cannot tell apart a useful range of accuracies: the
noisy total is consistent with no evaluation records at all (``N_lo == 0``), the set is wider
than :data:`MAX_INFORMATIVE_WIDTH`, or the counts fit no accuracy at all (the set is empty, an
event of probability < ``ALPHA``). The report then says "not estimable" instead of showing an
interval; ``low``/``high`` still hold the (valid, uninformative) set, [0, 1] when it is empty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: 1 - confidence of the pooled interval.
ALPHA = 0.05
#: Part of ALPHA spent on the confidence set of the total N (the rest on the test for p).
ALPHA_TOTAL = 0.01
#: Wider intervals are reported as "not estimable".
MAX_INFORMATIVE_WIDTH = 0.5
#: Each site's noise distribution is kept where its tail mass is above ~e^-TAIL_NATS.
TAIL_NATS = 28.0
#: Largest noise support convolved exactly; beyond it the result is not estimable ([0, 1]).
MAX_SUPPORT = 1 << 22


@dataclass(frozen=True)
class SiteCounts:
    """One site's released counts and the noise scale they carry."""

    correct: int
    total: int
    noise_scale: float


@dataclass(frozen=True)
class PooledAccuracy:
    """``accuracy`` is the noisy ratio ΣC / ΣT, clipped into [low, high]; ``[low, high]`` the 95 %
    confidence set; ``estimable`` False when that set says nothing useful (see the module doc)."""

    accuracy: float
    low: float
    high: float
    noisy_total: int
    sites: int
    estimable: bool = True

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "accuracy": self.accuracy,
            "low": self.low,
            "high": self.high,
            "noisy_total": self.noisy_total,
            "sites": self.sites,
            "estimable": self.estimable,
        }


def clip01(value: float) -> float:
    return min(1.0, max(0.0, value))


def _reach(scale: float) -> int:
    return int(math.ceil(scale * TAIL_NATS)) + 1


def _discrete_laplace_pmf(scale: float) -> np.ndarray:
    k = _reach(scale)
    r = math.exp(-1.0 / scale)
    return (1 - r) / (1 + r) * np.power(r, np.abs(np.arange(-k, k + 1, dtype=np.float64)))


@lru_cache(maxsize=64)
def noise_cdf(scales: tuple[float, ...]) -> tuple[int, np.ndarray]:
    """(K, F): the CDF of the sum of independent discrete Laplaces of ``scales`` on [-K, K],
    ``F[i] = P(sum <= i - K)``; ``scales`` sorted (a cache key)."""
    from scipy.signal import fftconvolve

    pmf = np.ones(1)
    for s in scales:
        part = _discrete_laplace_pmf(s)
        pmf = np.convolve(pmf, part) if min(pmf.size, part.size) < 512 else fftconvolve(pmf, part)
    pmf = np.clip(pmf, 0.0, None)
    cdf = np.cumsum(pmf / pmf.sum())
    cdf.setflags(write=False)
    return (pmf.size - 1) // 2, cdf


def _cdf_at(cdf: tuple[int, np.ndarray], t: np.ndarray) -> np.ndarray:
    """P(noise <= t) for integer array ``t``."""
    k, f = cdf
    i = t + k
    out = np.where(i >= f.size, 1.0, 0.0)
    inside = (i >= 0) & (i < f.size)
    out[inside] = f[i[inside]]
    return out


def total_bounds(noisy_total: int, cdf: tuple[int, np.ndarray], alpha: float) -> tuple[int, int]:
    """[N_lo, N_hi] with P(N outside) <= alpha (equal tails; N_lo clipped at 0; N_hi may be < 0)."""
    k, f = cdf
    w_lo = int(np.searchsorted(f, alpha / 2, side="right")) - k  # P(W < w_lo) <= alpha/2
    w_hi = int(np.searchsorted(f, 1 - alpha / 2, side="left")) - k  # P(W > w_hi) <= alpha/2
    return max(0, noisy_total - w_hi), noisy_total - w_lo


def _tail_function(noisy_correct: int, n: int, cdf: tuple[int, np.ndarray], upper: bool):
    """p -> P_p(X + V <= s) (``upper`` False) or P_p(X + V >= s), X ~ Binomial(n, p)."""
    from scipy.stats import binom

    x = np.arange(n + 1)
    f = _cdf_at(cdf, (noisy_correct - (1 if upper else 0)) - x)  # P(V <= s - x), or <= s - 1 - x
    if upper:
        return lambda p: 1.0 - float(binom.pmf(x, n, p) @ f)
    return lambda p: float(binom.pmf(x, n, p) @ f)


def _root(g, level: float) -> float:
    from scipy.optimize import brentq

    return float(brentq(lambda p: g(p) - level, 0.0, 1.0, xtol=1e-7))


def accuracy_bounds(
    noisy_correct: int,
    noisy_total: int,
    scales: Iterable[float],
    *,
    alpha: float = ALPHA,
    alpha_total: float = ALPHA_TOTAL,
) -> tuple[float, float, int] | None:
    """(low, high, N_lo) of the confidence set for p, or None when it is empty (or the noise is too
    wide to convolve). Coverage >= 1 - alpha for every N under the binomial model (module doc)."""
    scales = tuple(sorted(float(s) for s in scales))
    if sum(2 * _reach(s) + 1 for s in scales) > MAX_SUPPORT:
        return None
    cdf = noise_cdf(scales)
    n_lo, n_hi = total_bounds(noisy_total, cdf, alpha_total)
    if n_hi < n_lo:
        return None
    level = (alpha - alpha_total) / 2
    below = _tail_function(noisy_correct, n_lo, cdf, upper=False)  # decreasing in p
    if below(0.0) <= level:
        return None
    high = 1.0 if below(1.0) > level else _root(below, level)
    above = _tail_function(noisy_correct, n_hi, cdf, upper=True)  # increasing in p
    if above(1.0) <= level:
        return None
    low = 0.0 if above(0.0) > level else _root(above, level)
    if low > high:
        return None
    return low, high, n_lo


def pool(counts: Iterable[SiteCounts]) -> PooledAccuracy | None:
    """The pooled accuracy and its 95 % confidence set, or None when there are no counts or the
    noisy total is not positive (no ratio to show; the report says "not estimable")."""
    counts = list(counts)
    correct = sum(c.correct for c in counts)
    total = sum(c.total for c in counts)
    if not counts or total <= 0:
        return None
    ratio = clip01(correct / total)
    bounds = accuracy_bounds(correct, total, [c.noise_scale for c in counts])
    if bounds is None:
        return PooledAccuracy(ratio, 0.0, 1.0, total, len(counts), estimable=False)
    low, high, n_lo = bounds
    estimable = n_lo > 0 and high - low <= MAX_INFORMATIVE_WIDTH
    return PooledAccuracy(min(high, max(low, ratio)), low, high, total, len(counts), estimable)
