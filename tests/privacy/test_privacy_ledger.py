"""PrivacyLedger: reserve/commit, refusal, fail-closed crashes, idempotency, corruption, RDP."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuvil_edge.errors import BudgetExhaustedError, LedgerError, PrivacyError
from cuvil_edge.privacy import PrivacyLedger

DELTA = 1e-5


def _ledger(path: Path, budget: float = 3.0, site: str = "site-a") -> PrivacyLedger:
    return PrivacyLedger(path, site=site, epsilon_budget=budget, delta=DELTA)


def test_reserve_then_commit(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")

    res = led.reserve_laplace(1.2, key="r1-q1", round=1)
    done = led.commit(res)

    assert res.status == "reserved" and done.status == "committed"
    assert led.spent() == pytest.approx(1.2)
    assert led.remaining() == pytest.approx(1.8)
    (row,) = led.history()
    assert row["mechanism"] == "laplace" and row["round"] == 1 and row["key"] == "r1-q1"
    assert row["created_at"].endswith("+00:00") and row["committed_at"]


def test_refuses_over_budget_and_reserves_nothing(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=2.0)
    led.commit(led.reserve_laplace(1.2, key="a"))

    with pytest.raises(BudgetExhaustedError) as info:
        led.reserve_laplace(1.2, key="b")

    msg = str(info.value)
    assert "site-a" in msg and "1.2" in msg and "2" in msg
    assert [r["key"] for r in led.history()] == ["a"]
    assert led.spent() == pytest.approx(1.2)


def test_exact_laplace_sum_at_the_boundary(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=1.0)
    led.reserve_laplace(0.5, key="a")
    led.reserve_laplace(0.5, key="b")  # exactly 1.0 fits

    with pytest.raises(BudgetExhaustedError):
        led.reserve_laplace(1e-12, key="c")


_CRASH_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from cuvil_edge.privacy import PrivacyLedger
    led = PrivacyLedger(sys.argv[1], site="site-a", epsilon_budget=3.0, delta=1e-5)
    led.reserve_laplace(1.2, key="r1-q1", round=1)
    os.kill(os.getpid(), signal.SIGKILL)  # crash between reserve and release
    """
)


def test_reserved_rows_count_after_crash(tmp_path: Path) -> None:
    path = tmp_path / "l.db"

    proc = subprocess.run([sys.executable, "-c", _CRASH_CHILD, str(path)], timeout=60)

    assert proc.returncode == -signal.SIGKILL
    led = _ledger(path)
    assert led.spent() == pytest.approx(1.2)
    assert [r["status"] for r in led.history()] == ["reserved"]


def test_idempotent_retry_does_not_double_count(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")
    first = led.reserve_laplace(1.2, key="r1-q1", round=1)
    led.close()
    led = _ledger(tmp_path / "l.db")

    again = led.reserve_laplace(1.2, key="r1-q1", round=1)

    assert again.id == first.id
    assert led.spent() == pytest.approx(1.2)
    assert len(led.history()) == 1


def test_key_reuse_for_a_different_event_is_refused(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")
    led.reserve_laplace(1.2, key="k")

    with pytest.raises(PrivacyError, match="already used"):
        led.reserve_laplace(0.5, key="k")


def test_rdp_composition_matches_opacus_golden_value(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=10.0)

    led.commit(led.reserve_dpsgd(1.5, 0.04, 2250, key="train-1", round=1))

    # Opacus' own test value for sigma=1.5, q=0.04, 2250 steps, delta=1e-5.
    assert led.spent() == pytest.approx(7.32911117143, abs=1e-4)
    row = led.history()[0]
    assert (row["noise_multiplier"], row["sample_rate"], row["steps"]) == (1.5, 0.04, 2250)
    assert row["delta"] == DELTA


def test_dpsgd_and_laplace_compose_basically(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=10.0)
    led.reserve_dpsgd(1.5, 0.04, 2250, key="t")

    exceed, total = led.would_exceed_dpsgd(1.5, 0.04, 2250)
    led.reserve_laplace(1.0, key="q")

    # Two identical DP-SGD runs compose under RDP to less than twice one run.
    assert exceed and 7.33 < total < 2 * 7.33
    assert led.spent() == pytest.approx(7.32911117143 + 1.0, abs=1e-4)
    with pytest.raises(BudgetExhaustedError):
        led.reserve_dpsgd(1.5, 0.04, 2250, key="t2")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_bytes(b"this is not a database" * 100), id="garbage"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:1000]), id="truncated-partial"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:50]), id="truncated-header"),
        pytest.param(lambda p: p.write_bytes(b""), id="truncated-empty"),
    ],
)
def test_damaged_file_raises_ledger_error_and_is_not_reset(tmp_path: Path, damage) -> None:
    path = tmp_path / "l.db"
    led = _ledger(path)
    for i in range(20):
        led.reserve_laplace(0.1, key=f"k{i}")
    led.close()
    damage(path)
    before = path.read_bytes()

    with pytest.raises(LedgerError):
        _ledger(path)

    assert path.read_bytes() == before


def test_ledger_of_another_site_is_refused(tmp_path: Path) -> None:
    _ledger(tmp_path / "l.db").close()

    with pytest.raises(LedgerError, match="site"):
        _ledger(tmp_path / "l.db", site="site-b")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda led: led.reserve_laplace(0.0), id="zero-eps"),
        pytest.param(lambda led: led.reserve_laplace(float("inf")), id="inf-eps"),
        pytest.param(lambda led: led.reserve_laplace(float("nan")), id="nan-eps"),
        pytest.param(lambda led: led.reserve_laplace(1.0, round=True), id="bool-round"),
        pytest.param(lambda led: led.reserve_dpsgd(1.0, 1.5, 10), id="q-above-1"),
        pytest.param(lambda led: led.reserve_dpsgd(1.0, 0.1, 0), id="zero-steps"),
        pytest.param(lambda led: led.reserve_dpsgd(0.0, 0.1, 10), id="zero-sigma"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, call) -> None:
    led = _ledger(tmp_path / "l.db")

    with pytest.raises(PrivacyError):
        call(led)

    assert led.history() == []


_RACER = textwrap.dedent(
    """
    import sys
    from cuvil_edge.errors import BudgetExhaustedError
    from cuvil_edge.privacy import PrivacyLedger
    led = PrivacyLedger(sys.argv[1], site="site-a", epsilon_budget=2.4, delta=1e-5)
    try:
        led.commit(led.reserve_laplace(1.2, key=sys.argv[2]))
        print("ok")
    except BudgetExhaustedError:
        print("refused")
    """
)


def test_concurrent_writers_cannot_overspend(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _ledger(path, budget=2.4).close()

    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, str(path), f"k{i}"],
                         stdout=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]

    assert sorted(outs) == ["ok", "ok", "refused", "refused"]
    assert _ledger(path, budget=2.4).spent() == pytest.approx(2.4)
