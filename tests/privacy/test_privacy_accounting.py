"""accounting: RDP composition of DP-SGD, Laplace and Gaussian events (the cross-check), and the charged
total: min(PLD, basic composition) (the PLD itself: test_pld_accounting.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from cuvil_edge.errors import PrivacyError
from cuvil_edge.privacy.accounting import (
    DEFAULT_ORDERS, Accountant, DpSgd, Gaussian, Laplace, PureDp, cumulative_epsilons, laplace_rdp, rdp_to_epsilon,
)

DELTA = 1e-5


def test_default_orders_are_opacus_default_alphas() -> None:
    assert list(DEFAULT_ORDERS) == RDPAccountant.DEFAULT_ALPHAS


def test_dpsgd_golden_value() -> None:
    acc = Accountant([DpSgd(1.5, 0.04, 2250)])

    eps = acc.rdp_epsilon(DELTA)

    # Opacus' own test value (tests/accountants_test.py) for this history.
    assert eps == pytest.approx(7.32911, abs=5e-5)
    assert acc.epsilon(DELTA) == acc.pld_epsilon(DELTA) == pytest.approx(6.7688, abs=2e-3)  # charged: PLD
    assert round(eps, 4) == round(7.32911117143, 4)
    reference = RDPAccountant()
    reference.history = [(1.5, 0.04, 2250)]
    assert eps == pytest.approx(reference.get_epsilon(delta=DELTA), rel=1e-12)


def test_conversion_matches_opacus_get_privacy_spent() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        rdp = rng.uniform(0.01, 5.0, size=len(DEFAULT_ORDERS))
        mine = rdp_to_epsilon(DEFAULT_ORDERS, rdp, DELTA)
        theirs = get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=rdp, delta=DELTA)
        assert mine == pytest.approx(theirs, rel=1e-12)


def _renyi_numeric(alpha: float, eps: float) -> float:
    """D_alpha(Lap(0, 1/eps) || Lap(1, 1/eps)) by numerical integration (independent oracle)."""
    b = 1.0 / eps
    x = np.linspace(-60 * b - 1, 60 * b + 2, 2_000_001)
    log_p = -np.abs(x) / b - math.log(2 * b)
    log_q = -np.abs(x - 1) / b - math.log(2 * b)
    integrand = np.exp(alpha * log_p + (1 - alpha) * log_q)
    return math.log(np.trapezoid(integrand, x)) / (alpha - 1)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0, 10.0, 32.0])
@pytest.mark.parametrize("eps", [0.1, 1.2, 3.0])
def test_laplace_curve_matches_numerical_renyi_divergence(alpha: float, eps: float) -> None:
    assert laplace_rdp(eps, [alpha])[0] == pytest.approx(_renyi_numeric(alpha, eps), rel=1e-5)


def test_laplace_curve_is_below_pure_epsilon_and_rises_with_order() -> None:
    curve = laplace_rdp(1.2, DEFAULT_ORDERS)

    assert np.all(curve <= 1.2) and np.all(np.diff(curve) > 0)


def _rr_numeric(alpha: float, eps: float) -> float:
    """D_alpha between randomized-response output laws, from its definition."""
    p = math.exp(eps) / (1 + math.exp(eps))
    return math.log(p**alpha * (1 - p) ** (1 - alpha) + (1 - p) ** alpha * p ** (1 - alpha)) / (alpha - 1)


def _discrete_laplace_numeric(alpha: float, eps: float, shift: int) -> float:
    """D_alpha(DLap(0) || DLap(shift)) with scale shift/eps, summed over a wide integer range."""
    y = np.arange(-4000 * shift, 4000 * shift + 1, dtype=np.float64)
    t = eps / shift
    log_p, log_q = -t * np.abs(y), -t * np.abs(y - shift)  # same normaliser Z for both
    log_z = np.log(np.sum(np.exp(log_p)))
    return float(np.log(np.sum(np.exp(alpha * log_p + (1 - alpha) * log_q))) - log_z) / (alpha - 1)


@pytest.mark.parametrize("alpha", [1.5, 4.0, 20.0])
@pytest.mark.parametrize("eps", [0.1, 1.2])
def test_pure_dp_curve_bounds_discrete_laplace_where_laplace_curve_does_not(alpha: float, eps: float) -> None:
    pure = PureDp(eps).rdp([alpha])[0]
    dlap_1 = _discrete_laplace_numeric(alpha, eps, 1)

    assert pure == pytest.approx(_rr_numeric(alpha, eps), rel=1e-9)
    assert pure == pytest.approx(dlap_1, rel=1e-6)  # integer sensitivity 1: exactly randomized response
    assert laplace_rdp(eps, [alpha])[0] < dlap_1  # the continuous curve would under-count it
    assert _discrete_laplace_numeric(alpha, eps, 1024) <= laplace_rdp(eps, [alpha])[0] * (1 + 1e-5)


def test_pure_events_compose_by_pld_below_their_sum() -> None:
    few, many = Accountant([PureDp(1.2)] * 3), Accountant([PureDp(1.2)] * 100)

    # At δ > 0 the PLD's ε of k ε-DP releases is a little below kε (exact for randomized response).
    # The charge rounds the PLD up to 1e-4, so a few pure releases cost exactly their sum.
    assert few.pld_epsilon(DELTA) == pytest.approx(3.6, rel=1e-4) and few.pld_epsilon(DELTA) < 3.6
    assert few.epsilon(DELTA) == pytest.approx(3.6, rel=1e-15)
    assert many.pld_epsilon(DELTA) <= many.epsilon(DELTA) <= many.pld_epsilon(DELTA) + 1e-4
    assert many.epsilon(DELTA) < many.rdp_epsilon(DELTA)
    assert Accountant([Laplace(1.2)] * 100).epsilon(DELTA) < many.epsilon(DELTA) < 120


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_few_laplace_releases_cost_at_most_their_plain_sum(k: int) -> None:
    acc = Accountant([Laplace(1.2)] * k)

    assert acc.rdp_epsilon(DELTA) > 1.2 * k  # RDP's conversion overhead dominates for few releases
    assert acc.pld_epsilon(DELTA) <= 1.2 * k  # the PLD does not pay it
    assert acc.epsilon(DELTA) <= 1.2 * k and acc.epsilon(DELTA) == pytest.approx(1.2 * k, rel=1e-4)
    if k <= 3:  # the PLD, rounded up to 1e-4, is no cheaper: the exact sum is charged
        assert acc.epsilon(DELTA) == pytest.approx(1.2 * k, rel=1e-15)


@pytest.mark.parametrize("k, rdp", [(10, 11.99), (100, 88.75)])
def test_many_laplace_releases_are_cheaper_under_rdp(k: int, rdp: float) -> None:
    acc = Accountant([Laplace(1.2)] * k)

    eps = acc.rdp_epsilon(DELTA)

    # Values measured with Google's dp-accounting RDP accountant (Laplace ε = 1.2 per release, δ = 1e-5).
    assert eps == pytest.approx(rdp, abs=0.01)
    assert acc.pld_epsilon(DELTA) <= acc.epsilon(DELTA) <= acc.pld_epsilon(DELTA) + 1e-4
    assert acc.epsilon(DELTA) < eps < 1.2 * k


def test_gaussian_curve_is_opacus_full_batch_curve() -> None:
    orders = [2.0, 8.0, 32.0]

    assert Gaussian(2.0, 1.0).rdp([8.0])[0] == pytest.approx(1.0)  # α/(2σ²)
    assert Gaussian(3.0, 1.5).rdp(orders) == pytest.approx(compute_rdp(q=1.0, noise_multiplier=2.0,
                                                                       steps=1, orders=orders))


def test_mixed_dpsgd_and_laplace() -> None:
    acc = Accountant([DpSgd(1.0, 0.01, 1000)] + [Laplace(0.5)] * 10)

    # Google's dp-accounting: RDP 6.12 against 7.10 when the parts are summed (DP-SGD by RDP: 2.10).
    assert acc.rdp_epsilon(DELTA) == pytest.approx(6.12, abs=0.01)
    # basic adds the DP-SGD part's PLD ε (1.84; Opacus' PRV accountant: 1.8384) to the Laplace sum 5.
    assert float(acc.basic_epsilon(DELTA)) == pytest.approx(5 + 1.84, abs=0.02)
    assert acc.pld_epsilon(DELTA) <= acc.epsilon(DELTA) <= acc.pld_epsilon(DELTA) + 1e-4
    assert acc.epsilon(DELTA) < acc.rdp_epsilon(DELTA)


def test_epsilon_rises_with_steps_and_falls_with_sigma() -> None:
    by_steps = [Accountant([DpSgd(1.1, 0.02, n)]).epsilon(DELTA) for n in (10, 100, 500, 1000, 3000)]
    by_sigma = [Accountant([DpSgd(s, 0.02, 500)]).epsilon(DELTA) for s in (0.7, 0.9, 1.1, 1.5, 3.0)]

    assert all(a < b for a, b in zip(by_steps, by_steps[1:]))
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))


def test_epsilon_never_falls_as_releases_are_added() -> None:
    events = [Laplace(1.2)] * 30 + [PureDp(0.2)] * 4 + [Gaussian(4.0, 1.0)] * 5 + [DpSgd(1.2, 0.05, 200)] * 3 + [Laplace(0.3)] * 20

    totals = cumulative_epsilons(events, DELTA)

    assert all(a < b for a, b in zip(totals, totals[1:]))
    for n in (1, 3, 31, 35, 40, 42, len(events)):  # cumulative equals composing each prefix from scratch
        assert totals[n - 1] == pytest.approx(Accountant(events[:n]).epsilon(DELTA), rel=1e-12)


def test_json_round_trip_gives_identical_epsilon() -> None:
    acc = Accountant([DpSgd(1.5, 0.04, 2250), Laplace(0.1), Gaussian(5.0, 1.0), PureDp(0.2), Laplace(0.05)])

    again = Accountant.from_json(json.dumps(json.loads(acc.to_json())))

    assert again.to_dict() == acc.to_dict()
    assert again.epsilon(DELTA) == acc.epsilon(DELTA)
    assert again.epsilon(1e-6) == acc.epsilon(1e-6)


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda s: s.update(extra=1), id="unknown-top-level-key"),
    pytest.param(lambda s: s["events"][0].update(clip=1.0), id="unknown-event-field"),
    pytest.param(lambda s: s["events"][0].update(mechanism="exponential"), id="unknown-mechanism"),
    pytest.param(lambda s: s["events"][0].update(noise_multiplier=-1.0), id="negative-sigma"),
    pytest.param(lambda s: s["events"][0].update(steps=True), id="bool-steps"),
    pytest.param(lambda s: s.update(version=99), id="future-version"),
    pytest.param(lambda s: s.update(orders=[0.5]), id="order-below-1"),
])
def test_malformed_state_is_refused(mutate) -> None:
    state = Accountant([DpSgd(1.5, 0.04, 10)]).to_dict()
    mutate(state)

    with pytest.raises(PrivacyError):
        Accountant.from_dict(state)


def test_laplace_and_gaussian_accounting_do_not_import_torch() -> None:
    code = ("import sys\nfrom cuvil_edge.privacy.accounting import Accountant, Gaussian, Laplace\n"
            "Accountant([Laplace(1.0), Gaussian(2.0, 1.0)]).epsilon(1e-5)\n"
            "sys.exit('torch' in sys.modules)")

    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.parametrize("q", [1e-4, 0.01, 0.08, 0.3, 0.99, 1.0])
@pytest.mark.parametrize("sigma", [0.3, 0.8, 1.0, 1.5, 4.0, 20.0])
def test_sampled_gaussian_curve_is_opacus_compute_rdp(q, sigma) -> None:
    """Our own sampled-Gaussian RDP (no opacus at run time) against Opacus' at every default order,
    and the ε it gives at δ. Both sum a cancelling series, so curves of 1e-9 per step (q = 1e-4)
    are compared absolutely; the next test checks such points against a 40-digit integral."""
    from cuvil_edge.privacy.accounting import subsampled_gaussian_rdp

    for steps in (1, 250):
        mine = subsampled_gaussian_rdp(q, sigma, steps, DEFAULT_ORDERS)
        theirs = np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(DEFAULT_ORDERS)))
        assert np.array_equal(np.isfinite(mine), np.isfinite(theirs))
        finite = np.isfinite(theirs)
        np.testing.assert_allclose(mine[finite], theirs[finite], rtol=1e-6, atol=1e-11 * steps)
        assert rdp_to_epsilon(DEFAULT_ORDERS, mine, DELTA)[0] == pytest.approx(
            get_privacy_spent(orders=list(DEFAULT_ORDERS), rdp=theirs, delta=DELTA)[0], rel=1e-7)


def test_reading_dp_sgd_spend_imports_neither_opacus_nor_torch(tmp_path) -> None:
    """An agent's evaluation reads a ledger holding DP-SGD rounds; that must not pull in torch.
    (The PLD accountant, dp_accounting, does import scipy: about 1.2 s once per process.)"""
    code = ("import sys; from cuvil_edge.privacy.accounting import Accountant, DpSgd;"
            "eps = Accountant([DpSgd(1.1, 0.08, 300)]).epsilon(1e-5); assert 0 < eps < 100;"
            "sys.exit(sorted({'torch', 'opacus'} & set(sys.modules)) or 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("q, sigma, alpha", [(0.3, 0.8, 1.3), (1e-4, 4.0, 1.1), (0.01, 1.0, 1.1), (0.08, 1.1, 2.5),
                                             (0.08, 1.1, 7.0), (0.5, 2.0, 3.7)])
def test_sampled_gaussian_curve_is_the_integral(q, sigma, alpha) -> None:
    """An oracle independent of both series: A_α = ∫ μ0 (μ/μ0)^α by 40-digit quadrature."""
    import mpmath as mp

    from cuvil_edge.privacy.accounting import subsampled_gaussian_rdp

    mp.mp.dps = 40
    qm, sm, am = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

    def integrand(z):
        mu0 = mp.npdf(z, 0, sm)
        return mu0 * (((1 - qm) * mu0 + qm * mp.npdf(z, 1, sm)) / mu0) ** am

    exact = mp.log(mp.quad(integrand, [-mp.inf, -10 * sm, 0, 1, 10 * sm + 1, mp.inf])) / (am - 1)
    assert subsampled_gaussian_rdp(q, sigma, 1, [alpha])[0] == pytest.approx(float(exact), rel=2e-6)
