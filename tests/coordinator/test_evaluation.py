"""Pooled federated accuracy from noisy counts: inside [0, 1], a 95 % confidence set that covers
(seeded simulation, Clopper–Pearson bound on the coverage), and "not estimable" where the DP noise
is comparable to the totals."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import beta

from cuvil_edge.coordinator.evaluation import MAX_INFORMATIVE_WIDTH, SiteCounts, noise_cdf, pool
from cuvil_edge.coordinator.report import format_round
from cuvil_edge.privacy import samplers

#: The demo's evaluation sets: the digits partition of 3 sites (seed 7, alpha 0.5, test 0.2),
#: eval_fraction 0.1 (configs/sites/*.yaml).
DEMO_EVAL_SIZES = (71, 48, 25)


@pytest.mark.parametrize("counts", [
    [SiteCounts(-40, 30, 20.0), SiteCounts(5, 10, 20.0)],      # noise pushed correct below zero
    [SiteCounts(90, 40, 20.0), SiteCounts(80, 50, 20.0)],       # ... and above the total
    [SiteCounts(3, 1, 2.0)],
    [SiteCounts(-9, 150, 1.0), SiteCounts(0, 1, 1.0)],          # counts that fit no accuracy
    [SiteCounts(140, 150, 0.5)],
])
def test_estimate_and_interval_stay_in_unit_interval(counts):
    p = pool(counts)
    assert 0.0 <= p.low <= p.accuracy <= p.high <= 1.0


def test_no_estimate_without_a_positive_noisy_total():
    assert pool([SiteCounts(3, -5, 2.0), SiteCounts(0, 2, 2.0)]) is None
    assert pool([]) is None


def discrete_laplace_variance(scale: float) -> float:
    """Closed form: the variance of the discrete Laplace with P(k) ∝ exp(-|k| / scale)."""
    r = math.exp(-1.0 / scale)
    return 2.0 * r / (1.0 - r) ** 2


def test_discrete_laplace_variance_matches_the_sampler():
    z = samplers.discrete_laplace(Fraction(7, 2), 50_000, random.Random(1))
    assert np.var(z) == pytest.approx(discrete_laplace_variance(3.5), rel=0.05)


def test_noise_distribution_is_the_convolution_of_the_sites_laplaces():
    scales = (2.0, 5.0, 40.0)
    k, cdf = noise_cdf(scales)
    pmf = np.diff(cdf, prepend=0.0)
    support = np.arange(-k, k + 1)
    assert pmf @ support == pytest.approx(0.0, abs=1e-9)
    assert pmf @ support ** 2 == pytest.approx(sum(discrete_laplace_variance(s) for s in scales), rel=1e-9)
    single = np.diff(noise_cdf((3.0,))[1], prepend=0.0)
    kk = noise_cdf((3.0,))[0]
    assert single == pytest.approx(samplers.discrete_laplace_pmf(np.arange(-kk, kk + 1), 3.0), abs=1e-12)


def test_without_noise_the_interval_is_clopper_pearson():
    """Noise scale 0.05 (P(noise != 0) ~ 4e-9): N is known, and the test for p is the exact
    binomial one at the 0.04 left after the total's 0.01."""
    p = pool([SiteCounts(40, 50, 0.05)])
    assert p.low == pytest.approx(beta.ppf(0.02, 40, 11), abs=1e-5)
    assert p.high == pytest.approx(beta.ppf(0.98, 41, 10), abs=1e-5)
    assert p.accuracy == 0.8 and p.estimable


def _simulate(sizes, accuracies, epsilon, trials, seed):
    """Seeded rounds of the agents' release: binomial correct counts, then the project's exact
    discrete Laplace (scale 2/ε) on correct and on total; returns the pooled results and the
    target (the record-weighted accuracy)."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    scale = Fraction(2) / Fraction(epsilon)
    noise = samplers.discrete_laplace(scale, trials * len(sizes) * 2, rng).reshape(trials, len(sizes), 2)
    correct = np.stack([np_rng.binomial(n, p, trials) for n, p in zip(sizes, accuracies)], axis=1)
    results = [pool(SiteCounts(int(correct[t, i] + noise[t, i, 0]), int(n + noise[t, i, 1]), float(scale))
                    for i, n in enumerate(sizes)) for t in range(trials)]
    target = sum(n * p for n, p in zip(sizes, accuracies)) / sum(sizes)
    return results, target


@pytest.mark.parametrize("sizes, accuracies, epsilon", [
    (DEMO_EVAL_SIZES, (0.85, 0.85, 0.85), 0.05),   # the demo
    ((50, 50, 50), (0.8, 0.8, 0.8), 0.05),
    ((50, 50, 50), (0.8, 0.8, 0.8), 0.5),
    ((50, 50, 50), (0.8, 0.8, 0.8), 2.0),
    ((50, 50, 50), (0.97, 0.97, 0.97), 2.0),        # near the edge, where a normal interval fails
    ((50, 50, 50), (0.95, 0.8, 0.5), 0.5),          # unequal sites (Poisson-binomial correct counts)
    (DEMO_EVAL_SIZES, (0.9, 0.7, 0.5), 2.0),
])
def test_interval_covers_at_least_95_percent(sizes, accuracies, epsilon):
    """Coverage of the confidence set, with a one-sided 99 % Clopper–Pearson lower bound >= 0.95.
    A round without an estimate (noisy total <= 0) reports nothing: counted as covered, since
    its confidence set is all of [0, 1]."""
    trials = 600
    seed = sum(sizes) + int(100 * epsilon) + int(1000 * accuracies[0])
    results, target = _simulate(sizes, accuracies, epsilon, trials, seed)
    hits = 0
    for r in results:
        if r is None:
            hits += 1
            continue
        assert 0.0 <= r.low <= r.accuracy <= r.high <= 1.0
        assert not r.estimable or r.high - r.low <= MAX_INFORMATIVE_WIDTH
        hits += r.low <= target <= r.high
    assert beta.ppf(0.01, hits, trials - hits + 1) >= 0.95, hits / trials


def test_the_demo_setting_is_not_estimable_and_a_larger_epsilon_is():
    """ε 0.05 on the demo's 144 evaluation records: per count a noise std of about 57 per site,
    so the pooled result is (almost) never informative and the report says so."""
    results, _ = _simulate(DEMO_EVAL_SIZES, (0.85,) * 3, 0.05, 200, seed=3)
    assert sum(r is None or not r.estimable for r in results) >= 198
    results, _ = _simulate((50, 50, 50), (0.8,) * 3, 2.0, 200, seed=4)
    assert all(r is not None and r.estimable for r in results)
    assert np.median([r.high - r.low for r in results]) < 0.3


def test_report_says_not_estimable_instead_of_the_unit_interval():
    sites = {"a": {"target": "rpi4", "eval-noisy-correct": 30, "eval-noisy-total": 20}}
    noisy = pool([SiteCounts(130, 140, 40.0), SiteCounts(-20, 15, 40.0), SiteCounts(30, 20, 40.0)])
    assert not noisy.estimable
    text = format_round({"round": 3, "global_accuracy": 0.9, "sites": sites, "federated_accuracy": noisy.to_dict()})
    assert "pooled accuracy not estimable" in text and "1.000" not in text and "interval" not in text
    text = format_round({"round": 3, "global_accuracy": 0.9, "sites": sites})  # noisy total <= 0: no result
    assert "pooled accuracy not estimable" in text
    clear = pool([SiteCounts(120, 150, 1.0)])
    assert clear.estimable
    text = format_round({"round": 3, "global_accuracy": 0.9, "sites": sites, "federated_accuracy": clear.to_dict()})
    assert f"pooled accuracy 0.800 (95 % interval {clear.low:.3f}–{clear.high:.3f}" in text
