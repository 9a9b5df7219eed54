"""DP-SGD: planning agrees with Opacus, training updates the caller's module in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from cuvil_edge.errors import PrivacyError  # noqa: E402
from cuvil_edge.privacy import (  # noqa: E402
    noise_multiplier_for,
    plan_dp_sgd,
    steps_for,
    train_dp_sgd,
)


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _separable(n: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 0] += np.where(y == 1, 3.0, -3.0)
    return x, y


def _plan(**over):
    kw = dict(target_epsilon=4.0, delta=1e-5, sample_rate=0.125, epochs=4, expected_batch_size=64)
    kw.update(over)
    return plan_dp_sgd(**kw)


def _train(model, x, y, plan=None, **over):
    kw = dict(lr=0.1, momentum=0.9, max_grad_norm=1.0, seed=7)
    kw.update(over)
    return train_dp_sgd(model, x, y, plan or _plan(), **kw)


def test_trains_in_place_within_target() -> None:
    torch.manual_seed(0)
    model = TinyNet()
    params_before = [p for p in model.parameters()]
    weights_before = [p.detach().clone() for p in params_before]
    x, y = _separable()

    result = _train(model, x, y)

    assert result.epsilon <= 4.0 + 1e-6
    assert result.steps == steps_for(0.125, 4) == 32
    assert all(a is b for a, b in zip(model.parameters(), params_before))
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), weights_before))
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())
    assert type(model) is TinyNet and not model._forward_hooks
    with torch.no_grad():
        acc = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert acc > 0.8
    assert np.isfinite(result.final_loss)


def test_plan_matches_opacus_accounting() -> None:
    from opacus.accountants import RDPAccountant

    x, y = _separable(300)
    plan = _plan(epochs=3, sample_rate=0.2)

    result = _train(TinyNet(), x, y, plan)

    assert (result.noise_multiplier, result.sample_rate, result.steps) == (
        plan.noise_multiplier, plan.sample_rate, plan.steps)
    assert plan.steps == 15
    acc = RDPAccountant()
    acc.history = [(plan.noise_multiplier, plan.sample_rate, plan.steps)]
    assert result.epsilon == pytest.approx(acc.get_epsilon(delta=1e-5))
    assert noise_multiplier_for(4.0, 1e-5, plan.sample_rate, plan.steps) == plan.noise_multiplier


def test_plan_does_not_depend_on_the_dataset_size() -> None:
    """Neighbouring datasets (one record more) get the same σ, q, steps and ε: nothing reported
    about a run reveals how many records the site holds."""
    x, y = _separable(417)
    a = _train(TinyNet(), x[:416], y[:416])
    b = _train(TinyNet(), x, y)
    assert (a.noise_multiplier, a.sample_rate, a.steps, a.epsilon) == (b.noise_multiplier, b.sample_rate, b.steps,
                                                                        b.epsilon)


def test_empty_poisson_batches_still_take_a_noisy_step() -> None:
    x, y = _separable(4)
    plan = _plan(sample_rate=0.01, epochs=1, expected_batch_size=1)
    torch.manual_seed(0)
    model = TinyNet()
    before = [p.detach().clone() for p in model.parameters()]

    result = _train(model, x, y, plan, momentum=0.0)

    assert result.steps == 100 and result.empty_batches > 80
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), before))  # noise moved every weight


def test_same_seed_same_weights() -> None:
    x, y = _separable(128)
    models = []
    for _ in range(2):
        torch.manual_seed(1)
        m = TinyNet()
        _train(m, x, y, _plan(epochs=1, sample_rate=0.25, expected_batch_size=32))
        models.append(m)

    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "data, over, match",
    [
        pytest.param((np.zeros((10, 4), np.float32), np.zeros(9, np.int64)), {}, "first",
                     id="length-mismatch"),
        pytest.param(_separable(), {"loss": "hinge"}, "loss", id="unknown-loss"),
        pytest.param(_separable(), {"lr": -1.0}, "lr", id="negative-lr"),
        pytest.param((np.zeros((128, 4), np.float32), np.zeros(128, np.float32)), {},
                     "class ids", id="float-labels-for-cross-entropy"),
    ],
)
def test_bad_inputs(data, over, match) -> None:
    with pytest.raises(PrivacyError, match=match):
        _train(TinyNet(), *data, **over)


@pytest.mark.parametrize("over, match", [({"target_epsilon": 0.0}, "target_epsilon"),
                                         ({"sample_rate": 1.5}, "sample_rate"), ({"epochs": 0}, "epochs")])
def test_bad_plans(over, match) -> None:
    with pytest.raises(PrivacyError, match=match):
        _plan(**over)


def test_batchnorm_model_is_refused_with_advice() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 2))

    with pytest.raises(PrivacyError, match="ModuleValidator.fix"):
        _train(model, *_separable())


def test_a_remembered_noise_multiplier_is_reused_only_when_the_accountant_confirms_it(tmp_path):
    import json

    from cuvil_edge.privacy.dpsgd import NOISE_CACHE
    from cuvil_edge.privacy.ledger import dpsgd_epsilon

    args = dict(target_epsilon=2.0, delta=1e-5, sample_rate=0.2, epochs=2, expected_batch_size=30)
    plan = plan_dp_sgd(**args, cache_dir=tmp_path)
    cache = tmp_path / NOISE_CACHE
    (key, sigma), = json.loads(cache.read_text()).items()
    assert sigma == plan.noise_multiplier == plan_dp_sgd(**args).noise_multiplier
    assert dpsgd_epsilon([(sigma, 0.2, plan.steps)], 1e-5) <= 2.0
    # attack: a smaller σ written into the file would spend more than the target; it is searched again
    cache.write_text(json.dumps({key: sigma / 2}))
    assert plan_dp_sgd(**args, cache_dir=tmp_path).noise_multiplier == sigma
    assert json.loads(cache.read_text())[key] == sigma  # and the file is repaired
    cache.write_text(json.dumps({key: sigma * 3}))  # more noise than needed: costs accuracy, searched again
    assert plan_dp_sgd(**args, cache_dir=tmp_path).noise_multiplier == sigma
    for junk in ("not json", "[1, 2]", json.dumps({key: "1.5"}), json.dumps({key: float("nan")})):
        cache.write_text(junk)
        assert plan_dp_sgd(**args, cache_dir=tmp_path).noise_multiplier == sigma
    unwritable = tmp_path / "missing-dir"  # a cache that cannot be written: the plan still comes back
    assert plan_dp_sgd(**args, cache_dir=unwritable).noise_multiplier == sigma
