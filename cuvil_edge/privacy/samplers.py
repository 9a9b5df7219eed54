"""Exact discrete Laplace and discrete Gaussian samplers (Canonne-Kamath-Steinke 2020).

Every probability below is decided with integer or rational arithmetic; no
floating-point number ever touches a random decision, so the distribution is
exactly the stated one (given uniform random bits).

Method (CKS20, arXiv 2004.00010, Algorithms 1-3), vectorised over numpy arrays:

* Random bits come from ``secrets.SystemRandom`` (the OS CSPRNG, read in bulk
  with ``os.urandom``) unless a ``random.Random`` is injected for tests.
* ``uniform_below(m)``: uniform integers in ``[0, m)`` by masking 64-bit words
  to ``bit_length(m - 1)`` bits and rejecting values ``>= m`` (exact).
* ``Bern(a/b)``: ``U < a`` for ``U`` uniform in ``[0, b)`` when ``b <= 2**63``;
  for larger ``b`` the binary expansion of ``a/b`` is compared lazily with
  random 64-bit words using Python integers (a tie, probability 2**-64 per
  word, continues with the next word), which is again exact.
* ``Bern(a/(b*K))`` = ``[J == 0] and Bern(a/b)`` with ``J`` uniform in
  ``[0, K)``: uniform on ``[0, bK)`` decomposes as ``J*b + U`` (needs a <= b).
* ``BernExp(g)`` for ``g`` in [0, 1]: ``K = 1; while Bern(g/K): K += 1``;
  success iff ``K`` is odd (CKS Alg. 1). ``g > 1``: ``floor(g)`` independent
  ``BernExp(1)`` successes and then ``BernExp(g - floor(g))``.
* ``Geometric(1 - exp(-s/t))``: ``U`` uniform in ``[0, t)`` accepted with
  ``BernExp(U/t)``; ``V`` = number of ``BernExp(1)`` successes before the first
  failure; return ``floor((U + t*V) / s)`` (CKS Alg. 2).
* Discrete Laplace(scale ``t/s``): sign bit ``B`` and magnitude ``G`` as
  above; reject ``(B=1, G=0)``; return ``(1 - 2B) * G``.
* Discrete Gaussian(sigma^2 = p/q): ``T = floor(sigma) + 1``; draw
  ``Y ~ DLap(T)`` and accept with ``BernExp((|Y| - sigma^2/T)^2 / (2 sigma^2))``
  (CKS Alg. 3), the exponent kept as a fraction of Python integers.

Each loop runs over the still-undecided elements only, so the work per sample
is a handful of numpy operations in total. Timing varies with the random
values (CKS samplers are not constant-time); release at fixed latency or
pre-draw noise where timing is observable.
"""

from __future__ import annotations

import math
import os
import random
import secrets
from fractions import Fraction

import numpy as np

from cuvil_edge.errors import PrivacyError

__all__ = [
    "bernoulli_exp",
    "default_rng",
    "discrete_gaussian",
    "discrete_gaussian_pmf",
    "discrete_laplace",
    "discrete_laplace_pmf",
    "geometric_exp",
    "uniform_below",
]

_TWO64 = 1 << 64
_MAX_NUMPY_MODULUS = 1 << 63  # uniform_below works on int64; larger b uses Python ints


def default_rng() -> random.Random:
    """The default source of randomness: the OS CSPRNG (``secrets.SystemRandom``)."""
    return secrets.SystemRandom()


def _words(n: int, rng: random.Random) -> np.ndarray:
    """``n`` uniform 64-bit words (uint64) from ``rng``."""
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if isinstance(rng, random.SystemRandom):
        raw = os.urandom(8 * n)  # exactly what SystemRandom.getrandbits reads
    else:
        raw = rng.getrandbits(64 * n).to_bytes(8 * n, "little")
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def uniform_below(m: int, n: int, rng: random.Random) -> np.ndarray:
    """``n`` independent integers uniform on ``[0, m)`` (int64), ``1 <= m <= 2**63``."""
    if not 1 <= m <= _MAX_NUMPY_MODULUS:
        raise PrivacyError(f"uniform_below: modulus {m} outside [1, 2**63]")
    out = np.zeros(n, dtype=np.int64)
    if m == 1 or n == 0:
        return out
    bits = (m - 1).bit_length()
    accept = m / (1 << bits)  # >= 1/2; only sizes the batch, never decides a value
    filled = 0
    while filled < n:
        need = n - filled
        w = _words(int(need / accept * 1.05) + 8, rng) >> np.uint64(64 - bits)
        w = w[w < np.uint64(m)]
        take = min(w.size, need)
        out[filled : filled + take] = w[:take].astype(np.int64)
        filled += take
    return out


def _bern_ratio(a: np.ndarray, b: int, rng: random.Random) -> np.ndarray:
    """Bernoulli(a_i / b) for integers ``0 <= a_i <= b`` (int64 or object array)."""
    n = a.shape[0]
    if b <= _MAX_NUMPY_MODULUS and a.dtype != object:
        return uniform_below(b, n, rng) < a
    x = np.asarray(a, dtype=object)
    res = np.asarray(x == b, dtype=bool)  # probability 1
    idx = np.flatnonzero(~res)
    x = x[idx]
    while idx.size:
        scaled = x * _TWO64
        c = scaled // b  # next 64 bits of the binary expansion of x/b (< 2**64)
        x = scaled - c * b
        cu = np.array(c.tolist(), dtype=np.uint64)
        w = _words(idx.size, rng)
        res[idx[w < cu]] = True
        tie = w == cu
        idx, x = idx[tie], x[tie]
    return res


def _bern_exp_unit(num: np.ndarray, den: int, rng: random.Random) -> np.ndarray:
    """Bernoulli(exp(-num_i/den)) for ``0 <= num_i <= den`` (CKS Algorithm 1)."""
    out = np.zeros(num.shape[0], dtype=bool)
    idx = np.arange(num.shape[0])
    k = 1
    while idx.size:
        ok = _bern_ratio(num[idx], den, rng)
        if k > 1:
            ok &= uniform_below(k, idx.size, rng) == 0
        out[idx[~ok]] = k % 2 == 1
        idx = idx[ok]
        k += 1
    return out


def _bern_exp_one(n: int, rng: random.Random) -> np.ndarray:
    return _bern_exp_unit(np.ones(n, dtype=np.int64), 1, rng)


def bernoulli_exp(num: np.ndarray, den: int, rng: random.Random | None = None) -> np.ndarray:
    """Bernoulli(exp(-num_i/den)) for integers ``num_i >= 0``, ``den >= 1``, exactly.

    Raises:
        PrivacyError: negative numerators or a non-positive denominator.
    """
    rng = rng or default_rng()
    num = np.asarray(num)
    if den < 1 or (num.size and min(num.tolist()) < 0):
        raise PrivacyError("bernoulli_exp needs num >= 0 and den >= 1")
    if den >= 1 << 62 and num.dtype != object:
        num = num.astype(object)  # keep every product and quotient in Python ints
    whole = np.array((num // den).tolist(), dtype=np.int64)
    frac = num - whole.astype(num.dtype) * den
    res = np.ones(num.shape[0], dtype=bool)
    idx, r = np.flatnonzero(whole > 0), 0
    while idx.size:  # floor(g) independent BernExp(1) successes
        ok = _bern_exp_one(idx.size, rng)
        res[idx[~ok]] = False
        idx, r = idx[ok], r + 1
        idx = idx[whole[idx] > r]
    idx = np.flatnonzero(res)
    res[idx] = _bern_exp_unit(frac[idx], den, rng)
    return res


def geometric_exp(s: int, t: int, n: int, rng: random.Random | None = None) -> np.ndarray:
    """``n`` draws with P(G = k) = (1 - e^(-s/t)) e^(-ks/t), k >= 0 (CKS Algorithm 2)."""
    rng = rng or default_rng()
    if s < 1 or not 1 <= t <= _MAX_NUMPY_MODULUS:
        raise PrivacyError(f"geometric_exp needs s >= 1 and 1 <= t <= 2**63, got {s}, {t}")
    u = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    while idx.size:  # U uniform on [0, t), accepted with probability exp(-U/t)
        cand = uniform_below(t, idx.size, rng)
        ok = _bern_exp_unit(cand, t, rng)
        u[idx[ok]] = cand[ok]
        idx = idx[~ok]
    v = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    while idx.size:  # V ~ Geometric(1 - e^-1)
        ok = _bern_exp_one(idx.size, rng)
        idx = idx[ok]
        v[idx] += 1
    if n and t * (int(v.max()) + 1) < (1 << 62):
        return (u + t * v) // s
    total = u.astype(object) + v.astype(object) * t
    return np.array((total // s).tolist(), dtype=np.int64)


def _as_fraction(name: str, x: object) -> Fraction:
    if isinstance(x, bool):
        raise PrivacyError(f"{name} must be a positive number, got {x!r}")
    try:
        f = Fraction(x)  # type: ignore[call-overload]  # exact for int, float, Fraction; others raise below
    except (TypeError, ValueError, OverflowError) as e:
        raise PrivacyError(f"{name} must be a finite positive number, got {x!r}") from e
    if f <= 0:
        raise PrivacyError(f"{name} must be > 0, got {x!r}")
    return f


def discrete_laplace(scale: object, n: int, rng: random.Random | None = None) -> np.ndarray:
    """``n`` draws (int64) with P(y) proportional to exp(-|y|/scale), y in Z.

    ``scale`` is an int, a Fraction or a float (taken as its exact rational
    value); its numerator must be at most 2**63.

    Raises:
        PrivacyError: ``scale`` is not a positive number or is too fine-grained.
    """
    rng = rng or default_rng()
    sc = _as_fraction("scale", scale)
    t, s = sc.numerator, sc.denominator
    out = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    while idx.size:
        sign = uniform_below(2, idx.size, rng)
        mag = geometric_exp(s, t, idx.size, rng)
        ok = ~((sign == 1) & (mag == 0))
        out[idx[ok]] = np.where(sign[ok] == 1, -mag[ok], mag[ok])
        idx = idx[~ok]
    return out


def discrete_gaussian(sigma2: object, n: int, rng: random.Random | None = None) -> np.ndarray:
    """``n`` draws (int64) with P(y) proportional to exp(-y^2 / (2 sigma2)), y in Z.

    ``sigma2`` (the variance parameter) is an int, Fraction or float, exactly.

    Raises:
        PrivacyError: ``sigma2`` is not a positive number.
    """
    rng = rng or default_rng()
    s2 = _as_fraction("sigma2", sigma2)
    p, q = s2.numerator, s2.denominator
    t = math.isqrt(p // q) + 1  # floor(sigma) + 1
    den = 2 * p * q * t * t
    out = np.zeros(n, dtype=np.int64)
    idx = np.arange(n)
    while idx.size:
        y = discrete_laplace(t, idx.size, rng)
        # (|y| - sigma2/t)^2 / (2 sigma2) = (|y| q t - p)^2 / (2 p q t^2)
        diff = np.abs(y).astype(object) * (q * t) - p
        ok = bernoulli_exp(diff * diff, den, rng)
        out[idx[ok]] = y[ok]
        idx = idx[~ok]
    return out


def discrete_laplace_pmf(k: np.ndarray, scale: float) -> np.ndarray:
    """P(Y = k) for the discrete Laplace of ``scale`` (float; for tests and audits)."""
    p = math.exp(-1.0 / scale)
    return (1 - p) / (1 + p) * np.power(p, np.abs(np.asarray(k, dtype=np.float64)))


def discrete_gaussian_pmf(k: np.ndarray, sigma2: float) -> np.ndarray:
    """P(Y = k) for the discrete Gaussian (float; normaliser summed numerically)."""
    reach = int(40 * math.sqrt(sigma2)) + 40
    support = np.arange(-reach, reach + 1, dtype=np.float64)
    norm = np.exp(-(support**2) / (2 * sigma2)).sum()
    kk = np.asarray(k, dtype=np.float64)
    return np.exp(-(kk**2) / (2 * sigma2)) / norm
