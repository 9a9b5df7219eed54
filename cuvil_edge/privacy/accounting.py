"""Privacy accounting: compose a site's releases by a pessimistic PLD accountant, RDP as a cross-check.

The charged total at δ (what a ledger records and refuses on) is the smaller of two valid bounds:

* **PLD**: every event's privacy-loss distribution (``dp_accounting.pld``, add/remove neighbours,
  ``pessimistic_estimate=True`` on a grid of :data:`PLD_VALUE_INTERVAL`, so it never under-counts)
  composed, ε read at δ, rounded *up* to :data:`CHARGE_GRID`; see :func:`event_pld`;
* **basic**: the pure events' ε summed exactly plus the PLD ε of the approximate events (DP-SGD
  and Gaussian) at the whole δ.

RDP (below) is kept as the cross-check: :meth:`Accountant.breakdown` reports PLD, RDP and basic,
and the tests check RDP ≥ PLD. Noise multipliers are still *calibrated* by Opacus' RDP search
(:mod:`.dpsgd`), so a round planned at ``epsilon_per_round`` costs that ε under RDP and less under
the PLD.

Four kinds of event (all record-level, add/remove neighbours), each with its RDP curve:

``DpSgd(noise_multiplier, sample_rate, steps)``
    Poisson-subsampled Gaussian, RDP by :func:`subsampled_gaussian_rdp` (Mironov, Talwar,
    Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", §3.3: the
    curve Opacus' ``RDPAccountant`` uses; tests compare the two). Computed here with
    ``math`` only, so reading a ledger never imports opacus or torch.
``Laplace(epsilon)``
    A pure ε-DP Laplace release (scale = sensitivity/ε). RDP from Mironov
    2017, Prop. 6, with 1/b = ε::

        ε(α) = 1/(α−1) · log( α/(2α−1) · e^{(α−1)ε} + (α−1)/(2α−1) · e^{−αε} )

``Gaussian(noise_std, sensitivity)``
    A Gaussian release with L2 sensitivity Δ and noise std σ:
    ε(α) = α·Δ²/(2σ²) (also the CKS20 bound for the discrete Gaussian).

RDP values (the cross-check) are summed per order over Opacus' default orders
(:data:`DEFAULT_ORDERS`) and converted to ε at δ by the conversion in
Opacus' ``get_privacy_spent`` (Balle et al. 2020, Thm. 21)::

    ε = min_α  rdp(α) − (log δ + log α)/(α−1) + log((α−1)/α)

Basic composition of (Σε_L, 0) and (ε_G, δ) is (Σε_L + ε_G, δ): the pure events (Laplace,
PureDp) spend no δ. With only pure events and few of them it is the plain sum Σε.

``PureDp(epsilon)``
    Any ε-DP release, by the randomized-response curve (valid for all).

Caveat: Prop. 6 is the curve of the *continuous* Laplace mechanism. A
discrete Laplace with a small integer sensitivity has a larger RDP (at
integer sensitivity 1 its privacy loss is randomized response's): account
such releases (noisy integer counts) as ``PureDp``. On a fine grid (integer
sensitivity ≥ 2^10 grid steps, as ``release`` uses) the discrete curve is
within a negligible margin of the continuous one.

This module imports neither opacus nor torch (dp_accounting, and with it scipy, is imported
when a PLD is first needed: about 1.2 s once per process).

Without dp_accounting (the device install, which has no scipy: pyproject's extras) there is no
PLD bound: :func:`pld_epsilon` is infinite, the approximate events' part of the basic bound is
their RDP ε instead, and the charged total is that basic bound. It is never below the PLD-charged
total a full install computes for the same events (pure events cost their exact sum either way),
so a device without it may refuse a release a full install would allow, never the other way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from cuvil_edge.errors import PrivacyError
from cuvil_edge.extras import missing
from cuvil_edge.privacy._checks import int_at_least, positive_finite
from cuvil_edge.privacy.rdp import laplace_rdp, rdp_to_epsilon, sgm_rdp_once

#: Opacus ``RDPAccountant.DEFAULT_ALPHAS`` (tested equal), kept here so that
#: Laplace/Gaussian accounting does not import opacus and torch.
DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))

STATE_SCHEMA = "cuvil-edge/privacy-accountant"
STATE_VERSION = 1


@dataclass(frozen=True)
class DpSgd:
    """A DP-SGD run: Poisson sample rate q, noise multiplier σ, ``steps`` steps."""

    mechanism: ClassVar[str] = "dpsgd"
    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", positive_finite("noise_multiplier", self.noise_multiplier))
        q = positive_finite("sample_rate", self.sample_rate)
        if q > 1:
            raise PrivacyError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        object.__setattr__(self, "sample_rate", q)
        int_at_least("steps", self.steps)

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """RDP at ``orders`` of ``steps`` compositions of the sampled Gaussian mechanism."""
        return self.steps * np.array(
            [sgm_rdp_once(self.sample_rate, self.noise_multiplier, float(a)) for a in orders], dtype=np.float64
        )


@dataclass(frozen=True)
class Laplace:
    """A pure ε-DP Laplace release (continuous, or discrete on a fine grid: integer sensitivity
    of at least 2^10 steps)."""

    mechanism: ClassVar[str] = "laplace"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_finite("epsilon", self.epsilon))

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """Mironov 2017, Prop. 6 with 1/b = ε, computed in log space."""
        return laplace_rdp(self.epsilon, orders)


@dataclass(frozen=True)
class PureDp:
    """Any ε-DP release, e.g. a discrete Laplace at a small integer sensitivity (counts).

    RDP of binary randomized response, which dominates every ε-DP pair of
    distributions (Kairouz, Oh, Viswanath 2015), so it bounds them all::

        ε(α) = 1/(α−1) · log( (e^{αε} + e^{(1−α)ε}) / (1 + e^ε) )

    Use it when the Laplace curve may not apply: a discrete Laplace with
    integer sensitivity 1 *is* randomized response in its privacy loss.
    """

    mechanism: ClassVar[str] = "pure"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive_finite("epsilon", self.epsilon))

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        a = np.asarray(orders, dtype=np.float64)
        e = self.epsilon
        curve = (np.logaddexp(a * e, (1 - a) * e) - np.logaddexp(0.0, e)) / (a - 1)
        return np.minimum(curve, e)


@dataclass(frozen=True)
class Gaussian:
    """A Gaussian release with noise std ``noise_std`` and L2 ``sensitivity``."""

    mechanism: ClassVar[str] = "gaussian"
    noise_std: float
    sensitivity: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_std", positive_finite("noise_std", self.noise_std))
        object.__setattr__(self, "sensitivity", positive_finite("sensitivity", self.sensitivity))

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """α·Δ²/(2σ²)."""
        return np.asarray(orders, dtype=np.float64) * self.sensitivity**2 / (2.0 * self.noise_std**2)


Event = DpSgd | Laplace | PureDp | Gaussian
_PURE = (Laplace, PureDp)  # (ε, 0)-DP events: basic composition sums their ε
_KINDS: dict[str, type] = {cls.mechanism: cls for cls in (DpSgd, Laplace, PureDp, Gaussian)}
_NAMES = {cls: name for name, cls in _KINDS.items()}


def is_event(obj: object) -> bool:
    """Whether ``obj`` is one of the accounting events."""
    return type(obj) in _NAMES


def is_pure(event: Event) -> bool:
    """Whether ``event`` is (ε, 0)-DP (it spends no δ)."""
    return isinstance(event, _PURE)


def event_parameters(event: Event) -> dict[str, Any]:
    """The event's fields by name (what a ledger row stores besides its mechanism)."""
    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}


def event_from(mechanism: str, parameters: dict[str, Any]) -> Event:
    """Rebuild an event from its mechanism name and :func:`event_parameters`.

    Raises:
        PrivacyError: an unknown mechanism (never guessed) or invalid parameters.
    """
    kind = _KINDS.get(mechanism)
    if kind is None:
        raise PrivacyError(f"unknown privacy mechanism {mechanism!r}; known: {sorted(_KINDS)}")
    try:
        return kind(**parameters)
    except TypeError as e:
        raise PrivacyError(f"bad {mechanism} event parameters {parameters!r}: {e}") from e


def subsampled_gaussian_rdp(
    sample_rate: float, noise_multiplier: float, steps: int, orders: Sequence[float]
) -> np.ndarray:
    """RDP at each order α > 1 of ``steps`` compositions of the Poisson-subsampled Gaussian
    mechanism (sampling rate q, noise σ in units of the sensitivity)."""
    return DpSgd(noise_multiplier, sample_rate, steps).rdp(orders)


#: Privacy-loss grid of the PLD accountant: every loss value is rounded *up* to a multiple of
#: this (``pessimistic_estimate=True``), so the PLD's ε is an upper bound of the true one. A
#: finer grid is tighter but slower: on the demo's 20 rounds + 20 evaluations, 1e-3 gives ε
#: within 2e-4 of 3e-5's, in about a tenth of the time of 1e-4's.
PLD_VALUE_INTERVAL = 1e-3

_PLD_PREFIX_CACHE_SIZE = 16
_pld_prefixes: OrderedDict[tuple, Any] = OrderedDict()
_pld_lock = threading.Lock()


@lru_cache(maxsize=256)
def event_pld(event: Event, interval: float = PLD_VALUE_INTERVAL) -> Any:
    """The privacy-loss distribution (``dp_accounting.pld``) of one event, add/remove neighbours,
    pessimistic (never under-counting) on the grid ``interval``:

    * ``DpSgd``: the Poisson-subsampled Gaussian (σ, q), self-composed ``steps`` times;
    * ``Gaussian``: the Gaussian mechanism, std ``noise_std``, sensitivity ``sensitivity``;
    * ``Laplace``: the Laplace mechanism of parameter 1/ε at sensitivity 1 (the same fine-grid
      assumption as its RDP curve, see the module docstring);
    * ``PureDp``: the worst case of every ε-DP mechanism (randomized response's pair: loss ±ε,
      ``from_privacy_parameters(ε, 0)``), so it holds for a discrete Laplace at any sensitivity.
    """
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    if isinstance(event, DpSgd):
        one = pld.from_gaussian_mechanism(
            event.noise_multiplier,
            sensitivity=1,
            pessimistic_estimate=True,
            value_discretization_interval=interval,
            sampling_prob=event.sample_rate,
        )
        return one.self_compose(event.steps) if event.steps > 1 else one
    if isinstance(event, Gaussian):
        return pld.from_gaussian_mechanism(
            event.noise_std,
            sensitivity=event.sensitivity,
            pessimistic_estimate=True,
            value_discretization_interval=interval,
        )
    if isinstance(event, Laplace):
        return pld.from_laplace_mechanism(
            1.0 / event.epsilon, sensitivity=1, pessimistic_estimate=True, value_discretization_interval=interval
        )
    if isinstance(event, PureDp):
        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(event.epsilon, 0.0), value_discretization_interval=interval
        )
    raise PrivacyError(f"not a privacy event: {event!r}")


def composed_pld(events: Sequence[Event], interval: float = PLD_VALUE_INTERVAL) -> Any:
    """The PLD of ``events`` composed in their order (None when there are none).

    The composition of every recent prefix is remembered, so a ledger that grows by one event
    composes one more PLD, not all of them again; composing in order along one path also makes a
    prefix's value the same whether it was reached step by step or from scratch.
    """
    key = (interval, *events)
    with _pld_lock:
        start, acc = 0, None
        for n in range(len(events), max(0, len(events) - 64), -1):
            hit = _pld_prefixes.get(key[: n + 1])
            if hit is not None:
                _pld_prefixes.move_to_end(key[: n + 1])
                start, acc = n, hit
                break
    for i in range(start, len(events)):
        one = event_pld(events[i], interval)
        acc = one if acc is None else acc.compose(one)
    if events:
        with _pld_lock:
            _pld_prefixes[key] = acc
            _pld_prefixes.move_to_end(key)
            while len(_pld_prefixes) > _PLD_PREFIX_CACHE_SIZE:
                _pld_prefixes.popitem(last=False)
    return acc


@lru_cache(maxsize=1)
def pld_available() -> bool:
    """Whether the PLD accountant can run here: dp_accounting and scipy are installed (they come
    with ``cuvil-edge[train]`` and ``[coordinator]``; the device install has neither)."""
    return not missing(("dp_accounting", "scipy"))


def pld_epsilon(events: Sequence[Event], delta: float, interval: float = PLD_VALUE_INTERVAL) -> float:
    """ε at ``delta`` of ``events`` composed by the pessimistic PLD accountant; ``math.inf`` where
    it cannot run (:func:`pld_available`: no bound, so the others decide, see the module docstring).

    Raises:
        PrivacyError: bad delta or not an event.
    """
    delta = positive_finite("delta", delta)
    if delta >= 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    events = tuple(events)
    for e in events:
        if type(e) not in _NAMES:
            raise PrivacyError(f"not a privacy event: {e!r}")
    if not events:
        return 0.0
    if not pld_available():
        return math.inf
    return max(0.0, float(composed_pld(events, interval).get_epsilon_for_delta(delta)))


def _approximate_epsilon(events: Sequence[Event], delta: float, orders: Sequence[float]) -> Fraction:
    """ε of the approximate events at the whole ``delta`` for the basic bound: their PLD ε, or
    their RDP ε where the PLD gives no finite bound (both are valid for them composed)."""
    eps = pld_epsilon(events, delta)
    if not math.isfinite(eps):
        # callers pass events only when there are some, so the sum is an array
        eps = rdp_to_epsilon(orders, sum(e.rdp(orders) for e in events), delta)[0]  # type: ignore[arg-type]
    return Fraction(eps)


#: The charged PLD total is rounded up to a multiple of this (never down), so that a few pure
#: releases cost exactly their sum (their PLD ε at δ > 0 is below it by ~1e-5 of ε).
CHARGE_GRID = Fraction(1, 10_000)


def _charged(pld: float, basic: Fraction) -> Fraction:
    """min(PLD rounded up to :data:`CHARGE_GRID`, basic)."""
    if not math.isfinite(pld):
        return basic
    steps = math.ceil(Fraction(pld) / CHARGE_GRID)
    return min(basic, steps * CHARGE_GRID)


class Accountant:
    """An append-only list of events, composed on demand (see the module docstring)."""

    def __init__(self, events: Iterable[Event] = (), orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        self.orders = tuple(float(o) for o in orders)
        self.events: list[Event] = []
        for e in events:
            self.add(e)

    def add(self, event: Event) -> None:
        """Append one event.

        Raises:
            PrivacyError: not an event.
        """
        if type(event) not in _NAMES:
            raise PrivacyError(f"not a privacy event: {event!r}")
        self.events.append(event)

    def rdp(self, events: Iterable[Event] | None = None) -> np.ndarray:
        """Per-order RDP of ``events`` (default: all), summed."""
        total = np.zeros(len(self.orders))
        for e in self.events if events is None else events:
            total = total + e.rdp(self.orders)
        return total

    def rdp_epsilon(self, delta: float) -> float:
        """ε at ``delta`` with every event composed under RDP."""
        if not self.events:
            return 0.0
        return rdp_to_epsilon(self.orders, self.rdp(), delta)[0]

    def pld_epsilon(self, delta: float) -> float:
        """ε at ``delta`` with every event composed by the pessimistic PLD accountant."""
        return pld_epsilon(self.events, delta)

    def breakdown(self, delta: float) -> dict[str, float]:
        """Every bound at ``delta``: ``pld``, ``rdp``, ``basic`` and the ``charged`` total."""
        return {
            "pld": self.pld_epsilon(delta),
            "rdp": self.rdp_epsilon(delta),
            "basic": float(self.basic_epsilon(delta)),
            "charged": self.epsilon(delta),
        }

    def basic_epsilon(self, delta: float) -> Fraction:
        """Exact sum of the pure events' ε plus the PLD ε of the approximate events at ``delta``."""
        pure = sum((Fraction(e.epsilon) for e in self.events if isinstance(e, _PURE)), Fraction(0))
        approx = [e for e in self.events if not isinstance(e, _PURE)]
        if approx:
            pure += _approximate_epsilon(approx, delta, self.orders)
        return pure

    def epsilon_exact(self, delta: float) -> Fraction:
        """min(PLD, basic) at ``delta`` as a Fraction (exact when the plain sum of pure ε wins)."""
        if not self.events:
            return Fraction(0)
        return _charged(self.pld_epsilon(delta), self.basic_epsilon(delta))

    def epsilon(self, delta: float) -> float:
        """Total ε spent at ``delta``, the value a ledger charges: min(PLD, basic composition).

        Raises:
            PrivacyError: bad delta.
        """
        return float(self.epsilon_exact(delta))

    # ---- JSON state --------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON state (orders and events), for :meth:`from_dict`."""
        return {
            "schema": STATE_SCHEMA,
            "version": STATE_VERSION,
            "orders": list(self.orders),
            "events": [{"mechanism": e.mechanism, **event_parameters(e)} for e in self.events],
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Accountant:
        """Rebuild an accountant from :meth:`to_dict` output; unknown fields are refused.

        Raises:
            PrivacyError: the state is malformed.
        """
        if not isinstance(state, dict) or set(state) != {"schema", "version", "orders", "events"}:
            raise PrivacyError(f"accountant state must have keys schema, version, orders, events; got {state!r:.200}")
        if state["schema"] != STATE_SCHEMA or state["version"] != STATE_VERSION:
            raise PrivacyError(f"unknown accountant state {state['schema']!r} v{state['version']!r}")
        orders = state["orders"]
        if (
            not isinstance(orders, list)
            or not orders
            or not all(isinstance(o, (int, float)) and not isinstance(o, bool) and o > 1 for o in orders)
        ):
            raise PrivacyError("accountant state: orders must be a non-empty list of numbers > 1")
        events: list[Event] = []
        for raw in state["events"] if isinstance(state["events"], list) else [None]:
            if not isinstance(raw, dict):
                raise PrivacyError(f"accountant state: bad event {raw!r}")
            mechanism = raw.get("mechanism")  # event_from refuses a missing or unknown one
            events.append(event_from(mechanism, {k: v for k, v in raw.items() if k != "mechanism"}))  # type: ignore[arg-type]
        return cls(events, orders)

    def to_json(self) -> str:
        """:meth:`to_dict` as canonical JSON."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Accountant:
        """Parse :meth:`to_json` output.

        Raises:
            PrivacyError: not valid JSON or a malformed state.
        """
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise PrivacyError(f"accountant state is not JSON: {e}") from e


def cumulative_epsilons(events: Sequence[Event], delta: float, orders: Sequence[float] = DEFAULT_ORDERS) -> list[float]:
    """Total ε (min of PLD and basic, as :meth:`Accountant.epsilon`) after each prefix of ``events``.

    Each prefix's PLD is the previous one composed with one event (:func:`composed_pld` caches
    them), so this composes each event once.
    """
    acc = Accountant(orders=orders)
    approx: list[Event] = []
    pure = Fraction(0)
    out: list[float] = []
    for e in events:
        acc.add(e)
        if isinstance(e, _PURE):
            pure += Fraction(e.epsilon)
        else:
            approx.append(e)
        basic = pure + (_approximate_epsilon(approx, delta, orders) if approx else 0)
        out.append(float(_charged(pld_epsilon(acc.events, delta), basic)))
    return out
