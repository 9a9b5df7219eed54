"""Pool the sites' noisy evaluation counts into one federated accuracy with a 95 % interval.

Each site releases (correct, total) with discrete Laplace noise of scale ``b`` (its
``count-noise-scale``). Summing over sites, accuracy = ΣC / ΣT. The interval is the normal
(delta-method) one for a ratio, counting both the sampling variance of the evaluation set and
the DP noise (variance of a discrete Laplace of scale b: 2e^{-1/b} / (1 - e^{-1/b})²); it is
clipped to [0, 1], and so is the estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

Z95 = 1.959963984540054


@dataclass(frozen=True)
class SiteCounts:
    """One site's released counts and the noise scale they carry."""

    correct: int
    total: int
    noise_scale: float


@dataclass(frozen=True)
class PooledAccuracy:
    accuracy: float
    low: float
    high: float
    noisy_total: int
    sites: int

    def to_dict(self) -> dict[str, float | int]:
        return {"accuracy": self.accuracy, "low": self.low, "high": self.high, "noisy_total": self.noisy_total,
                "sites": self.sites}


def discrete_laplace_variance(scale: float) -> float:
    """Variance of the discrete Laplace with P(k) ∝ exp(-|k| / scale)."""
    r = math.exp(-1.0 / scale)
    return 2.0 * r / (1.0 - r) ** 2


def clip01(value: float) -> float:
    return min(1.0, max(0.0, value))


def pool(counts: Iterable[SiteCounts]) -> PooledAccuracy | None:
    """The pooled accuracy and its 95 % interval, or None when the noisy total is not positive."""
    counts = list(counts)
    correct = sum(c.correct for c in counts)
    total = sum(c.total for c in counts)
    if not counts or total <= 0:
        return None
    p = clip01(correct / total)
    noise = sum(discrete_laplace_variance(c.noise_scale) for c in counts)
    var = (noise + total * p * (1 - p) + p * p * noise) / (total * total)
    half = Z95 * math.sqrt(var)
    return PooledAccuracy(p, clip01(p - half), clip01(p + half), total, len(counts))
