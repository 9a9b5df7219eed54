"""Symbolic dims that are products (``"4*batch"``): what reshaping the batch into another axis
makes (Swin's windows, multi-head attention's batch*heads). Types name them, bind and numel
evaluate them, and graphs that make them run at any batch."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.errors import ExecutionError
from cuvil_edge.ir.graph import TensorType


def test_bind_numel_and_symbols_read_products():
    t = TensorType("float32", ("4*batch", 16, "batch*heads"))
    assert t.symbols() == {"batch", "heads"}
    assert t.bind({"batch": 3}).shape == (12, 16, "3*heads")
    assert t.bind({"batch": 3, "heads": 2}).shape == (12, 16, 6)
    assert t.numel() == 64  # symbols count 1


def _windows_model() -> bytes:
    """x[N, 4, 4, 2] -> windows [-1, 4, 2] (4*N) -> scale -> back to [N, 4, 4, 2] with N read by Shape."""
    shape_w = numpy_helper.from_array(np.array([-1, 4, 2], np.int64), "shape_w")
    tail = numpy_helper.from_array(np.array([4, 4, 2], np.int64), "tail")
    idx = numpy_helper.from_array(np.array([0], np.int64), "idx")
    scale = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "scale")
    nodes = [
        helper.make_node("Reshape", ["x", "shape_w"], ["w"]),
        helper.make_node("Mul", ["w", "scale"], ["ws"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "tail"], ["back"], axis=0),
        helper.make_node("Reshape", ["ws", "back"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 4, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 4, 2])],
                              [shape_w, tail, idx, scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def test_batch_reshaped_into_windows_and_back_runs_at_any_batch():
    model = _windows_model()
    graph = load_model(model)
    assert graph.types["w"].shape == ("4*N", 4, 2)
    assert graph.types["y"].shape == ("N", 4, 4, 2)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 4, 2)).astype(np.float32)
        np.testing.assert_allclose(interpreter.run(graph, {"x": x})["y"], session.run(None, {"x": x})[0], rtol=1e-6)


def test_flatten_of_batch_and_channels_is_a_product():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4])
    graph = helper.make_graph([helper.make_node("Flatten", ["x"], ["y"], axis=2)], "f", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert load_model(model.SerializeToString()).types["y"].shape == ("3*N", 4)


def _split_model(dim: int) -> bytes:
    shape = numpy_helper.from_array(np.array([-1, dim], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", dim])], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def test_a_split_the_build_cannot_prove_exact_is_a_division_the_run_checks():
    """[N, 6] -> [-1, 4] holds for even N only: the dim is (6*N//4) and an odd N is a clear error."""
    graph = load_model(_split_model(4))
    assert graph.types["y"].shape == ("(6*N//4)", 4)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(interpreter.run(graph, {"x": x})["y"], x.reshape(3, 4))
    with pytest.raises(ExecutionError, match="'r'"):
        interpreter.run(graph, {"x": np.zeros((1, 6), np.float32)})


def test_a_split_that_can_never_hold_is_refused():
    shape = numpy_helper.from_array(np.array([-1, 4], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    with pytest.raises(Exception, match="cannot resolve -1") as info:
        load_model(model.SerializeToString())
    assert isinstance(info.value, ShapeInferenceError) or isinstance(info.value.__cause__, ShapeInferenceError)
