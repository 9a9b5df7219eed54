"""The demo digits CNN: loads with the expected types and matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter

ort = pytest.importorskip("onnxruntime")


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
