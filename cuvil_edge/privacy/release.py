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
   The ledger is charged with the plan's event: Laplace's continuous curve only
   on a fine grid (integer sensitivity >= 2^10 steps), the generic pure-DP curve
   below that; the Gaussian with its widened sensitivity.
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
from typing import TYPE_CHECKING

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy import samplers
from cuvil_edge.privacy._checks import positive_finite
from cuvil_edge.privacy.accounting import Event, Gaussian, Laplace, PureDp

if TYPE_CHECKING:
    from cuvil_edge.privacy.counts import CountsMechanism, CountsPlan
    from cuvil_edge.privacy.ledger import PrivacyLedger, Reservation

logger = logging.getLogger(__name__)

GRID_MARGIN_BITS = 10  # default grid: rounding slack <= 2^-10 of the sensitivity
_K_RANGE = (-60, 60)
#: Bounds of the exact integer arithmetic, shared with privacy/counts.py: the largest magnitude of a
#: grid or count integer, and of a noise scale's numerator.
MAX_GRID_INT = 1 << 62
MAX_SCALE_NUMERATOR = 1 << 62


#: Below this integer sensitivity (in grid steps) a discrete Laplace release is charged as a
#: generic ε-DP event (randomized response's RDP curve), not by the continuous Laplace curve.
FINE_GRID_STEPS = 1 << GRID_MARGIN_BITS


@dataclass(frozen=True)
class LaplacePlan:
    """An ε-DP discrete-Laplace release on the grid ``2^-k``: integer L1 sensitivity
    ``sensitivity_int``, noise scale ``scale`` (grid units), ``epsilon`` the ε the noise really
    gives (<= the stated ``charged``, which the ledger is charged)."""

    k: int
    dimension: int
    sensitivity_int: Fraction
    sensitivity: float
    epsilon: Fraction
    charged: float
    scale: Fraction
    clip_int: int | None = None

    def event(self) -> Event:
        """The accounting event: the continuous Laplace curve holds only on a fine grid."""
        return Laplace(self.charged) if self.sensitivity_int >= FINE_GRID_STEPS else PureDp(self.charged)

    def prepare(self, values: object, lower: float | None, upper: float | None) -> np.ndarray:
        return _prepare(self, values, lower, upper)

    def apply(self, values: np.ndarray, rng: random.Random | None) -> np.ndarray:
        return apply_plan(self, values, rng)

    def noise(self, size: int, rng: random.Random | None) -> np.ndarray:
        return samplers.discrete_laplace(self.scale, size, rng)

    def norm(self, magnitudes: list[int]) -> int:
        return sum(magnitudes)  # L1


@dataclass(frozen=True)
class GaussianPlan:
    """A discrete-Gaussian release on the grid ``2^-k``: L2 sensitivity ``sensitivity`` (widened by
    the rounding slack), noise ``sigma`` (value units), variance parameter ``sigma2`` (grid units)."""

    k: int
    dimension: int
    sensitivity_int: Fraction
    sensitivity: float
    sigma: float
    sigma2: Fraction
    clip_int: int | None = None

    def event(self) -> Event:
        return Gaussian(self.sigma, self.sensitivity)

    def prepare(self, values: object, lower: float | None, upper: float | None) -> np.ndarray:
        return _prepare(self, values, lower, upper)

    def apply(self, values: np.ndarray, rng: random.Random | None) -> np.ndarray:
        return apply_plan(self, values, rng)

    def noise(self, size: int, rng: random.Random | None) -> np.ndarray:
        return samplers.discrete_gaussian(self.sigma2, size, rng)

    def norm(self, magnitudes: list[int]) -> int:
        sq = sum(v * v for v in magnitudes)
        return math.isqrt(sq) + (0 if math.isqrt(sq) ** 2 == sq else 1)  # >= the L2 norm


GridPlan = LaplacePlan | GaussianPlan


@dataclass(frozen=True)
class LaplaceMechanism:
    """ε-DP: L1 ``sensitivity`` of the whole (clipped) vector; ``k`` fixes the grid (default:
    step <= sensitivity / (1024 d)); with ``clip_norm`` C the vector is L1-clipped and
    ``sensitivity`` must be >= 2C."""

    sensitivity: float
    epsilon: float
    k: int | None = None
    clip_norm: float | None = None

    def plan(self, dimension: int, delta: float) -> LaplacePlan:
        """Raises: PrivacyError: bad parameters or an unrepresentable grid."""
        return plan_laplace(self.sensitivity, self.epsilon, dimension, k=self.k, clip_norm=self.clip_norm)


@dataclass(frozen=True)
class GaussianMechanism:
    """(ε, δ)-DP: L2 ``sensitivity``; noise ``sigma`` given, or calibrated from ``epsilon`` and
    the ledger's δ by zCDP; ``k`` and ``clip_norm`` as for :class:`LaplaceMechanism` (L2)."""

    sensitivity: float
    epsilon: float | None = None
    sigma: float | None = None
    k: int | None = None
    clip_norm: float | None = None

    def plan(self, dimension: int, delta: float) -> GaussianPlan:
        """Raises: PrivacyError: bad parameters, neither ``sigma`` nor ``epsilon``, a coarse grid."""
        sigma = self.sigma
        if sigma is None:
            if self.epsilon is None:
                raise PrivacyError("a Gaussian release needs sigma or epsilon")
            sigma = gaussian_sigma_for(self.epsilon, delta, positive_finite("sensitivity", self.sensitivity))
        return plan_gaussian(self.sensitivity, sigma, dimension, k=self.k, clip_norm=self.clip_norm)


Mechanism = LaplaceMechanism | GaussianMechanism


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
            f"(replace-one diameter), but sensitivity {sensitivity} was given; pass >= {2 * c}"
        )
    return math.floor(Fraction(c) * Fraction(2) ** k)


def plan_laplace(
    sensitivity: float, epsilon: float, dimension: int, *, k: int | None = None, clip_norm: float | None = None
) -> LaplacePlan:
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
        raise PrivacyError(
            f"grid 2^-{k} makes the integer sensitivity {s_int} too large; use a smaller grid exponent k"
        )
    # eps rounded down to m fractional bits so scale = s_int / eps has a small numerator.
    m = 62 - s_int.bit_length()
    eff = eps if eps.denominator <= (1 << m) else Fraction(math.floor(eps * (1 << m)), 1 << m)
    if eff <= 0:
        raise PrivacyError(f"epsilon {epsilon} is too small for grid 2^-{k}")
    scale = Fraction(s_int) / eff
    if scale.numerator >= MAX_SCALE_NUMERATOR:  # cannot happen given m; never sample inexactly
        raise PrivacyError(f"noise scale {scale} is not exactly representable")
    widened = float(Fraction(s_int) / Fraction(2) ** k)
    return LaplacePlan(k, dimension, Fraction(s_int), widened, eff, float(epsilon), scale, clip)


def gaussian_sigma_for(epsilon: float, delta: float, sensitivity: float) -> float:
    """Noise sigma giving (eps, delta)-DP via zCDP: rho = (sqrt(L + eps) - sqrt(L))^2, L = ln(1/delta)."""
    eps = positive_finite("epsilon", epsilon)
    dlt = positive_finite("delta", delta)
    if dlt >= 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    log_inv = math.log(1 / dlt)
    rho = (math.sqrt(log_inv + eps) - math.sqrt(log_inv)) ** 2
    return sensitivity / math.sqrt(2 * rho)


def plan_gaussian(
    sensitivity: float, sigma: float, dimension: int, *, k: int | None = None, clip_norm: float | None = None
) -> GaussianPlan:
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
    return GaussianPlan(k, dimension, s_int, widened, sig, sigma2, clip)


def to_grid(values: np.ndarray, k: int) -> np.ndarray:
    """``round(values * 2^k)`` as exact int64 (round half to even).

    Raises:
        PrivacyError: a value is too large for the grid.
    """
    scaled = np.rint(np.ldexp(values, k))
    if not np.all(np.abs(scaled) < MAX_GRID_INT):
        raise PrivacyError(f"values too large for grid 2^-{k}; clip them (lower/upper) or lower k")
    return scaled.astype(np.int64)


def _clip_norm_int(x: np.ndarray, c: int, plan: GridPlan) -> np.ndarray:
    """Scale integer vector ``x`` down (toward zero, exactly) to the plan's norm <= c."""
    mags = [abs(int(v)) for v in x.ravel().tolist()]
    norm = plan.norm(mags)
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
        x = _clip_norm_int(x, plan.clip_int, plan)
    noisy = x + plan.noise(x.size, rng).reshape(x.shape)
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


def _prepare(plan: GridPlan, values: object, lower: float | None, upper: float | None) -> np.ndarray:
    """Clamp ``values`` and check they fit the plan (dimension, grid) before anything is spent."""
    clipped = _clip(_as_values(values), lower, upper)
    if clipped.size != plan.dimension:
        raise PrivacyError(f"the release was planned for {plan.dimension} values, got {clipped.size}")
    to_grid(clipped, plan.k)
    return clipped


def _draw(plan: GridPlan | CountsPlan, values: np.ndarray, rng: random.Random | None) -> np.ndarray:
    """The noise step (a seam for tests: they check it runs after the reservation)."""
    return plan.apply(values, rng)


class PendingRelease:
    """A release whose spend is reserved (its key claimed exclusively) and whose values may now be
    computed: :meth:`publish` draws the noise and commits; :meth:`abort` gives the spend back
    when nothing computed under it left the process."""

    def __init__(self, plan: GridPlan | CountsPlan, ledger: PrivacyLedger, reservation: Reservation) -> None:
        self.plan, self.ledger, self.reservation = plan, ledger, reservation

    def publish(
        self,
        values: object,
        *,
        lower: float | None = None,
        upper: float | None = None,
        rng: random.Random | None = None,
    ) -> np.ndarray:
        """Noise ``values`` (clamped into ``[lower, upper]``) as planned and commit the spend.

        Raises:
            PrivacyError: the values do not match the planned dimension or grid (the spend is
                aborted: nothing was released).
            LedgerError: the ledger cannot be written (the value is discarded).
        """
        try:
            clipped = self.plan.prepare(values, lower, upper)
        except PrivacyError:
            self.abort()
            raise
        noisy = _draw(self.plan, clipped, rng)
        self.ledger.commit(self.reservation)
        logger.debug("released %d values (%s, key %s)", clipped.size, type(self.plan).__name__, self.reservation.key)
        return noisy

    def abort(self) -> None:
        """Give the reserved spend back (call only when nothing computed under it was released).

        Raises:
            LedgerError: the row is already committed or the ledger cannot be written.
        """
        self.ledger.abort(self.reservation)


def reserve_release(
    mechanism: Mechanism | CountsMechanism,
    dimension: int,
    ledger: PrivacyLedger,
    *,
    key: str | None = None,
    round: int | None = None,
) -> PendingRelease:
    """Plan ``mechanism`` for ``dimension`` values and claim its spend before anything is computed.

    Raises:
        PrivacyError: bad mechanism parameters.
        ReplayError: ``key`` was already claimed; nothing may be computed or released again.
        BudgetExhaustedError: the site's budget would be exceeded; nothing reserved.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise PrivacyError(f"a release needs at least one value, got dimension {dimension!r}")
    plan = mechanism.plan(dimension, ledger.delta)
    return PendingRelease(plan, ledger, ledger.reserve(plan.event(), key=key, round=round))


def release(
    values: object,
    mechanism: Mechanism,
    ledger: PrivacyLedger,
    *,
    lower: float | None = None,
    upper: float | None = None,
    key: str | None = None,
    round: int | None = None,
    rng: random.Random | None = None,
) -> np.ndarray:
    """Release ``values`` (already computed) under DP with exact discrete noise on a 2^-k grid.

    The values are checked first, then the mechanism's accounting event is reserved under
    ``key`` (claimed exclusively: a key already used is refused, so one request never releases
    twice), and only then is noise drawn. Code that computes values from private data should
    call :func:`reserve_release` *before* computing them. ``rng`` is for tests only.

    Returns:
        The noisy values, float64 multiples of 2^-k, with the shape of ``values``.

    Raises:
        PrivacyError: invalid values, bounds or mechanism parameters.
        ReplayError: ``key`` was already claimed; nothing is released again.
        BudgetExhaustedError: the site's budget would be exceeded; nothing released.
        LedgerError: the ledger is unreadable or cannot be written.
    """
    arr = _as_values(values)
    plan = mechanism.plan(arr.size, ledger.delta)
    plan.prepare(arr, lower, upper)  # refuse bad values and bounds before spending
    pending = PendingRelease(plan, ledger, ledger.reserve(plan.event(), key=key, round=round))
    return pending.publish(arr, lower=lower, upper=upper, rng=rng)
