"""Local DP-SGD on the agent: IR -> torch equivalence, ledger first, refusal when exhausted."""

from pathlib import Path

import numpy as np
import pytest
import torch

from cuvil_edge.agent.torch_model import IRTorchModule
from cuvil_edge.agent.training import train_round
from cuvil_edge.config import load_site
from cuvil_edge.datasets import digits
from cuvil_edge.errors import BudgetExhaustedError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter
from cuvil_edge.privacy import PrivacyLedger

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "hospital-a.yaml"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_torch_module_computes_what_the_ir_computes():
    graph = load_model(digits_cnn_onnx(1))
    module = IRTorchModule(graph)
    x = np.random.default_rng(1).random((5, 1, 8, 8), dtype=np.float32)
    logits = module(torch.from_numpy(x)).detach().numpy()
    probs = interpreter.run(graph, {"image": x})["probs"]
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(logits), 1).numpy(), probs, rtol=1e-5, atol=1e-6)
    weights = module.ir_weights()
    for name, value in weights.items():
        np.testing.assert_array_equal(value, graph.initializers[name])


def test_train_round_spends_then_refuses(tmp_path):
    site = load_site(SITE)
    graph = load_model(digits_cnn_onnx(0))
    data = digits.site_partition(0, 3)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite", site=site.site, epsilon_budget=site.privacy.epsilon_budget,
                           delta=site.privacy.delta)
    rounds = 0
    with pytest.raises(BudgetExhaustedError, match="budget"):
        for version in range(1, 50):
            before = ledger.spent()
            outcome = train_round(graph, site, data, ledger, version, version)
            rounds += 1
            assert ledger.spent() > before
            assert outcome.epsilon_round <= site.privacy.epsilon_per_round + 1e-6
            assert set(outcome.weights) == {k for k, v in graph.initializers.items() if v.dtype == np.float32}
    spent = ledger.spent()
    assert rounds >= 2
    assert spent <= site.privacy.epsilon_budget
    with pytest.raises(BudgetExhaustedError):
        train_round(graph, site, data, ledger, 99, 99)
    assert ledger.spent() == pytest.approx(spent)  # a refusal spends nothing
