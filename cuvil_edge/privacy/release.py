"""Float-safe DP release of a numeric vector: exact integer noise on a 2^-k grid.

Order of work: validate -> clip -> plan the grid -> reserve in the ledger ->
draw noise -> commit -> return. Nothing noisy is computed before the spend is
durably reserved, so a crash can only over-count, never under-count.

The grid mechanism (OpenDP's "discretize" construction, CKS20 samplers):

1. Clamp each coordinate into ``[lower, upper]`` (exact in float).
2. Round to integers ``x_i = round(v_i * 2^k)`` (``ldexp`` then ``rint``: exact).
   With ``clip_norm`` C the integer vector is then scaled down, in integer
   arithmetic, to L1 (Laplace) or L2 (Gaussian) norm <= floor(C * 2^k), so any
   two clipped vectors differ by at most 2 * floor(C * 2^k): the sensitivity
   must then be at least 2C (replace-one diameter of the ball).
3. Integer sensitivity. Laplace (L1): ``ceil(Delta * 2^k) + d`` (rounding moves
   each of the d coordinates by at most half a step for each input). Gaussian
   (L2): ``Delta * 2^k + ceil(sqrt(d))``. With ``clip_norm``: ``2 floor(C 2^k)``.
4. Add exact discrete noise (``samplers``): Laplace of scale Delta_int / eps,
   where eps is the stated epsilon rounded *down* to a dyadic rational if its
   exact value has too many bits (so the mechanism is eps'-DP with eps' <= eps
   and charging eps is safe); Gaussian with variance parameter (sigma 2^k)^2.
5. Output ``(x_i + Z_i) * 2^-k`` as float64: every output is a multiple of
   2^-k, and every grid point has positive probability under every input, so
   no output rules an input out (the Mironov 2012 attack has nothing to use).

This module does not import torch.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy import samplers
from cuvil_edge.privacy._checks import positive_finite

if TYPE_CHECKING:
    from cuvil_edge.privacy.ledger import PrivacyLedger

logger = logging.getLogger(__name__)

GRID_MARGIN_BITS = 10  # default grid: rounding slack <= 2^-10 of the sensitivity
_K_RANGE = (-60, 60)
_MAX_GRID_INT = 1 << 62
_MAX_SCALE_NUMERATOR = 1 << 62


@dataclass(frozen=True)
class GridPlan:
    """What a grid release does: grid ``2^-k``, integer sensitivity, noise law.

    ``epsilon`` is the epsilon the Laplace noise really gives (<= the stated
    one); ``scale`` is the discrete Laplace scale in grid units. For the
    Gaussian, ``sigma2`` is the variance parameter in grid units and
    ``sensitivity`` the widened L2 sensitivity in value units (for the ledger).
    """

    mechanism: Literal["laplace", "gaussian"]
    k: int
    dimension: int
    sensitivity_int: Fraction
    sensitivity: float
    epsilon: Fraction | None = None
    scale: Fraction | None = None
    sigma: float | None = None
    sigma2: Fraction | None = None
    clip_int: int | None = None


def _default_k(sensitivity: float, dimension: int) -> int:
    """Smallest k with 2^-k <= sensitivity / (2^margin * d)."""
    target = Fraction(dimension * (1 << GRID_MARGIN_BITS)) / Fraction(sensitivity)
    k = math.ceil(math.log2(target)) - 1
    while Fraction(2) ** k < target:
        k += 1
    return k


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not _K_RANGE[0] <= k <= _K_RANGE[1]:
        raise PrivacyError(f"grid exponent k must be an int in {list(_K_RANGE)}, got {k!r}")
    return k


def _clip_int(clip_norm: float | None, sensitivity: float, k: int) -> int | None:
    if clip_norm is None:
        return None
    c = positive_finite("clip_norm", clip_norm)
    if sensitivity < 2 * c:
        raise PrivacyError(
            f"clip_norm {c} bounds the sensitivity only by 2*clip_norm = {2 * c} "
            f"(replace-one diameter), but sensitivity {sensitivity} was given; pass >= {2 * c}")
    return math.floor(Fraction(c) * Fraction(2) ** k)


def plan_laplace(sensitivity: float, epsilon: float, dimension: int, *, k: int | None = None,
                 clip_norm: float | None = None) -> GridPlan:
    """Plan an eps-DP discrete-Laplace grid release of ``dimension`` values.

    Raises:
        PrivacyError: bad parameters, or a grid so fine that the noise scale
            cannot be represented exactly (choose a smaller k).
    """
    sens = positive_finite("sensitivity", sensitivity)
    eps = Fraction(positive_finite("epsilon", epsilon))
    k = _check_k(_default_k(sens, dimension) if k is None else k)
    clip = _clip_int(clip_norm, sens, k)
    if clip is not None:
        s_int = 2 * clip
    else:
        s_int = math.ceil(Fraction(sens) * Fraction(2) ** k) + dimension
    s_int = max(s_int, 1)
    if s_int.bit_length() > 42:
        raise PrivacyError(f"grid 2^-{k} makes the integer sensitivity {s_int} too large; "
                           "use a smaller grid exponent k")
    # eps rounded down to m fractional bits so scale = s_int / eps has a small numerator.
    m = 62 - s_int.bit_length()
    eff = eps if eps.denominator <= (1 << m) else Fraction(math.floor(eps * (1 << m)), 1 << m)
    if eff <= 0:
        raise PrivacyError(f"epsilon {epsilon} is too small for grid 2^-{k}")
    scale = Fraction(s_int) / eff
    if scale.numerator >= _MAX_SCALE_NUMERATOR:  # cannot happen given m; never sample inexactly
        raise PrivacyError(f"noise scale {scale} is not exactly representable")
    widened = float(Fraction(s_int) / Fraction(2) ** k)
    return GridPlan("laplace", k, dimension, Fraction(s_int), widened, epsilon=eff, scale=scale,
                    clip_int=clip)


def gaussian_sigma_for(epsilon: float, delta: float, sensitivity: float) -> float:
    """Noise sigma giving (eps, delta)-DP via zCDP: rho = (sqrt(L + eps) - sqrt(L))^2, L = ln(1/delta)."""
    eps = positive_finite("epsilon", epsilon)
    dlt = positive_finite("delta", delta)
    if dlt >= 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    log_inv = math.log(1 / dlt)
    rho = (math.sqrt(log_inv + eps) - math.sqrt(log_inv)) ** 2
    return sensitivity / math.sqrt(2 * rho)


def plan_gaussian(sensitivity: float, sigma: float, dimension: int, *, k: int | None = None,
                  clip_norm: float | None = None) -> GridPlan:
    """Plan a discrete-Gaussian grid release (L2 ``sensitivity``, noise ``sigma``).

    The ledger must be charged with ``plan.sensitivity`` (widened by the
    rounding slack) and ``plan.sigma``: rho = sensitivity^2 / (2 sigma^2) (CKS20
    Thm 14; the multivariate tau term is < 1e-60 for sigma >= 4 grid steps).

    Raises:
        PrivacyError: bad parameters or sigma under 4 grid steps.
    """
    sens = positive_finite("sensitivity", sensitivity)
    sig = positive_finite("sigma", sigma)
    k = _check_k(_default_k(sens, dimension) if k is None else k)
    clip = _clip_int(clip_norm, sens, k)
    grid = Fraction(2) ** k
    if clip is not None:
        s_int = Fraction(2 * clip)
    else:
        s_int = Fraction(sens) * grid + (math.isqrt(dimension - 1) + 1)  # + ceil(sqrt(d))
    sigma2 = (Fraction(sig) * grid) ** 2
    if sigma2 < 16:
        raise PrivacyError(f"sigma {sig} is under 4 grid steps of 2^-{k}; use a larger k")
    widened = math.nextafter(float(s_int / grid), math.inf)  # round the sensitivity up
    return GridPlan("gaussian", k, dimension, s_int, widened, sigma=sig, sigma2=sigma2,
                    clip_int=clip)


def to_grid(values: np.ndarray, k: int) -> np.ndarray:
    """``round(values * 2^k)`` as exact int64 (round half to even).

    Raises:
        PrivacyError: a value is too large for the grid.
    """
    scaled = np.rint(np.ldexp(values, k))
    if not np.all(np.abs(scaled) < _MAX_GRID_INT):
        raise PrivacyError(f"values too large for grid 2^-{k}; clip them (lower/upper) or lower k")
    return scaled.astype(np.int64)


def _clip_norm_int(x: np.ndarray, c: int, mechanism: str) -> np.ndarray:
    """Scale integer vector ``x`` down (toward zero, exactly) to norm <= c."""
    mags = [abs(int(v)) for v in x.ravel().tolist()]
    if mechanism == "laplace":
        norm = sum(mags)
    else:
        sq = sum(v * v for v in mags)
        norm = math.isqrt(sq) + (0 if math.isqrt(sq) ** 2 == sq else 1)  # >= the L2 norm
    if norm <= c:
        return x
    scaled = np.array([v * c // norm for v in mags], dtype=np.int64).reshape(x.shape)
    return np.sign(x) * scaled


def apply_plan(plan: GridPlan, values: np.ndarray, rng: random.Random | None = None) -> np.ndarray:
    """Round ``values`` to the plan's grid, add its noise, scale back (float64).

    Every element gets independent noise. With ``clip_norm`` in the plan the
    whole array is norm-clipped as one vector.
    """
    x = to_grid(np.asarray(values, dtype=np.float64), plan.k)
    if plan.clip_int is not None:
        x = _clip_norm_int(x, plan.clip_int, plan.mechanism)
    if plan.mechanism == "laplace":
        z = samplers.discrete_laplace(plan.scale, x.size, rng)
    else:
        z = samplers.discrete_gaussian(plan.sigma2, x.size, rng)
    noisy = x + z.reshape(x.shape)
    return np.ldexp(noisy.astype(np.float64), -plan.k)


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


def _draw(plan: GridPlan, values: np.ndarray, rng: random.Random | None) -> np.ndarray:
    """The noise step (a seam for tests: they check it runs after the reservation)."""
    return apply_plan(plan, values, rng)


def _publish(ledger: PrivacyLedger, reservation, plan: GridPlan, values: np.ndarray,
             rng: random.Random | None) -> np.ndarray:
    if reservation.status != "reserved":
        # A committed row means a value was already published under this key;
        # drawing fresh noise would spend the budget twice while counting once.
        raise PrivacyError(
            f"a release with key {reservation.key!r} was already published "
            f"({reservation.status}); reuse that value or release under a new key"
        )
    noisy = _draw(plan, values, rng)
    # exclusive: if a concurrent retry with the same key committed first, this
    # value is discarded (LedgerError) so only one noisy value ever leaves.
    ledger.commit(reservation, exclusive=True)
    return noisy


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
    mechanism: Literal["laplace", "gaussian"] = "laplace",
    k: int | None = None,
    clip_norm: float | None = None,
    sigma: float | None = None,
    rng: random.Random | None = None,
) -> np.ndarray:
    """Release ``values`` under DP with exact discrete noise on a 2^-k grid.

    ``mechanism="laplace"`` (default): epsilon-DP; ``sensitivity`` is the L1
    sensitivity of the whole (clipped) vector; ``epsilon`` is reserved in the
    ledger. ``mechanism="gaussian"``: ``sensitivity`` is L2; noise ``sigma``
    (value units) is given or calibrated from ``epsilon`` and the ledger's
    delta by zCDP; the ledger is charged by ``reserve_gaussian`` with the
    sensitivity widened by the rounding slack. Values are clamped into
    ``[lower, upper]`` and, with ``clip_norm``, norm-clipped (then
    ``sensitivity`` must be >= 2 * clip_norm). ``k`` fixes the grid (default:
    step <= sensitivity / (1024 d)); ``rng`` is for tests only (default: OS CSPRNG).

    Returns:
        The noisy values, float64 multiples of 2^-k, with the shape of ``values``.

    Raises:
        PrivacyError: invalid values, bounds, sensitivity, epsilon or grid, or
            ``key`` names a release that was already published.
        BudgetExhaustedError: the site's budget would be exceeded; nothing released.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    eps = positive_finite("epsilon", epsilon)
    sens = positive_finite("sensitivity", sensitivity)
    clipped = _clip(_as_values(values), lower, upper)
    if mechanism == "laplace":
        plan = plan_laplace(sens, eps, clipped.size, k=k, clip_norm=clip_norm)
        to_grid(clipped, plan.k)  # refuse unrepresentable values before spending
        reservation = ledger.reserve_laplace(eps, key=key, round=round)
    elif mechanism == "gaussian":
        reserve = getattr(ledger, "reserve_gaussian", None)
        if reserve is None:
            raise PrivacyError("this ledger cannot account Gaussian releases; use mechanism='laplace'")
        sig = sigma if sigma is not None else gaussian_sigma_for(eps, ledger.delta, sens)
        plan = plan_gaussian(sens, sig, clipped.size, k=k, clip_norm=clip_norm)
        to_grid(clipped, plan.k)
        reservation = reserve(plan.sigma, plan.sensitivity, key=key, round=round)
    else:
        raise PrivacyError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    noisy = _publish(ledger, reservation, plan, clipped, rng)
    logger.debug("released %d values (%s, grid 2^-%d, key %s)", clipped.size, mechanism,
                 plan.k, reservation.key)
    return noisy


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
    """Release integer counts with discrete Laplace noise of scale sensitivity/epsilon.

    ``sensitivity`` is the integer L1 sensitivity of the count vector. No grid
    or rounding is involved: the output is the int64 counts plus exact noise.

    Raises:
        PrivacyError: counts are not integers, or bad sensitivity/epsilon/key.
        BudgetExhaustedError: the site's budget would be exceeded; nothing released.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    eps = positive_finite("epsilon", epsilon)
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, (int, np.integer)) \
            or sensitivity < 1:
        raise PrivacyError(f"count sensitivity must be an int >= 1, got {sensitivity!r}")
    arr = np.asarray(counts)
    if arr.size == 0 or arr.dtype.kind not in "iu" or np.any(np.abs(arr) >= _MAX_GRID_INT):
        raise PrivacyError(f"counts must be a non-empty array of integers, got {arr.dtype}")
    plan = GridPlan("laplace", 0, arr.size, Fraction(int(sensitivity)), float(sensitivity),
                    epsilon=Fraction(eps), scale=Fraction(int(sensitivity)) / Fraction(eps))
    if plan.scale.numerator >= _MAX_SCALE_NUMERATOR:
        raise PrivacyError(f"sensitivity {sensitivity} too large for exact sampling")
    reservation = ledger.reserve_pure(eps, key=key, round=round)  # discrete noise at a coarse
    # integer sensitivity has randomized response's RDP curve, not continuous Laplace's
    if reservation.status != "reserved":
        raise PrivacyError(f"a release with key {reservation.key!r} was already published "
                           f"({reservation.status}); reuse that value or release under a new key")
    noisy = arr.astype(np.int64) + samplers.discrete_laplace(plan.scale, arr.size, rng).reshape(arr.shape)
    ledger.commit(reservation, exclusive=True)
    return noisy
