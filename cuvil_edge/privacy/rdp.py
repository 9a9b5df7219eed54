"""Rényi-DP curves and their conversion to (ε, δ): the cross-check of the ledger's accountant.

Pure ``math`` and numpy (no opacus, no torch), so a ledger is read without either; the formulas
and their sources are in :mod:`cuvil_edge.privacy.accounting`'s docstring, and tests compare them
with Opacus' ``RDPAccountant``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy._checks import positive_finite


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b)."""
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def _log_sub(a: float, b: float) -> float:
    """log(e^a − e^b) for a ≥ b; −inf when they are equal."""
    if b == -math.inf:
        return a
    if a <= b:
        return -math.inf
    return a + math.log(-math.expm1(b - a))


def _log_erfc(x: float) -> float:
    """log(erfc(x)), also where erfc leaves the normal float range (asymptotic series there)."""
    value = math.erfc(x)
    if value > 1e-300:  # below, the result is subnormal (few significant bits) or 0
        return math.log(value)
    r = 1.0 / (x * x)  # erfc(x) = e^{-x²}/(x√π) · (1 − r/2 + 3r²/4 − 15r³/8 + 105r⁴/16 − ...), r = 1/x²
    series = 1 - 0.5 * r + 0.75 * r**2 - 1.875 * r**3 + 6.5625 * r**4
    return -x * x - math.log(x) - 0.5 * math.log(math.pi) + math.log(series)


@lru_cache(maxsize=4096)
def sgm_rdp_once(q: float, sigma: float, alpha: float) -> float:
    """RDP at order α of one sampled Gaussian step: log(A_α)/(α−1) (Mironov, Talwar, Zhang 2019).

    A_α = E_{z∼μ0}[(μ(z)/μ0(z))^α] with μ0 = N(0, σ²), μ = (1−q)μ0 + qN(1, σ²). Integer α: the
    binomial expansion, Σ_k C(α,k) (1−q)^{α−k} q^k e^{(k²−k)/(2σ²)}. Fractional α: the two
    convergent series of §3.3, split at z0 = σ² log(1/q − 1) + 1/2, summed until a term is
    below e^{-30} of its series' scale.
    """
    if q == 0:
        return 0.0
    if q == 1.0:
        return alpha / (2 * sigma**2)
    if math.isinf(alpha):
        return math.inf
    if float(alpha).is_integer():
        n = int(alpha)
        log_a = -math.inf
        for k in range(n + 1):
            log_binom = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            term = log_binom + k * math.log(q) + (n - k) * math.log1p(-q) + (k * k - k) / (2 * sigma**2)
            log_a = _log_add(log_a, term)
        return log_a / (alpha - 1)
    log_pos0 = log_pos1 = log_neg0 = log_neg1 = -math.inf
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    i = 0
    while True:
        # generalised binomial coefficient C(α, i) = Γ(α+1) / (Γ(i+1) Γ(α−i+1)), with its sign
        log_coef = math.lgamma(alpha + 1) - math.lgamma(i + 1) - math.lgamma(alpha - i + 1)
        positive = i <= alpha or int(math.floor(i - alpha)) % 2 == 0
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log1p(-q)
        log_t1 = log_coef + j * math.log(q) + i * math.log1p(-q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * sigma**2) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * sigma**2) + log_e1
        if positive:
            log_pos0, log_pos1 = _log_add(log_pos0, log_s0), _log_add(log_pos1, log_s1)
        else:
            log_neg0, log_neg1 = _log_add(log_neg0, log_s0), _log_add(log_neg1, log_s1)
        if max(log_s0, log_s1) < -30 or i > 10_000:
            break
        i += 1
    log_a = _log_add(_log_sub(log_pos0, log_neg0), _log_sub(log_pos1, log_neg1))
    return log_a / (alpha - 1)


def laplace_rdp(epsilon: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of the ε-DP Laplace mechanism at each order α > 1 (Mironov 2017, Prop. 6)."""
    a = np.asarray(orders, dtype=np.float64)
    if np.any(a <= 1):
        raise PrivacyError("RDP orders must be > 1")
    eps = float(epsilon)
    log_terms = np.logaddexp(np.log(a / (2 * a - 1)) + (a - 1) * eps, np.log((a - 1) / (2 * a - 1)) - a * eps)
    return np.minimum(log_terms / (a - 1), eps)  # never above ε (guards float rounding)


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float] | np.ndarray, delta: float) -> tuple[float, float]:
    """(ε, best α) at ``delta``: the conversion of Opacus' ``get_privacy_spent``.

    Raises:
        PrivacyError: bad delta or mismatched lengths.
    """
    delta = positive_finite("delta", delta)
    if delta >= 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    if a.shape != r.shape:
        raise PrivacyError(f"{a.size} orders but {r.size} RDP values")
    eps = r - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    if np.isnan(eps).all():
        return math.inf, math.nan
    i = int(np.nanargmin(eps))
    return float(max(eps[i], 0.0)), float(a[i])
