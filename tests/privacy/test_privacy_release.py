"""release: clipping, grid, noise scale, ledger spend first, refusal, Gaussian and counts."""

from __future__ import annotations

import importlib
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.errors import BudgetExhaustedError, PrivacyError, ReplayError
from cuvil_edge.privacy import GaussianMechanism, LaplaceMechanism, PrivacyLedger, release, release_counts
# The package re-exports the function ``release`` over the submodule's name, so
# fetch the module itself to patch its noise source.
release_mod = importlib.import_module("cuvil_edge.privacy.release")


def _ledger(tmp_path: Path, budget: float = 10.0) -> PrivacyLedger:
    return PrivacyLedger(tmp_path / "l.db", site="site-a", epsilon_budget=budget, delta=1e-5)


def test_clips_before_noise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release_mod, "_draw", lambda plan, values, rng: values)

    out = release([-5.0, 0.5, 7.0], LaplaceMechanism(1.0, 1.0), _ledger(tmp_path), lower=0.0, upper=1.0)

    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0])


def test_noise_scale(tmp_path: Path) -> None:
    n, sensitivity, epsilon = 200_000, 2.0, 0.5
    plan = release_mod.plan_laplace(sensitivity, epsilon, n)
    scale = float(plan.scale) * 2.0 ** -plan.k  # in value units, widened by the grid slack
    assert sensitivity / epsilon <= scale <= 1.002 * sensitivity / epsilon

    out = release(np.zeros(n), LaplaceMechanism(sensitivity, epsilon), _ledger(tmp_path))

    sigma = math.sqrt(2) * scale  # std of Laplace(scale)
    se_std = sigma * math.sqrt(5) / (2 * math.sqrt(n))  # kurtosis 6 -> Var(s^2) = 5 sigma^4 / n
    assert abs(out.std() - sigma) < 6 * se_std
    assert abs(out.mean()) < 6 * sigma / math.sqrt(n)


def test_spends_epsilon_and_reserves_before_noise(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    led = _ledger(tmp_path)
    seen = []

    def noise(plan, values, rng) -> np.ndarray:
        seen.append([r["status"] for r in led.history()])
        return values

    monkeypatch.setattr(release_mod, "_draw", noise)

    release([1.0, 2.0], LaplaceMechanism(1.0, 0.7), led, key="r1", round=3)

    assert seen == [["reserved"]]
    assert led.spent() == pytest.approx(0.7)
    assert [(r["status"], r["round"]) for r in led.history()] == [("committed", 3)]


def test_refuses_when_exhausted_and_draws_no_noise(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    led = _ledger(tmp_path, budget=1.0)
    release([1.0], LaplaceMechanism(1.0, 0.8), led)
    drawn = []
    monkeypatch.setattr(release_mod, "_draw",
                        lambda plan, values, rng: drawn.append(values.shape) or values)

    with pytest.raises(BudgetExhaustedError):
        release([1.0], LaplaceMechanism(1.0, 0.8), led)

    assert drawn == []
    assert led.spent() == pytest.approx(0.8)


def test_retry_of_published_key_is_refused(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    release([1.0], LaplaceMechanism(1.0, 1.0), led, key="q1")

    with pytest.raises(ReplayError, match="already claimed"):
        release([1.0], LaplaceMechanism(1.0, 1.0), led, key="q1")

    assert led.spent() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "values, sensitivity, epsilon, bounds",
    [
        pytest.param([1.0], 1.0, 0.0, {}, id="zero-epsilon"),
        pytest.param([1.0], 1.0, float("inf"), {}, id="inf-epsilon"),
        pytest.param([1.0], 0.0, 1.0, {}, id="zero-sensitivity"),
        pytest.param([1.0], float("nan"), 1.0, {}, id="nan-sensitivity"),
        pytest.param([1.0, float("nan")], 1.0, 1.0, {}, id="nan-value"),
        pytest.param([float("inf")], 1.0, 1.0, {}, id="inf-value"),
        pytest.param([], 1.0, 1.0, {}, id="empty"),
        pytest.param(["a"], 1.0, 1.0, {}, id="non-numeric"),
        pytest.param([1.0], 1.0, 1.0, {"lower": 2.0, "upper": 1.0}, id="lower-above-upper"),
        pytest.param([1.0], 1.0, 1.0, {"k": 1.5}, id="non-int-grid"),
        pytest.param([1.0], 1.0, 1.0, {"k": 99}, id="grid-out-of-range"),
        pytest.param([1e30], 1.0, 1.0, {"k": 40}, id="value-too-large-for-grid"),
        pytest.param([1.0], 1.0, 1.0, {"clip_norm": 1.0}, id="clip-norm-above-half-sensitivity"),
        pytest.param([1.0], 1.0, 1.0, {"gaussian": True, "sigma": 1e-9}, id="sigma-below-grid"),
    ],
)
def test_bad_inputs_spend_nothing(tmp_path: Path, values, sensitivity, epsilon, bounds) -> None:
    led = _ledger(tmp_path)
    bounds = dict(bounds)
    limits = {k: bounds.pop(k) for k in ("lower", "upper") if k in bounds}
    gaussian = bounds.pop("gaussian", False)
    mechanism = (GaussianMechanism(sensitivity, epsilon=epsilon, **bounds) if gaussian
                 else LaplaceMechanism(sensitivity, epsilon, **bounds))

    with pytest.raises(PrivacyError):
        release(values, mechanism, led, **limits)

    assert led.history() == []


def test_laplace_path_does_not_import_torch(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys, numpy as np\n"
        "from cuvil_edge.privacy import PrivacyLedger, release\n"
        f"led = PrivacyLedger({str(tmp_path / 'x.db')!r}, site='s', epsilon_budget=5, delta=1e-5)\n"
        "from cuvil_edge.privacy import LaplaceMechanism\n"
        "release(np.ones(3), LaplaceMechanism(1.0, 1.0), led)\n"
        "print('torch' in sys.modules, 'opacus' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert out.stdout.strip() == "False False", out.stderr


def test_outputs_lie_on_the_grid(tmp_path: Path) -> None:
    values = np.random.default_rng(0).normal(size=(50, 7))

    out = release(values, LaplaceMechanism(3.0, 1.2, k=12), _ledger(tmp_path))

    scaled = np.ldexp(out, 12)
    assert out.shape == values.shape
    np.testing.assert_array_equal(scaled, np.round(scaled))


def test_coarse_grid_release_is_charged_with_the_generic_pure_dp_curve(tmp_path: Path) -> None:
    """A discrete Laplace at a small integer sensitivity is not bounded by the continuous
    Laplace RDP curve: on a grid of fewer than 2^10 steps per sensitivity it is charged as PureDp."""
    led = _ledger(tmp_path)
    coarse = release_mod.plan_laplace(1.0, 0.5, 1, k=2)
    fine = release_mod.plan_laplace(1.0, 0.5, 1)
    assert coarse.sensitivity_int < release_mod.FINE_GRID_STEPS <= fine.sensitivity_int

    release([0.3], LaplaceMechanism(1.0, 0.5, k=2), led, key="coarse")
    release([0.3], LaplaceMechanism(1.0, 0.5), led, key="fine")

    assert [r["mechanism"] for r in led.history()] == ["pure", "laplace"]


def test_reserve_release_claims_before_anything_is_computed(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    pending = release_mod.reserve_release(LaplaceMechanism(2.0, 1.0), 3, led, key="req-1")
    assert [r["status"] for r in led.history()] == ["reserved"]  # claimed; the values do not exist yet
    with pytest.raises(ReplayError):
        release_mod.reserve_release(LaplaceMechanism(2.0, 1.0), 3, led, key="req-1")  # a concurrent duplicate
    with pytest.raises(PrivacyError, match="planned for 3"):
        pending.publish([1.0, 2.0])  # wrong size: aborted, nothing released
    assert [r["status"] for r in led.history()] == ["aborted"]
    assert led.spent() == 0.0


def test_effective_epsilon_never_above_stated() -> None:
    for eps in (1.2, 0.1, 3.0, 1 / 3):
        plan = release_mod.plan_laplace(0.85, eps, 10)

        assert plan.epsilon <= Fraction(eps)
        assert float(plan.epsilon) == pytest.approx(eps, rel=1e-9)
        assert plan.sensitivity_int == math.ceil(Fraction(0.85) * 2 ** plan.k) + 10


def test_clip_norm_bounds_the_released_vector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    captured = []

    def no_noise(plan, values, rng):
        x = release_mod.to_grid(values, plan.k)
        x = release_mod._clip_norm_int(x, plan.clip_int, plan)
        captured.append(plan)
        return np.ldexp(x.astype(float), -plan.k)

    monkeypatch.setattr(release_mod, "_draw", no_noise)

    out = release([3.0, -4.0, 1.0], LaplaceMechanism(2.0, 1.0, clip_norm=1.0), _ledger(tmp_path))

    assert np.abs(out).sum() <= 1.0
    assert captured[0].sensitivity_int == 2 * captured[0].clip_int


def test_gaussian_release_charges_widened_sensitivity(tmp_path: Path) -> None:
    led = _ledger(tmp_path, budget=50.0)

    out = release(np.zeros(4000), GaussianMechanism(1.0, epsilon=2.0, k=16), led, key="g1")

    [row] = led.history()
    sigma = release_mod.gaussian_sigma_for(2.0, 1e-5, 1.0)
    assert row["mechanism"] == "gaussian"
    assert row["sensitivity"] > 1.0  # widened by sqrt(d) grid steps
    assert row["sensitivity"] == pytest.approx(1.0 + math.ceil(math.sqrt(4000)) * 2.0 ** -16)
    assert abs(out.std() - sigma) < 6 * sigma / math.sqrt(2 * 4000)
    np.testing.assert_array_equal(np.ldexp(out, 16), np.round(np.ldexp(out, 16)))


def test_integer_counts_get_discrete_noise(tmp_path: Path) -> None:
    import random

    led = _ledger(tmp_path)
    counts = np.full(20_000, 7, dtype=np.int64)

    out = release_counts(counts, 2, 1.0, led, rng=random.Random(3))

    p = math.exp(-1 / 2)
    var = 2 * p / (1 - p) ** 2
    assert out.dtype == np.int64
    assert abs(out.mean() - 7) < 6 * math.sqrt(var / counts.size)
    assert led.spent() == pytest.approx(1.0)


@pytest.mark.parametrize("counts, sensitivity", [([1.5], 1), ([3], 0), ([3], 1.0), ([], 1)])
def test_bad_counts_spend_nothing(tmp_path: Path, counts, sensitivity) -> None:
    led = _ledger(tmp_path)

    with pytest.raises(PrivacyError):
        release_counts(np.array(counts), sensitivity, 1.0, led)

    assert led.history() == []
