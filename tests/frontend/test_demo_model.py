"""The demo digits CNN: loads with the expected types and matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.errors import ModelError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter

import onnxruntime as ort  # noqa: E402


def test_demo_model_types():
    graph = load_model(digits_cnn_onnx())
    assert [(v.name, str(v.type)) for v in graph.inputs] == [("image", "float32[batch, 1, 8, 8]")]
    assert [(v.name, str(v.type)) for v in graph.outputs] == [("probs", "float32[batch, 10]")]
    assert [n.op_type for n in graph.nodes] == ["Mul", "Add", "Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Softmax"]


def test_demo_model_is_seeded():
    assert digits_cnn_onnx(1) == digits_cnn_onnx(1) != digits_cnn_onnx(2)


@pytest.mark.parametrize("batch", [1, 4])
def test_demo_model_matches_onnxruntime(batch):
    # prepare
    model = digits_cnn_onnx(seed=3)
    image = np.random.default_rng(batch).normal(size=(batch, 1, 8, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    expected = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(["probs"], {"image": image})[0]
    # act
    probs = interpreter.run(load_model(model), {"image": image})["probs"]
    # assert
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_demo_model_tanh_variant_matches_onnxruntime():
    # prepare
    model = digits_cnn_onnx(seed=3, activation="Tanh")
    image = np.random.default_rng(0).normal(size=(2, 1, 8, 8)).astype(np.float32)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["probs"], {"image": image})[0]
    # act
    graph = load_model(model)
    probs = interpreter.run(graph, {"image": image})["probs"]
    # assert
    assert [n.op_type for n in graph.nodes][3] == "Tanh"
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)


def test_demo_model_refuses_an_unknown_activation():
    with pytest.raises(ModelError, match="activation"):
        digits_cnn_onnx(activation="Gelu")
