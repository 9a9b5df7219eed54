"""The ClientApp in a fresh process per message, as on Flower's deployment engine:
the evaluation path imports neither torch nor onnx, and the next round's package (same model, new
weights) is not built again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from one_message import enrolled_device  # noqa: E402 - a script beside this test, also run by bench/


@pytest.fixture
def device(tmp_path):
    """An enrolled device of the demo federation's first site and a way to send it a new round."""
    return enrolled_device(tmp_path)


def test_rounds_in_fresh_processes_build_once_and_evaluation_imports_no_torch_or_onnx(device):
    send, device_home = device
    first_eval, train, second_eval = send("evaluate"), send("train"), send("evaluate")
    assert train["error"] is None and train["metrics"]["eps-round"] > 0
    for reply in (first_eval, second_eval):  # the second reads a ledger holding a DP-SGD round
        assert reply["error"] is None and "noisy-correct" in reply["metrics"]
        assert not {"torch", "onnx", "onnxruntime", "opacus"} & set(reply["heavy_modules"]), reply["heavy_modules"]
    # the site's partition is kept (scikit-learn loads the digits); scipy now comes with the ledger's
    # PLD accountant (dp_accounting), so it is no sign of a re-read partition
    assert "sklearn" not in set(second_eval["heavy_modules"])
    builds = list(device_home.glob("agents/*/build-cache/*/module.py"))
    assert len(builds) == 1  # every later round's weights reused the first round's module
