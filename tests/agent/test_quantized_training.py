"""A site planned at int8 trains the package it was sent.

The agent folds the int8 weights to float once at load; the activations' QuantizeLinear ->
DequantizeLinear pairs stay, so the device computes what the int8 graph computes. Training lowers
each pair to fake quantization with the straight-through estimator: forward exactly the int8
graph's values, backward the identity inside the representable range and zero where a value
saturated. The trained weights come back under the fp32 model's names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cuvil_edge.agent.torch_model import IRTorchModule
from cuvil_edge.agent.torch_functions import lowering
from cuvil_edge.agent.training import train_round
from cuvil_edge.config import load_site
from cuvil_edge.datasets import digits
from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.graph import Node
from cuvil_edge.ir.infer import with_initializers
from cuvil_edge.passes import optimize
from cuvil_edge.passes.quantize import calibrate_ranges, dequantize_at_load, quantize_int8
from cuvil_edge.privacy import PrivacyLedger

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "hospital-a.yaml"


def _node(op: str, **attrs) -> Node:
    return Node("q", op, ("x", "s", "z"), ("y",), attrs, 13)


def test_fake_quantization_passes_gradients_inside_the_range_and_stops_them_where_it_saturates():
    x = torch.tensor([-2.0, -0.3, 0.0, 0.26, 0.5, 2.0], requires_grad=True)
    scale, zero = torch.tensor(0.01), torch.tensor(-28, dtype=torch.int8)  # int8: x in [-1.00, 1.55]
    q = lowering("QuantizeLinear")(_node("QuantizeLinear"), x, scale, zero)
    assert q.tolist() == [-128.0, -58.0, -28.0, -2.0, 22.0, 127.0]  # round half to even: 0.26/0.01 -> 26
    y = lowering("DequantizeLinear")(_node("DequantizeLinear"), q, scale, zero)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 1, 1, 1, 1, 0])


def test_quantization_to_a_dtype_without_a_lowering_is_refused():
    with pytest.raises(UnsupportedAttributeError, match="int16 has no training lowering"):
        lowering("QuantizeLinear")(_node("QuantizeLinear"), torch.zeros(2), torch.tensor(0.1),
                                    torch.tensor(0, dtype=torch.int16))
    blocked = Node("q", "QuantizeLinear", ("x", "s", "z"), ("y",), {"block_size": 4}, 21)
    from cuvil_edge.agent.torch_functions import check
    with pytest.raises(UnsupportedAttributeError, match="blocked quantization"):
        check(blocked)


@pytest.fixture(scope="module")
def int8_graph():
    graph, _ = optimize(load_model(digits_cnn_onnx(0)))
    train = digits.site_partition(0, 3)
    ranges = calibrate_ranges(graph, [{graph.inputs[0].name: train.x[:64]}])
    return graph, dequantize_at_load(quantize_int8(graph, ranges))


def test_the_torch_module_computes_what_the_int8_graph_computes(int8_graph):
    _, loaded = int8_graph
    assert "QuantizeLinear" in loaded.op_counts()  # activations still quantized after the load fold
    x = digits.global_test().x[:50]
    expected = interpreter.run(loaded, {loaded.inputs[0].name: x})[loaded.outputs[0].name]
    module = IRTorchModule(loaded)
    with torch.no_grad():
        logits = module(torch.from_numpy(x))
    got = torch.softmax(logits, dim=1).numpy() if module.logits_name != module.output_name else logits.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_an_int8_package_trains_with_dp_sgd_and_returns_the_fp32_models_weights(tmp_path, int8_graph):
    fp32, loaded = int8_graph
    site = load_site(SITE)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite", site=site.site, epsilon_budget=site.privacy.epsilon_budget,
                           delta=site.privacy.delta)
    data, test = digits.site_partition(0, 3), digits.global_test()

    def loss(g) -> float:
        probs = interpreter.run(g, {g.inputs[0].name: test.x})[g.outputs[0].name].astype(np.float64)
        return float(-np.log(probs[np.arange(len(test.y)), test.y] + 1e-12).mean())

    outcome = train_round(loaded, site, data, ledger, 1, 1, seed=0)
    trained = {k: v for k, v in outcome.weights.items() if k in fp32.initializers}
    assert {k for k, v in fp32.initializers.items() if v.dtype == np.float32} <= set(outcome.weights)
    assert any(not np.array_equal(trained[k], loaded.initializers[k]) for k in trained)
    # the int8 graph carrying the trained weights (as the next round's package would) has learnt
    assert loss(with_initializers(loaded, trained)) < loss(loaded)
    assert ledger.spent() == pytest.approx(outcome.epsilon_round)
