"""Importing a model with an op cuvil-edge lacks: the error names the first such node and op, the
other missing op types, and points to docs/OPS.md instead of listing every supported op."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from cuvil_edge.errors import UnsupportedOpError
from cuvil_edge.frontend import load_model


def _model(nodes, opset=13, extra_opsets=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph(nodes, "m", [x], [y])
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=imports)


def _error(model) -> str:
    with pytest.raises(UnsupportedOpError) as info:
        load_model(model)
    return str(info.value)


def test_a_misspelt_op_gets_the_right_name():
    # prepare
    model = _model([helper.make_node("GeLU", ["x"], ["y"], name="act")], opset=20)
    # act
    message = _error(model)
    # assert
    assert "'GeLU'" in message and "node 'act'" in message and "did you mean 'Gelu'" in message
    assert "docs/OPS.md" in message and len(message) < 300


def test_a_com_microsoft_op_is_refused_naming_its_domain():
    # prepare
    node = helper.make_node("FusedMatMul", ["x", "x"], ["y"], name="fmm", domain="com.microsoft")
    model = _model([node], extra_opsets=[("com.microsoft", 1)])
    # act
    message = _error(model)
    # assert
    assert "'FusedMatMul'" in message and "'com.microsoft'" in message and "node 'fmm'" in message
    assert "docs/OPS.md" in message and len(message) < 300


def test_the_other_missing_ops_are_named_too():
    # prepare
    nodes = [helper.make_node("Bernoulli", ["x"], ["a"], name="b"),
             helper.make_node("StringNormalizer", ["a"], ["c"], name="s"),
             helper.make_node("Relu", ["c"], ["y"], name="r")]
    # act
    message = _error(_model(nodes))
    # assert
    assert "'Bernoulli'" in message and "node 'b'" in message and "Also unsupported: StringNormalizer" in message


def test_an_op_below_its_oldest_version_says_which_opsets_it_has():
    # prepare: ONNX has Dropout-6 (the checker accepts it); cuvil-edge's Dropout starts at 7
    model = _model([helper.make_node("Dropout", ["x"], ["y"], name="drop", is_test=1)], opset=6)
    # act
    message = _error(model)
    # assert
    assert "'Dropout'" in message and "needs opset 7 or later" in message and "7, 10, 12, 13, 22" in message
    assert "opset 6" in message and "onnx.version_converter" in message
