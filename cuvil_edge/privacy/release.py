"""Clipped epsilon-DP release of a numeric vector with the Laplace mechanism.

Order of work: validate -> clip -> reserve epsilon in the ledger -> draw noise
-> commit -> return. Nothing noisy is computed before the spend is durably
reserved, so a crash can only over-count, never under-count.

This module does not import torch.
"""

from __future__ import annotations

import logging
import math
import secrets
from typing import TYPE_CHECKING

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy._checks import positive_finite

if TYPE_CHECKING:
    from cuvil_edge.privacy.ledger import PrivacyLedger

logger = logging.getLogger(__name__)


def _laplace_noise(scale: float, shape: tuple[int, ...]) -> np.ndarray:
    """Draw i.i.d. Laplace(0, scale) noise of the given shape (float64).

    TODO(privacy): this float sampler is vulnerable to Mironov-style
    floating-point attacks. A later issue replaces it with an exact integer
    (discrete Laplace on a fixed grid) sampler; keep this interface.
    """
    rng = np.random.default_rng(secrets.randbits(128))
    return rng.laplace(0.0, scale, size=shape)


def _as_values(values: object) -> np.ndarray:
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise PrivacyError(f"values must be numeric, got {type(values).__name__}: {e}") from e
    if arr.size == 0:
        raise PrivacyError("values is empty; there is nothing to release")
    if not np.all(np.isfinite(arr)):
        raise PrivacyError("values contain NaN or infinity; clean them before release")
    return arr


def _clip(arr: np.ndarray, lower: float | None, upper: float | None) -> np.ndarray:
    lo = None if lower is None else float(lower)
    hi = None if upper is None else float(upper)
    for name, b in (("lower", lo), ("upper", hi)):
        if b is not None and not math.isfinite(b):
            raise PrivacyError(f"{name} bound must be finite, got {b!r}")
    if lo is not None and hi is not None and lo > hi:
        raise PrivacyError(f"lower bound {lo} is above upper bound {hi}")
    if lo is None and hi is None:
        return arr
    return np.clip(arr, lo, hi)


def release(
    values: object,
    sensitivity: float,
    epsilon: float,
    ledger: PrivacyLedger,
    *,
    lower: float | None = None,
    upper: float | None = None,
    key: str | None = None,
    round: int | None = None,
) -> np.ndarray:
    """Release ``values`` under epsilon-DP with the Laplace mechanism.

    ``sensitivity`` is the L1 sensitivity of the whole (clipped) vector; each
    coordinate gets Laplace noise of scale ``sensitivity / epsilon``. Values
    are clipped into ``[lower, upper]`` when bounds are given. ``epsilon`` is
    reserved in ``ledger`` before any noise is drawn and committed after.

    Returns:
        The noisy values, float64, with the shape of ``values``.

    Raises:
        PrivacyError: invalid values, bounds, sensitivity or epsilon, or ``key``
            names a release that was already published.
        BudgetExhaustedError: the site's budget would be exceeded; nothing released.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    eps = positive_finite("epsilon", epsilon)
    sens = positive_finite("sensitivity", sensitivity)
    clipped = _clip(_as_values(values), lower, upper)
    scale = sens / eps
    if not math.isfinite(scale):
        raise PrivacyError(f"noise scale sensitivity/epsilon = {sens}/{eps} is not finite")

    reservation = ledger.reserve_laplace(eps, key=key, round=round)
    if reservation.status != "reserved":
        # A committed row means a value was already published under this key;
        # drawing fresh noise would spend the budget twice while counting once.
        raise PrivacyError(
            f"a release with key {reservation.key!r} was already published "
            f"({reservation.status}); reuse that value or release under a new key"
        )
    noisy = clipped + _laplace_noise(scale, clipped.shape)
    # exclusive: if a concurrent retry with the same key committed first, this
    # value is discarded (LedgerError) so only one noisy value ever leaves.
    ledger.commit(reservation, exclusive=True)
    logger.debug("released %d values at eps=%g (key %s)", clipped.size, eps, reservation.key)
    return noisy
