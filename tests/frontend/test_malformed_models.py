"""Malformed models: every one is refused with a typed ModelError (never numpy's or
protobuf's own exception, never a huge allocation), and the message names the problem."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import CuvilError, MalformedModelError, ModelError, ShapeInferenceError, UnsupportedOpError
from cuvil_edge.frontend import load_model

F = TensorProto.FLOAT


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=13, domain_opsets=()) -> bytes:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *domain_opsets])
    m.ir_version = 8
    return m.SerializeToString()


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def raw_tensor(name, dims, data: bytes):
    t = TensorProto(name=name, data_type=F, dims=dims)
    t.raw_data = data
    return t


def relu(i, o, name=None):
    return helper.make_node("Relu", [i], [o], name=name or o)


X = [vi("x", ["batch", 4])]

CASES = {
    "cycle": (model([relu("b", "a"), relu("a", "b")], X, [vi("b", ["batch", 4])]), MalformedModelError, "cycle"),
    "self-loop": (model([helper.make_node("Add", ["x", "a"], ["a"], name="n")], X, [vi("a", ["batch", 4])]),
                  MalformedModelError, ""),
    "dangling-input": (model([relu("nowhere", "y")], X, [vi("y", ["batch", 4])]), MalformedModelError, "nowhere"),
    "negative-dim": (model([relu("x", "y")], [vi("x", [-3, 4])], [vi("y", [-3, 4])]), ModelError, "-3"),
    "absurd-dim": (model([relu("x", "y")], [vi("x", [2**40, 4])], [vi("y", [2**40, 4])]), MalformedModelError, ""),
    "broadcast-mismatch": (model([helper.make_node("Add", ["x", "c"], ["y"], name="add")], [vi("x", [3, 4])],
                                 [vi("y", [3, 4])], [init("c", np.ones(5, np.float32))]), ShapeInferenceError, "add"),
    "gemm-inner-dims": (model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")], X, [vi("y", ["batch", 3])],
                              [init("w", np.ones((5, 3), np.float32))]), ShapeInferenceError, "fc"),
    "conv-channels": (model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3])],
                            [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 6, 6])],
                            [init("w", np.ones((4, 2, 3, 3), np.float32))]), ShapeInferenceError, "conv"),
    "reshape-size": (model([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [vi("x", [3, 4])],
                           [vi("y", [5, 3])], [init("s", np.array([5, -1], np.int64))]), ShapeInferenceError, "rs"),
    "raw-data-shorter-than-dims": (model([relu("x", "y")], X, [vi("y", ["batch", 4])],
                                         [raw_tensor("w", [1000, 1000], b"\0" * 16)]), ModelError, "w"),
    "huge-initializer-no-data": (model([relu("x", "y")], X, [vi("y", ["batch", 4])],
                                       [raw_tensor("w", [2**20, 2**20], b"")]), ModelError, "w"),
    "duplicate-producer": (model([relu("x", "y", "r1"), relu("x", "y", "r2")], X, [vi("y", ["batch", 4])]),
                           MalformedModelError, "twice"),
    "output-not-produced": (model([relu("x", "y")], X, [vi("z", ["batch", 4])]), MalformedModelError, "z"),
    "no-outputs": (model([relu("x", "y")], X, []), ModelError, ""),
    "unknown-op": (model([helper.make_node("FancyOp", ["x"], ["y"], name="f")], X, [vi("y", ["batch", 4])]),
                   UnsupportedOpError, "FancyOp"),
    "custom-domain": (model([helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.acme")], X,
                            [vi("y", ["batch", 4])], domain_opsets=[helper.make_opsetid("com.acme", 1)]),
                      UnsupportedOpError, "com.acme"),
    "bad-auto-pad": (model([helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=[2, 2],
                                             auto_pad="SIDEWAYS")], [vi("x", [1, 1, 4, 4])], [vi("y", [1, 1, 2, 2])]),
                     ModelError, "mp"),
    "pool-window-too-big": (model([helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=[9, 9])],
                                  [vi("x", [1, 1, 4, 4])], [vi("y", [1, 1, 1, 1])]), ShapeInferenceError, "mp"),
    "transpose-bad-perm": (model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[0, 0])],
                                 [vi("x", [2, 3])], [vi("y", [3, 2])]), ShapeInferenceError, "t"),
    "concat-rank-mismatch": (model([helper.make_node("Concat", ["x", "c"], ["y"], name="cat", axis=0)],
                                   [vi("x", [2, 3])], [vi("y", [4, 3])], [init("c", np.ones(3, np.float32))]),
                             ShapeInferenceError, "cat"),
    "softmax-axis-out-of-range": (model([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=5)], X,
                                        [vi("y", ["batch", 4])]), ModelError, "sm"),
    "string-input": (model([relu("x", "y")], [vi("x", [2], TensorProto.STRING)], [vi("y", [2])]), ModelError,
                     "string"),
    "split-sizes-wrong": (model([helper.make_node("Split", ["x", "s"], ["a", "b"], name="sp", axis=1)],
                                [vi("x", [2, 4])], [vi("a", [2, 1]), vi("b", [2, 1])],
                                [init("s", np.array([1, 1], np.int64))]), ShapeInferenceError, "sp"),
    "truncated-protobuf": (model([relu("x", "y")], X, [vi("y", ["batch", 4])])[:40], ModelError, ""),
    "gemm-rank-3": (model([helper.make_node("Gemm", ["x", "w"], ["y"], name="g")], [vi("x", [2, 3, 4])],
                          [vi("y", [2, 5])], [init("w", np.ones((4, 5), np.float32))]), ShapeInferenceError, "g"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_model_is_refused_with_a_typed_error(case):
    data, expected, fragment = CASES[case]
    with pytest.raises(CuvilError) as info:
        load_model(data)
    assert isinstance(info.value, expected), f"{case}: got {type(info.value).__name__}: {info.value}"
    assert fragment in str(info.value)


def test_there_are_at_least_twenty_malformed_models():
    assert len(CASES) >= 20
