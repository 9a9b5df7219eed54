"""Argument checks shared by the privacy modules (raise PrivacyError, never assert)."""

from __future__ import annotations

import math

from cuvil_edge.errors import PrivacyError


def positive_finite(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a float that is finite and > 0 (>= 0 with ``allow_zero``).

    Raises:
        PrivacyError: it is not such a number (bools are refused).
    """
    if isinstance(value, bool):
        raise PrivacyError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise PrivacyError(f"{name} must be a number, got {value!r}") from e
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise PrivacyError(f"{name} must be finite and {bound}, got {value!r}")
    return v


def int_at_least(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``.

    Raises:
        PrivacyError: otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PrivacyError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
