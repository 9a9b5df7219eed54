"""Differential privacy for cuvil-edge (layer 4).

``release`` (Laplace release of a clipped vector) and ``PrivacyLedger`` (the
durable per-site budget ledger) do not import torch. The DP-SGD helpers are
loaded lazily on first access, since they need torch and opacus.
"""

from __future__ import annotations

import importlib
from typing import Any

from cuvil_edge.privacy.counts import release_counts
from cuvil_edge.privacy.ledger import PrivacyLedger, Reservation
from cuvil_edge.privacy.release import GaussianMechanism, LaplaceMechanism, release

_LAZY_DPSGD = (
    "DpSgdPlan",
    "DpSgdResult",
    "noise_multiplier_for",
    "plan_dp_sgd",
    "steps_for",
    "train_dp_sgd",
)

__all__ = [
    "GaussianMechanism",
    "LaplaceMechanism",
    "PrivacyLedger",
    "Reservation",
    "release",
    "release_counts",
    *_LAZY_DPSGD,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_DPSGD:
        return getattr(importlib.import_module("cuvil_edge.privacy.dpsgd"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
