"""Pooled federated accuracy from noisy counts: never outside [0, 1], and its 95 % interval covers."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from cuvil_edge.coordinator.evaluation import SiteCounts, discrete_laplace_variance, pool
from cuvil_edge.privacy import samplers


@pytest.mark.parametrize("counts", [
    [SiteCounts(-40, 30, 20.0), SiteCounts(5, 10, 20.0)],      # noise pushed correct below zero
    [SiteCounts(90, 40, 20.0), SiteCounts(80, 50, 20.0)],       # ... and above the total
    [SiteCounts(3, 1, 2.0)],
])
def test_estimate_and_interval_stay_in_unit_interval(counts):
    p = pool(counts)
    assert 0.0 <= p.low <= p.accuracy <= p.high <= 1.0


def test_no_estimate_without_a_positive_noisy_total():
    assert pool([SiteCounts(3, -5, 2.0), SiteCounts(0, 2, 2.0)]) is None
    assert pool([]) is None


def test_discrete_laplace_variance_matches_the_sampler():
    z = samplers.discrete_laplace(Fraction(7, 2), 50_000, random.Random(1))
    assert np.var(z) == pytest.approx(discrete_laplace_variance(3.5), rel=0.05)


def test_interval_covers_the_true_accuracy_about_95_percent():
    """3 sites, 60 examples each, true accuracy 0.8, counts noised at ε = 0.3 (scale 2/0.3)."""
    rng, np_rng = random.Random(7), np.random.default_rng(7)
    scale = Fraction(20, 3)
    hits, trials = 0, 400
    for _ in range(trials):
        counts = []
        for _site in range(3):
            correct = int(np_rng.binomial(60, 0.8))
            noise = samplers.discrete_laplace(scale, 2, rng)
            counts.append(SiteCounts(correct + int(noise[0]), 60 + int(noise[1]), float(scale)))
        p = pool(counts)
        hits += p is not None and p.low <= 0.8 <= p.high
    assert 0.90 <= hits / trials <= 0.99
