"""accounting: the pessimistic PLD accountant, against dp_accounting, Opacus' PRV and RDP, and the
analytic Gaussian; the demo's 20 DP-SGD rounds + 20 evaluation releases."""

from __future__ import annotations

import math
import time

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import common, pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.special import ndtr

import cuvil_edge.privacy.accounting as accounting
from cuvil_edge.privacy.accounting import (
    PLD_VALUE_INTERVAL, Accountant, DpSgd, Gaussian, Laplace, PureDp, cumulative_epsilons, event_from,
    event_parameters, event_pld, pld_epsilon,
)

DELTA = 1e-5
# The demo (configs/sites/*.yaml): epsilon_per_round 1.97 at δ 1e-5, sample_rate 0.08, local_epochs 2
# → steps = ceil(2 / 0.08) = 25 and Opacus' RDP search gives σ = 1.3916015625 (checked below);
# eval_epsilon 0.05 (noisy counts, charged as PureDp).
DEMO_SIGMA, DEMO_Q, DEMO_STEPS, DEMO_EVAL = 1.3916015625, 0.08, 25, 0.05


def _demo(rounds: int = 20, evals: int = 20) -> list:
    events = []
    for i in range(max(rounds, evals)):
        if i < rounds:
            events.append(DpSgd(DEMO_SIGMA, DEMO_Q, DEMO_STEPS))
        if i < evals:
            events.append(PureDp(DEMO_EVAL))
    return events


def _reference_pld(rounds: int, evals: int, interval: float = 1e-4) -> float:
    """dp_accounting directly: its PLDAccountant for DP-SGD (default grid 1e-4), composed with the
    pessimistic ε-DP PLD of each evaluation release."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_event.PoissonSampledDpEvent(DEMO_Q, dp_event.GaussianDpEvent(DEMO_SIGMA)), DEMO_STEPS * rounds)
    if not evals:
        return acc.get_epsilon(DELTA)
    pure = pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(DEMO_EVAL, 0.0),
                                           value_discretization_interval=interval).self_compose(evals)
    return acc._pld.compose(pure).get_epsilon_for_delta(DELTA)


def test_demo_noise_multiplier_is_the_plans() -> None:
    from cuvil_edge.privacy.dpsgd import plan_dp_sgd

    plan = plan_dp_sgd(target_epsilon=1.97, delta=DELTA, sample_rate=DEMO_Q, epochs=2, expected_batch_size=32)

    assert (plan.noise_multiplier, plan.sample_rate, plan.steps) == (DEMO_SIGMA, DEMO_Q, DEMO_STEPS)


def test_demo_pld_matches_dp_accounting() -> None:
    mine = Accountant(_demo()).pld_epsilon(DELTA)

    assert mine == pytest.approx(_reference_pld(20, 20), rel=1e-3)
    assert mine == pytest.approx(7.334, abs=2e-3)


def test_demo_dpsgd_alone_is_at_least_opacus_prv_and_at_most_rdp() -> None:
    from opacus.accountants import PRVAccountant

    events = _demo(evals=0)
    mine = Accountant(events).pld_epsilon(DELTA)
    prv = PRVAccountant()
    prv.history = [(DEMO_SIGMA, DEMO_Q, DEMO_STEPS * 20)]
    eps_error, delta_error = 0.01, DELTA / 1000  # Opacus' get_epsilon defaults
    lower, estimate, upper = prv._get_dprv(eps_error=eps_error, delta_error=delta_error).compute_epsilon(
        DELTA, delta_error, eps_error)

    assert upper == pytest.approx(prv.get_epsilon(DELTA))
    assert mine >= lower  # PRV's own error bars: the true ε is in [lower, upper]
    assert mine >= estimate - 1e-4
    assert mine == pytest.approx(_reference_pld(20, 0), rel=1e-3)
    assert mine == pytest.approx(7.248, abs=1e-3)
    assert mine < Accountant(events).rdp_epsilon(DELTA) == pytest.approx(7.8972, abs=1e-3)


def test_demo_total_pld_is_below_rdp() -> None:
    acc = Accountant(_demo())
    bounds = acc.breakdown(DELTA)

    assert bounds["rdp"] == pytest.approx(7.9868, abs=1e-4)  # what the ledger charged under RDP
    assert bounds["pld"] < bounds["rdp"] and bounds["pld"] < bounds["basic"]
    assert bounds["rdp"] / bounds["pld"] > 1.08  # RDP is about 9 % looser here


def _analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε of the Gaussian mechanism (sensitivity 1, std σ) at δ: the exact curve of Balle & Wang
    2018, Thm. 8, δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ), inverted by bisection."""
    def delta_of(eps: float) -> float:
        return ndtr(0.5 / sigma - eps * sigma) - math.exp(eps) * ndtr(-0.5 / sigma - eps * sigma)

    lo, hi = 0.0, 1.0
    while delta_of(hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("sigma", [0.5, 0.8, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_pessimistic_pld_never_under_counts_a_gaussian(sigma: float, delta: float) -> None:
    exact = _analytic_gaussian_epsilon(sigma, delta)

    for event in (Gaussian(sigma, 1.0), Gaussian(2 * sigma, 2.0), DpSgd(sigma, 1.0, 1)):
        eps = pld_epsilon([event], delta)
        assert exact <= eps <= exact + 2 * PLD_VALUE_INTERVAL + 1e-3 * exact, event


def _exact_rr_epsilon(eps: float, k: int, delta: float) -> float:
    """ε at δ of k composed ε-DP randomized-response pairs, exactly: the loss is (k − 2j)ε with
    probability C(k, j) p^{k−j} (1−p)^j, p = e^ε/(1+e^ε), and δ(ε') = E[(1 − e^{ε'−L})₊]."""
    p = math.exp(eps) / (1 + math.exp(eps))

    def delta_of(target: float) -> float:
        return sum(math.comb(k, j) * p ** (k - j) * (1 - p) ** j * max(0.0, 1 - math.exp(target - (k - 2 * j) * eps))
                   for j in range(k + 1))

    lo, hi = 0.0, k * eps
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("eps, k", [(0.05, 20), (0.5, 10), (1.2, 3), (1.2, 100)])
def test_pure_events_never_under_count_randomized_response(eps: float, k: int) -> None:
    exact = _exact_rr_epsilon(eps, k, DELTA)
    mine = pld_epsilon([PureDp(eps)] * k, DELTA)

    # ε on the grid (0.05 and 1.2 are multiples of 1e-3) makes the PLD exact; 1e-9 is the oracle's float error
    assert exact - 1e-9 <= mine <= exact + k * PLD_VALUE_INTERVAL + 1e-9
    assert Accountant([PureDp(eps)] * k).rdp_epsilon(DELTA) >= mine - 1e-9  # RDP cross-check


def test_laplace_pld_is_dp_accountings() -> None:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.LaplaceDpEvent(1 / 0.5), 10)

    assert pld_epsilon([Laplace(0.5)] * 10, DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-3)


@pytest.mark.parametrize("events", [
    pytest.param([DpSgd(1.0, 0.01, 1000)] + [Laplace(0.5)] * 10, id="dpsgd+laplace"),
    pytest.param([DpSgd(1.5, 0.04, 2250)], id="opacus-golden"),
    pytest.param([Gaussian(4.0, 2.0)] * 5 + [PureDp(0.2)] * 4, id="gaussian+pure"),
    pytest.param([Laplace(1.2)] * 100, id="many-laplace"),
    pytest.param(_demo(), id="demo"),
])
def test_rdp_cross_check_is_never_below_pld(events: list) -> None:
    bounds = Accountant(events).breakdown(DELTA)

    assert bounds["rdp"] >= bounds["pld"] * (1 - 1e-3)


def test_pld_matches_google_dp_accounting() -> None:
    # Google's dp-accounting PLD: 6.7688 and 5.1483 (grid 1e-4); ours is pessimistic on a 1e-3 grid.
    assert pld_epsilon([DpSgd(1.5, 0.04, 2250)], DELTA) == pytest.approx(6.7688, abs=2e-3)
    assert pld_epsilon([DpSgd(1.0, 0.1, 50)], DELTA) == pytest.approx(5.1483, abs=2e-3)


def test_prefixes_equal_composing_from_scratch() -> None:
    events = _demo(5, 5) + [Laplace(0.3), Gaussian(4.0, 1.0)]
    step_by_step = [pld_epsilon(events[:n], DELTA) for n in range(1, len(events) + 1)]
    accounting._pld_prefixes.clear()

    assert [pld_epsilon(events[:n], DELTA) for n in (3, len(events))] == [step_by_step[2], step_by_step[-1]]
    assert all(a < b for a, b in zip(step_by_step, step_by_step[1:]))


def test_every_stored_mechanism_has_a_pld() -> None:
    """A ledger row keeps each event's parameters (dpsgd: σ, q, steps; gaussian: std, sensitivity;
    laplace and pure: ε), which is all the PLD needs: old ledgers are accounted as they are."""
    for event in (DpSgd(1.2, 0.05, 20), Gaussian(3.0, 1.0), Laplace(0.4), PureDp(0.4)):
        again = event_from(event.mechanism, event_parameters(event))
        assert again == event and pld_epsilon([again], DELTA) > 0
        assert event_pld(again) is event_pld(event)


def test_bad_delta_and_non_events_are_refused() -> None:
    from cuvil_edge.errors import PrivacyError

    for delta in (0.0, 1.0, -1e-5, math.nan):
        with pytest.raises(PrivacyError):
            pld_epsilon([PureDp(1.0)], delta)
    with pytest.raises(PrivacyError):
        pld_epsilon(["not an event"], DELTA)
    assert pld_epsilon([], DELTA) == 0.0


def test_demo_composition_is_fast() -> None:
    accounting._pld_prefixes.clear()
    accounting.event_pld.cache_clear()
    events = _demo()
    start = time.perf_counter()
    cold = pld_epsilon(events, DELTA)
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    one_more = pld_epsilon(events + [DpSgd(DEMO_SIGMA, DEMO_Q, DEMO_STEPS)], DELTA)
    warm_s = time.perf_counter() - start
    totals = cumulative_epsilons(events, DELTA)

    assert one_more > cold
    assert cold_s < 5.0 and warm_s < 1.0, (cold_s, warm_s)  # measured about 0.17 s and 0.01 s
    assert len(totals) == 40
