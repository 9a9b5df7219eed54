"""release: clipping, noise scale, ledger spend first, refusal."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.errors import BudgetExhaustedError, PrivacyError
from cuvil_edge.privacy import PrivacyLedger, release
# The package re-exports the function ``release`` over the submodule's name, so
# fetch the module itself to patch its noise source.
release_mod = importlib.import_module("cuvil_edge.privacy.release")


def _ledger(tmp_path: Path, budget: float = 10.0) -> PrivacyLedger:
    return PrivacyLedger(tmp_path / "l.db", site="site-a", epsilon_budget=budget, delta=1e-5)


def test_clips_before_noise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release_mod, "_laplace_noise", lambda scale, shape: np.zeros(shape))

    out = release([-5.0, 0.5, 7.0], 1.0, 1.0, _ledger(tmp_path), lower=0.0, upper=1.0)

    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0])


def test_noise_scale(tmp_path: Path) -> None:
    n, sensitivity, epsilon = 200_000, 2.0, 0.5
    scale = sensitivity / epsilon

    out = release(np.zeros(n), sensitivity, epsilon, _ledger(tmp_path))

    sigma = math.sqrt(2) * scale  # std of Laplace(scale)
    se_std = sigma * math.sqrt(5) / (2 * math.sqrt(n))  # kurtosis 6 -> Var(s^2) = 5 sigma^4 / n
    assert abs(out.std() - sigma) < 6 * se_std
    assert abs(out.mean()) < 6 * sigma / math.sqrt(n)


def test_spends_epsilon_and_reserves_before_noise(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    led = _ledger(tmp_path)
    seen = []

    def noise(scale: float, shape: tuple[int, ...]) -> np.ndarray:
        seen.append([r["status"] for r in led.history()])
        return np.zeros(shape)

    monkeypatch.setattr(release_mod, "_laplace_noise", noise)

    release([1.0, 2.0], 1.0, 0.7, led, key="r1", round=3)

    assert seen == [["reserved"]]
    assert led.spent() == pytest.approx(0.7)
    assert [(r["status"], r["round"]) for r in led.history()] == [("committed", 3)]


def test_refuses_when_exhausted_and_draws_no_noise(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    led = _ledger(tmp_path, budget=1.0)
    release([1.0], 1.0, 0.8, led)
    drawn = []
    monkeypatch.setattr(release_mod, "_laplace_noise",
                        lambda scale, shape: drawn.append(shape) or np.zeros(shape))

    with pytest.raises(BudgetExhaustedError):
        release([1.0], 1.0, 0.8, led)

    assert drawn == []
    assert led.spent() == pytest.approx(0.8)


def test_retry_of_published_key_is_refused(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    release([1.0], 1.0, 1.0, led, key="q1")

    with pytest.raises(PrivacyError, match="already published"):
        release([1.0], 1.0, 1.0, led, key="q1")

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
    ],
)
def test_bad_inputs_spend_nothing(tmp_path: Path, values, sensitivity, epsilon, bounds) -> None:
    led = _ledger(tmp_path)

    with pytest.raises(PrivacyError):
        release(values, sensitivity, epsilon, led, **bounds)

    assert led.history() == []


def test_laplace_path_does_not_import_torch(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys, numpy as np\n"
        "from cuvil_edge.privacy import PrivacyLedger, release\n"
        f"led = PrivacyLedger({str(tmp_path / 'x.db')!r}, site='s', epsilon_budget=5, delta=1e-5)\n"
        "release(np.ones(3), 1.0, 1.0, led)\n"
        "print('torch' in sys.modules, 'opacus' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert out.stdout.strip() == "False False", out.stderr
