"""PrivacyLedger: reserve/commit/abort, refusal, fail-closed crashes, races, idempotency, corruption, accounting."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuvil_edge.errors import BudgetExhaustedError, LedgerError, PrivacyError, ReplayError
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.accounting import Accountant, DpSgd, Gaussian, Laplace, PureDp
from cuvil_edge.privacy.ledger import budget_config_hash

DELTA = 1e-5
ONE_RUN = Accountant([DpSgd(1.5, 0.04, 2250)]).epsilon(DELTA)  # PLD: 6.7695 (RDP 7.3291)


def _ledger(path: Path, budget: float = 3.0, site: str = "site-a") -> PrivacyLedger:
    return PrivacyLedger(path, site=site, epsilon_budget=budget, delta=DELTA)


def test_reserve_then_commit(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")

    res = led.reserve(Laplace(1.2), key="r1-q1", round=1)
    done = led.commit(res)

    assert res.status == "reserved" and done.status == "committed"
    assert led.spent() == pytest.approx(1.2)
    assert led.remaining() == pytest.approx(1.8)
    (row,) = led.history()
    assert row["mechanism"] == "laplace" and row["round"] == 1 and row["key"] == "r1-q1"
    assert row["created_at"].endswith("+00:00") and row["committed_at"]


def test_refuses_over_budget_and_reserves_nothing(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=2.0)
    led.commit(led.reserve(Laplace(1.2), key="a"))

    with pytest.raises(BudgetExhaustedError) as info:
        led.reserve(Laplace(1.2), key="b")

    msg = str(info.value)
    assert "site-a" in msg and "1.2" in msg and "2" in msg
    assert [r["key"] for r in led.history()] == ["a"]
    assert led.spent() == pytest.approx(1.2)


def test_exact_laplace_sum_at_the_boundary(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=1.0)
    led.reserve(Laplace(0.5), key="a")
    led.reserve(Laplace(0.5), key="b")  # exactly 1.0 fits
    assert led.spent() == 1.0

    with pytest.raises(BudgetExhaustedError):  # (the PLD of all three, 1.00996, is just above)
        led.reserve(Laplace(0.01), key="c")


_CRASH_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from cuvil_edge.privacy import PrivacyLedger
    from cuvil_edge.privacy.accounting import Laplace
    led = PrivacyLedger(sys.argv[1], site="site-a", epsilon_budget=3.0, delta=1e-5)
    led.reserve(Laplace(1.2), key="r1-q1", round=1)
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


_RESERVE_AND_HANG = textwrap.dedent(
    """
    import sys, time
    from cuvil_edge.privacy import PrivacyLedger
    from cuvil_edge.privacy.accounting import DpSgd
    led = PrivacyLedger(sys.argv[1], site="site-a", epsilon_budget=10.0, delta=1e-5)
    led.reserve(DpSgd(1.5, 0.04, 2250), key="train-v1", round=1)
    print("reserved", flush=True)
    time.sleep(120)  # "training": killed from outside before commit
    """
)


def test_sigkill_from_outside_between_reserve_and_commit_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    proc = subprocess.Popen([sys.executable, "-c", _RESERVE_AND_HANG, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "reserved"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)

    led = _ledger(path, budget=10.0)
    assert [r["status"] for r in led.history()] == ["reserved"]
    assert led.spent() == pytest.approx(ONE_RUN)  # the reserved run still counts
    with pytest.raises(ReplayError):  # the retry after the crash never trains again
        led.reserve(DpSgd(1.5, 0.04, 2250), key="train-v1", round=1)
    assert len(led.history()) == 1
    assert led.spent() == pytest.approx(ONE_RUN)
    with pytest.raises(BudgetExhaustedError):
        led.reserve(Laplace(50.0), key="eval")


def test_replayed_key_is_refused_whatever_its_status(tmp_path: Path) -> None:
    """A second claim of a key never returns a reservation: not while it is reserved (a
    concurrent or crashed delivery), nor once committed or aborted."""
    led = _ledger(tmp_path / "l.db")
    reserved = led.reserve(Laplace(1.2), key="reserved", round=1)
    led.commit(led.reserve(Laplace(0.2), key="committed", round=1))
    led.abort(led.reserve(Laplace(0.2), key="aborted", round=1))
    led.close()
    led = _ledger(tmp_path / "l.db")

    for key in ("reserved", "committed", "aborted"):
        with pytest.raises(ReplayError, match="already claimed"):
            led.reserve(Laplace(1.2), key=key, round=1)

    assert reserved.status == "reserved" and len(led.history()) == 3
    assert led.spent() == pytest.approx(1.4)


def test_key_reuse_for_a_different_event_is_refused(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")
    led.reserve(Laplace(1.2), key="k")

    with pytest.raises(ReplayError, match="already claimed"):
        led.reserve(Laplace(0.5), key="k")


def test_dpsgd_is_charged_by_pld_below_opacus_rdp_golden_value(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=10.0)

    led.commit(led.reserve(DpSgd(1.5, 0.04, 2250), key="train-1", round=1))

    # Google's dp-accounting PLD: 6.7688; Opacus' own RDP test value is 7.32911117143.
    assert led.spent() == pytest.approx(6.7688, abs=2e-3) == ONE_RUN
    assert led.spent() < Accountant([DpSgd(1.5, 0.04, 2250)]).rdp_epsilon(DELTA) == pytest.approx(7.32911, abs=1e-4)
    assert led.history()[0]["epsilon"] == pytest.approx(led.spent())
    row = led.history()[0]
    assert (row["noise_multiplier"], row["sample_rate"], row["steps"]) == (1.5, 0.04, 2250)
    assert row["delta"] == DELTA


def test_dpsgd_and_laplace_compose_by_min_of_pld_and_basic(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=10.0)
    led.reserve(DpSgd(1.5, 0.04, 2250), key="t")

    exceed, total = led.would_exceed(DpSgd(1.5, 0.04, 2250))
    led.reserve(Laplace(1.0), key="q")

    # Two identical DP-SGD runs compose to less than twice one run.
    assert exceed and ONE_RUN < total < 2 * ONE_RUN
    expected = Accountant([DpSgd(1.5, 0.04, 2250), Laplace(1.0)])
    assert led.spent() == expected.epsilon(DELTA) < expected.rdp_epsilon(DELTA)
    assert ONE_RUN < led.spent() < ONE_RUN + 1.0  # the PLD beats the plain sum here
    with pytest.raises(BudgetExhaustedError):
        led.reserve(DpSgd(1.5, 0.04, 2250), key="t2")


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
        led.reserve(Laplace(0.1), key=f"k{i}")
    led.close()
    damage(path)
    before = path.read_bytes()

    with pytest.raises(LedgerError):
        _ledger(path)

    assert path.read_bytes() == before


def test_truncated_at_page_boundaries_refuses_and_is_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    led = _ledger(path, budget=1000.0)
    for i in range(400):
        led.reserve(Laplace(0.1), key=f"release-{i:04d}-" + "x" * 100, round=i // 10)
    led.close()
    full = path.read_bytes()
    page = int.from_bytes(full[16:18], "big")
    assert not Path(str(path) + "-wal").exists() and len(full) // page > 8  # checkpointed, many pages

    for pages in (1, 2, len(full) // page // 2, len(full) // page - 1):
        path.write_bytes(full[: pages * page])
        with pytest.raises(LedgerError):
            _ledger(path, budget=1000.0)
        assert path.stat().st_size == pages * page  # never reset or rewritten


def test_gaussian_release_is_reserved_with_its_parameters(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=10.0)

    res = led.reserve(Gaussian(4.0, 2.0), key="infer-1", round=3)
    led.commit(res)

    row = led.history()[0]
    assert (row["mechanism"], row["noise_std"], row["sensitivity"], row["round"]) == ("gaussian", 4.0, 2.0, 3)
    assert row["noise_multiplier"] is None and row["delta"] == DELTA
    assert led.spent() == pytest.approx(Accountant([Gaussian(4.0, 2.0)]).epsilon(DELTA))
    assert led.spent() == pytest.approx(row["epsilon"])
    with pytest.raises(ReplayError):
        led.reserve(Gaussian(4.0, 2.0), key="infer-1", round=3)
    with pytest.raises(ReplayError, match="already claimed"):
        led.reserve(Gaussian(4.0, 1.0), key="infer-1", round=3)
    with pytest.raises(PrivacyError):
        led.reserve(Gaussian(0.0, 1.0))


def test_pure_release_uses_the_curve_that_bounds_every_pure_mechanism(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=200.0)
    for i in range(100):
        led.reserve(PureDp(1.2), key=f"count-{i}", round=i)

    assert led.history()[0]["mechanism"] == "pure"
    assert led.spent() == pytest.approx(Accountant([PureDp(1.2)] * 100).epsilon(DELTA))
    assert Accountant([Laplace(1.2)] * 100).epsilon(DELTA) < led.spent() < 120


def test_abort_gives_back_only_reserved_spends(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=3.0)
    kept = led.commit(led.reserve(Laplace(1.0), key="a"))
    dropped = led.reserve(Laplace(1.5), key="b")

    led.abort(dropped)
    led.abort(dropped)  # idempotent

    assert led.spent() == pytest.approx(1.0)
    assert [r["status"] for r in led.history()] == ["committed", "aborted"]
    with pytest.raises(LedgerError, match="committed"):
        led.abort(kept)
    with pytest.raises(PrivacyError, match="aborted"):
        led.reserve(Laplace(1.5), key="b")  # an aborted key is not silently revived
    with pytest.raises(LedgerError):
        led.commit(dropped)


def test_rows_carry_config_hash_and_utc_time(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db")
    led.reserve(Laplace(0.1), key="a")
    led.close()
    led = PrivacyLedger(tmp_path / "l.db", site="site-a", epsilon_budget=3.0, delta=DELTA, config_hash="abc")
    led.reserve(Laplace(0.1), key="b")

    first, second = led.history()
    assert first["config_hash"] == budget_config_hash("site-a", 3.0, DELTA) != second["config_hash"] == "abc"
    assert first["created_at"].endswith("+00:00")


def test_rounds_show_the_total_after_each_round(tmp_path: Path) -> None:
    led = _ledger(tmp_path / "l.db", budget=20.0)
    led.commit(led.reserve(DpSgd(1.5, 0.04, 2250), key="t1", round=1))
    led.commit(led.reserve(Laplace(0.1), key="e1", round=1))
    led.abort(led.reserve(Laplace(0.5), key="e1b", round=1))
    led.reserve(Laplace(0.1), key="e2", round=2)

    rounds = led.rounds()

    assert [r["round"] for r in rounds] == [1, 2]
    assert [len(r["rows"]) for r in rounds] == [3, 1]
    one = Accountant([DpSgd(1.5, 0.04, 2250), Laplace(0.1)]).epsilon(DELTA)
    assert rounds[0]["spent_after"] == pytest.approx(one)
    assert rounds[1]["spent_after"] == pytest.approx(led.spent())


_V1_SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL UNIQUE, site TEXT NOT NULL,
    mechanism TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, noise_multiplier REAL,
    sample_rate REAL, steps INTEGER, round INTEGER, created_at TEXT NOT NULL, committed_at TEXT,
    status TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1'), ('site', 'site-a'), ('delta', '1e-05'),
    ('epsilon_budget', '3.0'), ('created_at', '2025-01-01T00:00:00+00:00');
INSERT INTO events (idempotency_key, site, mechanism, epsilon, delta, round, created_at, status)
    VALUES ('old', 'site-a', 'laplace', 1.2, 0.0, 1, '2025-01-01T00:00:00+00:00', 'committed');
"""


def test_schema_1_ledger_is_upgraded_keeping_its_spends(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    conn = sqlite3.connect(path)
    conn.executescript(_V1_SCHEMA)
    conn.close()

    led = _ledger(path)

    assert led.spent() == pytest.approx(1.2)
    (row,) = led.history()
    assert row["key"] == "old" and row["status"] == "committed" and "schema 1" in row["config_hash"]
    led.reserve(Gaussian(3.0, 1.0), key="new")
    assert len(_ledger(path).history()) == 2


def test_ledger_of_another_site_is_refused(tmp_path: Path) -> None:
    _ledger(tmp_path / "l.db").close()

    with pytest.raises(LedgerError, match="site"):
        _ledger(tmp_path / "l.db", site="site-b")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda led: led.reserve(Laplace(0.0)), id="zero-eps"),
        pytest.param(lambda led: led.reserve(Laplace(float("inf"))), id="inf-eps"),
        pytest.param(lambda led: led.reserve(Laplace(float("nan"))), id="nan-eps"),
        pytest.param(lambda led: led.reserve(Laplace(1.0), round=True), id="bool-round"),
        pytest.param(lambda led: led.reserve(DpSgd(1.0, 1.5, 10)), id="q-above-1"),
        pytest.param(lambda led: led.reserve(DpSgd(1.0, 0.1, 0)), id="zero-steps"),
        pytest.param(lambda led: led.reserve(DpSgd(0.0, 0.1, 10)), id="zero-sigma"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, call) -> None:
    led = _ledger(tmp_path / "l.db")

    with pytest.raises(PrivacyError):
        call(led)

    assert led.history() == []


_RACER = textwrap.dedent(
    """
    import os, sys, time
    from cuvil_edge.errors import BudgetExhaustedError
    from cuvil_edge.privacy import PrivacyLedger
    from cuvil_edge.privacy.accounting import Laplace
    led = PrivacyLedger(sys.argv[1], site="site-a", epsilon_budget=2.4, delta=1e-5)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        led.commit(led.reserve(Laplace(1.2), key=sys.argv[2]))
        print("ok")
    except BudgetExhaustedError:
        print("refused")
    """
)


def test_six_racing_processes_exactly_two_succeed(tmp_path: Path) -> None:
    path, go = tmp_path / "l.db", tmp_path / "go"
    _ledger(path, budget=2.4).close()  # 2 x 1.2 fits exactly; RDP of 3 x 1.2 is 3.67 > 2.4

    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, str(path), f"k{i}", str(go)],
                         stdout=subprocess.PIPE, text=True)
        for i in range(6)
    ]
    try:
        for p in procs:  # every process has opened the ledger before any reserves
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()

    assert sorted(outs) == ["ok"] * 2 + ["refused"] * 4
    led = _ledger(path, budget=2.4)
    assert led.spent() == pytest.approx(2.4)
    assert [r["status"] for r in led.history()] == ["committed", "committed"]
