"""One way to charge the ledger: ``PrivacyLedger.claim`` reserves before the block
runs, commits when it ends, aborts when it raises; training, evaluation and inference all use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cuvil_edge.errors import BudgetExhaustedError, ReplayError
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.accounting import PureDp

AGENT = Path(__file__).resolve().parents[2] / "cuvil_edge" / "agent"


def _ledger(tmp_path: Path, budget: float = 1.0) -> PrivacyLedger:
    return PrivacyLedger(tmp_path / "ledger.sqlite", site="site-a", epsilon_budget=budget, delta=1e-5)


def test_a_claim_is_reserved_inside_the_block_and_committed_after(tmp_path):
    ledger = _ledger(tmp_path)
    with ledger.claim(PureDp(0.25), key="k1", round=1) as reservation:
        assert [r["status"] for r in ledger.history()] == ["reserved"] and reservation.key == "k1"
    assert [r["status"] for r in ledger.history()] == ["committed"] and ledger.spent() == pytest.approx(0.25)


def test_a_block_that_raises_aborts_its_claim_and_the_key_stays_claimed(tmp_path):
    ledger = _ledger(tmp_path)
    with pytest.raises(ValueError):
        with ledger.claim(PureDp(0.25), key="k1"):
            raise ValueError("the data was unusable")
    assert [r["status"] for r in ledger.history()] == ["aborted"] and ledger.spent() == 0
    with pytest.raises(ReplayError):  # a replay is refused, whatever the first claim's end
        with ledger.claim(PureDp(0.25), key="k1"):
            pytest.fail("a replayed claim ran")


def test_an_unaffordable_claim_never_runs_its_block(tmp_path):
    ledger = _ledger(tmp_path, budget=0.1)
    with pytest.raises(BudgetExhaustedError):
        with ledger.claim(PureDp(0.25), key="k1"):
            pytest.fail("an unaffordable claim ran")
    assert ledger.history() == []


@pytest.mark.parametrize("module", ["training.py", "inference.py", "client_app.py"])
def test_the_agent_charges_only_through_claim(module):
    calls = {n.func.attr for n in ast.walk(ast.parse((AGENT / module).read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    names = {n.id for n in ast.walk(ast.parse((AGENT / module).read_text(encoding="utf-8"))) if isinstance(n, ast.Name)}
    assert "claim" in calls
    assert not calls & {"reserve", "commit", "abort", "publish"} and not names & {"reserve_release", "release"}
