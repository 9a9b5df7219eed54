"""DP release of integer counts (an evaluation's correct answers and its total): exact discrete
Laplace noise, with the ledger reserved first as for every release (privacy/release.py).

This module does not import torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy import samplers
from cuvil_edge.privacy._checks import positive_finite
from cuvil_edge.privacy.accounting import Event, PureDp
from cuvil_edge.privacy.release import MAX_GRID_INT, MAX_SCALE_NUMERATOR, PendingRelease

if TYPE_CHECKING:
    from cuvil_edge.privacy.ledger import PrivacyLedger


@dataclass(frozen=True)
class CountsPlan:
    """Integer counts plus exact discrete Laplace noise of scale ``sensitivity / epsilon``;
    charged as a generic ε-DP event (at a small integer sensitivity a discrete Laplace has
    randomized response's RDP curve, not the continuous Laplace one)."""

    dimension: int
    sensitivity: int
    epsilon: float
    scale: Fraction
    k: int = 0

    def event(self) -> Event:
        return PureDp(self.epsilon)

    def prepare(self, values: object, lower: float | None, upper: float | None) -> np.ndarray:
        arr = np.asarray(values)
        if arr.size != self.dimension or arr.dtype.kind not in "iu" or np.any(np.abs(arr) >= MAX_GRID_INT):
            raise PrivacyError(f"expected {self.dimension} integer counts, got {arr.dtype} shape {arr.shape}")
        if lower is not None or upper is not None:
            raise PrivacyError("counts are not clamped; their sensitivity bounds them")
        return arr.astype(np.int64)

    def apply(self, x: np.ndarray, rng: random.Random | None) -> np.ndarray:
        return x + samplers.discrete_laplace(self.scale, x.size, rng).reshape(x.shape)


@dataclass(frozen=True)
class CountsMechanism:
    """ε-DP noisy integer counts with integer L1 ``sensitivity``."""

    sensitivity: int
    epsilon: float

    def plan(self, dimension: int, delta: float) -> CountsPlan:
        """Raises: PrivacyError: bad sensitivity or epsilon."""
        eps = positive_finite("epsilon", self.epsilon)
        if (
            isinstance(self.sensitivity, bool)
            or not isinstance(self.sensitivity, (int, np.integer))
            or self.sensitivity < 1
        ):
            raise PrivacyError(f"count sensitivity must be an int >= 1, got {self.sensitivity!r}")
        scale = Fraction(int(self.sensitivity)) / Fraction(eps)
        if scale.numerator >= MAX_SCALE_NUMERATOR:
            raise PrivacyError(f"sensitivity {self.sensitivity} too large for exact sampling")
        return CountsPlan(dimension, int(self.sensitivity), eps, scale)


def release_counts(
    counts: object,
    sensitivity: int,
    epsilon: float,
    ledger: PrivacyLedger,
    *,
    key: str | None = None,
    round: int | None = None,
    rng: random.Random | None = None,
) -> np.ndarray:
    """Release integer counts (already computed) with :class:`CountsMechanism`.

    Raises:
        PrivacyError: counts are not integers, or bad sensitivity/epsilon/key.
        ReplayError: ``key`` was already claimed.
        BudgetExhaustedError: the site's budget would be exceeded; nothing released.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    arr = np.asarray(counts)
    plan = CountsMechanism(sensitivity, epsilon).plan(max(arr.size, 1), ledger.delta)
    plan.prepare(arr, None, None)
    pending = PendingRelease(plan, ledger, ledger.reserve(plan.event(), key=key, round=round))
    return pending.publish(arr, rng=rng)
