"""accounting where dp_accounting (and scipy) is not installed, as on a device of the base install:
no PLD bound, the charged total is the basic one (pure events exactly, the rest by RDP), and it
is never below what a full install charges for the same events."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from fractions import Fraction

import pytest

import cuvil_edge.privacy.accounting as accounting
from cuvil_edge.errors import BudgetExhaustedError
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.accounting import Accountant, DpSgd, Gaussian, Laplace, PureDp, cumulative_epsilons

DELTA = 1e-5
MIXES = [
    [Laplace(0.5), PureDp(0.05), PureDp(0.05), Laplace(0.25)],
    [PureDp(0.05)] * 40,
    [DpSgd(1.39, 0.08, 25), PureDp(0.05), DpSgd(1.39, 0.08, 25), PureDp(0.05)],
    [Gaussian(2.0, 1.0), Laplace(0.3), DpSgd(1.1, 0.02, 100)],
]


@pytest.fixture
def no_pld(monkeypatch):
    monkeypatch.setattr(accounting, "pld_available", lambda: False)


def _full(events) -> tuple[float, list[float]]:
    return Accountant(events).epsilon(DELTA), cumulative_epsilons(events, DELTA)


@pytest.mark.parametrize("events", MIXES)
def test_without_the_pld_the_charge_is_the_basic_bound_and_never_below_the_full_one(events, monkeypatch):
    full, full_prefixes = _full(events)
    monkeypatch.setattr(accounting, "pld_available", lambda: False)
    acc = Accountant(events)
    pure = sum((Fraction(e.epsilon) for e in events if isinstance(e, (Laplace, PureDp))), Fraction(0))
    approx = [e for e in events if not isinstance(e, (Laplace, PureDp))]
    rdp = Accountant(approx).rdp_epsilon(DELTA) if approx else 0.0
    assert accounting.pld_epsilon(events, DELTA) == math.inf
    assert acc.epsilon_exact(DELTA) == pure + Fraction(rdp)
    assert acc.epsilon(DELTA) >= full
    prefixes = cumulative_epsilons(events, DELTA)
    assert prefixes == [Accountant(events[:n + 1]).epsilon(DELTA) for n in range(len(events))]
    assert all(lean >= f for lean, f in zip(prefixes, full_prefixes))


def test_a_few_pure_releases_cost_their_exact_sum_either_way(monkeypatch):
    events = [Laplace(0.5), PureDp(0.05)]
    full = Accountant(events).epsilon(DELTA)
    monkeypatch.setattr(accounting, "pld_available", lambda: False)
    assert Accountant(events).epsilon_exact(DELTA) == Fraction(0.5) + Fraction(0.05)  # the floats' exact sum
    assert Accountant(events).epsilon(DELTA) == full == 0.55


def test_a_ledger_without_the_pld_charges_and_refuses_at_its_budget(tmp_path, no_pld):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite", site="site-a", epsilon_budget=1.0, delta=DELTA)
    for i in range(3):
        with ledger.claim(Laplace(0.3), key=f"k{i}"):
            pass
    assert ledger.spent() == pytest.approx(0.9)
    with pytest.raises(BudgetExhaustedError):
        with ledger.claim(Laplace(0.3), key="k3"):
            pytest.fail("an unaffordable claim ran")
    assert ledger.spent() == pytest.approx(0.9)


def test_where_dp_accounting_and_scipy_are_not_installed_none_is_imported():
    code = textwrap.dedent("""
        import sys
        sys.modules["dp_accounting"] = sys.modules["scipy"] = None  # as if not installed
        from cuvil_edge.privacy.accounting import Accountant, DpSgd, PureDp, pld_available
        assert not pld_available()
        print(float(Accountant([PureDp(0.25), PureDp(0.5)]).epsilon_exact(1e-5)),
              Accountant([DpSgd(1.39, 0.08, 25)]).epsilon(1e-5) > 0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.75", "True"]
