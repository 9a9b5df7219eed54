"""FedProx on the agent: the proximal term pulls local training toward the received weights, and under
DP-SGD it is post-processing of the noised gradient, so a round costs exactly the same ε with or without it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cuvil_edge.agent.training import train_round
from cuvil_edge.config import load_site
from cuvil_edge.datasets import digits
from cuvil_edge.errors import PrivacyError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.privacy import PrivacyLedger
from cuvil_edge.privacy.dpsgd import proximal_gradient

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "hospital-a.yaml"
MU = 3.0  # learning rate 0.15: each step moves 45 % of the way back toward the received weights
#: Plain SGD's unclipped steps are large at this learning rate: a smaller rate, a larger mu (lr * mu = 0.2)
PLAIN_LR, PLAIN_MU = 0.02, 10.0


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prox")
    path = tmp / "hospital-a.yaml"
    path.write_text(re.sub(r"local_epochs: \d+", "local_epochs: 1", SITE.read_text()))  # 13 steps: fast
    return load_site(path), load_model(digits_cnn_onnx(0)), digits.site_partition(0, 3)


def _ledger(site, directory: Path) -> PrivacyLedger:
    directory.mkdir(parents=True, exist_ok=True)
    p = site.privacy
    return PrivacyLedger(directory / "ledger.sqlite", site=site.site, epsilon_budget=p.epsilon_budget, delta=p.delta)


def _distance(graph, weights: dict[str, np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum((weights[k] - graph.initializers[k]) ** 2)) for k in weights))


@pytest.mark.parametrize("local_dp", [True, False], ids=["dp-sgd", "plain"])
def test_mu_pulls_the_trained_weights_toward_the_received_ones_and_costs_no_epsilon(tmp_path, setup, local_dp):
    site, graph, data = setup
    mu_on = MU
    if not local_dp:
        site = site.model_copy(update={"training": site.training.model_copy(update={"learning_rate": PLAIN_LR})})
        mu_on = PLAIN_MU
    outcomes, spent = {}, {}
    for mu in (0.0, mu_on):
        ledger = _ledger(site, tmp_path / f"mu-{mu}")
        outcomes[mu] = train_round(graph, site, data, ledger, 1, 1, seed=11, local_dp=local_dp, proximal_mu=mu)
        spent[mu] = ledger.spent()
    free, prox = outcomes[0.0], outcomes[mu_on]
    # the same plan, charged the same: σ, q and steps do not depend on mu
    assert (prox.noise_multiplier, prox.sample_rate, prox.steps) == (free.noise_multiplier, free.sample_rate, free.steps)
    assert prox.epsilon_round == free.epsilon_round and spent[mu_on] == spent[0.0]
    if local_dp:
        assert 0 < spent[mu_on] <= site.privacy.epsilon_per_round + 1e-9
    else:
        assert spent[mu_on] == 0 and math.isinf(prox.epsilon_round)
    # the same seed draws the same batches and noise: only the proximal term differs
    near, far = _distance(graph, prox.weights), _distance(graph, free.weights)
    assert 0 < near < 0.7 * far, (near, far)


def test_mu_zero_is_plain_fedavg_training_bit_for_bit(tmp_path, setup):
    site, graph, data = setup
    a = train_round(graph, site, data, _ledger(site, tmp_path / "a"), 1, 1, seed=5)
    b = train_round(graph, site, data, _ledger(site, tmp_path / "b"), 1, 1, seed=5, proximal_mu=0)
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "mu", True, None])
def test_a_bad_mu_is_refused_before_anything_is_reserved(tmp_path, setup, bad):
    site, graph, data = setup
    ledger = _ledger(site, tmp_path)
    with pytest.raises(PrivacyError, match="proximal-mu"):
        train_round(graph, site, data, ledger, 1, 1, seed=1, proximal_mu=bad)
    assert ledger.spent() == 0


def test_the_proximal_gradient_is_mu_times_the_distance_from_the_start():
    layer = torch.nn.Linear(3, 2)
    start = [p.detach().clone() for p in layer.parameters()]
    add = proximal_gradient(layer, 0.5)
    assert proximal_gradient(layer, 0.0) is None
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(1.0)
            p.grad = torch.zeros_like(p)
    add(layer.parameters())
    for p, s in zip(layer.parameters(), start):
        torch.testing.assert_close(p.grad, 0.5 * (p.detach() - s))
