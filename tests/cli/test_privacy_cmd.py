"""`cuvil-edge privacy status`: spent / remaining and the ledger per round; damaged ledgers exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil_edge.cli.main import main
from cuvil_edge.config.site import load_site
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.accounting import DpSgd, Gaussian, Laplace

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "factory-b.yaml"


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # Rich tables: no wrapping in captured output


def _ledger(state: Path) -> PrivacyLedger:
    p = load_site(SITE).privacy
    return PrivacyLedger(state / "ledger.sqlite", site="factory-b", epsilon_budget=p.epsilon_budget, delta=p.delta)


def test_status_prints_spent_remaining_and_rounds(tmp_path, capsys, wide):
    with _ledger(tmp_path) as led:
        led.commit(led.reserve(DpSgd(1.5, 0.04, 500), key="train-v1", round=1))
        led.commit(led.reserve(Laplace(0.1), key="eval-v1", round=1))
        led.reserve(Gaussian(20.0, 1.0), key="infer-7", round=2)  # reserved, never committed
        spent, remaining, rounds = led.spent(), led.remaining(), led.rounds()

    code = main(["privacy", "status", "--site", str(SITE), "--state-dir", str(tmp_path)])

    out = capsys.readouterr().out
    assert code == 0
    assert f"ε spent {spent:.4f} of 8" in out and f"remaining {remaining:.4f}" in out
    for key in ("train-v1", "eval-v1", "infer-7"):
        assert key in out
    assert "σ=1.5 q=0.04 steps=500" in out and "σ=20 Δ₂=1" in out
    assert "reserved" in out and "committed" in out
    assert f"{rounds[0]['spent_after']:.4f}" in out and f"{rounds[1]['spent_after']:.4f}" in out


def test_status_without_a_ledger_says_nothing_was_spent(tmp_path, capsys, wide):
    assert main(["privacy", "status", "--site", str(SITE), "--state-dir", str(tmp_path)]) == 0
    assert "nothing spent" in capsys.readouterr().out
    assert not (tmp_path / "ledger.sqlite").exists()  # status never creates a ledger


def test_status_defaults_to_the_sites_directory_in_the_home(tmp_path, capsys, wide):
    config = load_site(SITE)
    with _ledger(tmp_path / "home" / "agents" / config.site) as led:
        led.commit(led.reserve(Laplace(0.25), key="only", round=4))
    assert main(["privacy", "status", "--site", str(SITE), "--home", str(tmp_path / "home")]) == 0
    assert "ε spent 0.2500" in capsys.readouterr().out


@pytest.mark.parametrize("damage", [
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[:2000]), id="truncated"),
    pytest.param(lambda p: p.write_bytes(b"not a database" * 300), id="garbage"),
    pytest.param(lambda p: p.write_bytes(b""), id="empty"),
])
def test_damaged_ledger_is_one_line_error_exit_2(tmp_path, capsys, damage):
    with _ledger(tmp_path) as led:
        for i in range(50):
            led.reserve(Laplace(0.01), key=f"k{i}", round=i)
    path = tmp_path / "ledger.sqlite"
    damage(path)
    before = path.read_bytes()

    code = main(["privacy", "status", "--site", str(SITE), "--state-dir", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "ledger" in err
    assert path.read_bytes() == before


def test_state_dir_defaults_to_the_sites_agent_state_dir(tmp_path, capsys, wide):
    site = tmp_path / "site.yaml"
    site.write_text(SITE.read_text() + "agent:\n  state_dir: state\n")
    (tmp_path / "state").mkdir()
    with _ledger(tmp_path / "state") as led:
        led.commit(led.reserve(Laplace(0.25), key="only", round=4))

    assert main(["privacy", "status", "--site", str(site)]) == 0
    out = capsys.readouterr().out
    assert "ε spent 0.2500 of 8" in out and "only" in out


def _site_with_budget(tmp_path: Path, budget: float) -> Path:
    text = SITE.read_text().replace("epsilon_budget: 8.0", f"epsilon_budget: {budget}")
    path = tmp_path / "factory-b.yaml"
    path.write_text(text)
    return path


def test_editing_the_yaml_alone_cannot_raise_a_budget(tmp_path, capsys):
    with _ledger(tmp_path / "state") as led:
        led.commit(led.reserve(Laplace(7.5), key="big", round=1))
    raised = _site_with_budget(tmp_path, 20.0)
    config = load_site(raised)
    from cuvil_edge.errors import LedgerError

    with pytest.raises(LedgerError, match="raise-budget"):
        PrivacyLedger(tmp_path / "state" / "ledger.sqlite", site="factory-b", epsilon_budget=20.0,
                      delta=config.privacy.delta)
    assert main(["privacy", "status", "--site", str(raised), "--state-dir", str(tmp_path / "state")]) == 2
    assert "raise-budget" in capsys.readouterr().err


def test_raise_budget_records_the_change_and_its_reason(tmp_path, capsys, wide):
    with _ledger(tmp_path / "state") as led:
        led.commit(led.reserve(Laplace(7.5), key="big", round=1))
    raised = _site_with_budget(tmp_path, 20.0)
    args = ["privacy", "raise-budget", "--site", str(raised), "--state-dir", str(tmp_path / "state")]
    assert main(args + ["--reason", " "]) == 2  # a reason is required
    assert main(args + ["--reason", "DPO approval 2026-11-30 (ticket 42)"]) == 0
    p = load_site(raised).privacy
    with PrivacyLedger(tmp_path / "state" / "ledger.sqlite", site="factory-b", epsilon_budget=20.0,
                       delta=p.delta) as led:
        assert led.remaining() == pytest.approx(12.5)
        history = led.budget_history()
    assert [h["epsilon_budget"] for h in history] == [8.0, 20.0]
    assert "ticket 42" in history[-1]["reason"]
    assert main(["privacy", "raise-budget", "--site", str(raised), "--state-dir", str(tmp_path / "state"),
                 "--to", "5", "--reason", "lower than spent"]) == 2  # 7.5 already spent


def test_a_lower_yaml_budget_is_enforced_without_a_command(tmp_path):
    with _ledger(tmp_path / "state") as led:
        led.commit(led.reserve(Laplace(2.0), key="a", round=1))
    with PrivacyLedger(tmp_path / "state" / "ledger.sqlite", site="factory-b", epsilon_budget=2.5,
                       delta=1e-5) as led:
        assert led.remaining() == pytest.approx(0.5)


def test_raise_budget_above_the_yaml_is_refused_with_the_fix(tmp_path, capsys):
    """The lower of the YAML's and the ledger's budget is enforced: a raise the YAML does not
    also say would be recorded and never take effect, so it is refused and the fix named."""
    with _ledger(tmp_path / "state") as led:
        led.commit(led.reserve(Laplace(1.0), key="a", round=1))
    site = _site_with_budget(tmp_path, 8.0)
    assert main(["privacy", "raise-budget", "--site", str(site), "--state-dir", str(tmp_path / "state"),
                 "--to", "12", "--reason", "approved"]) == 2
    err = capsys.readouterr().err
    assert "set it to 12 in the YAML" in err and len(err.strip().splitlines()) == 1
    with PrivacyLedger(tmp_path / "state" / "ledger.sqlite", site="factory-b", epsilon_budget=None,
                       delta=1e-5) as led:
        assert [h["epsilon_budget"] for h in led.budget_history()] == [8.0]  # nothing recorded
