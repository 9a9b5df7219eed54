"""ONNX import: types, attributes, Constant folding, and one named test per kind of bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import (
    MalformedModelError,
    ModelError,
    ModelFileError,
    UnsupportedAttributeError,
    UnsupportedOpError,
)
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter


def _model(nodes, inputs=None, outputs=("y",), inits=(), opset=13, extra_opsets=(), out_shape=("batch", 3)):
    inputs = inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(out_shape)) for o in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _relu(x="x", y="y", name="r"):
    return helper.make_node("Relu", [x], [y], name=name)


# --- what a good model becomes -----------------------------------------------------------


def test_symbolic_batch_round_trips():
    # prepare
    model = _model([_relu()])
    # act
    graph = load_model(model.SerializeToString())
    # assert
    assert graph.inputs[0].type.shape == ("batch", 3)
    assert graph.outputs[0].type.shape == ("batch", 3)
    assert graph.opset == 13 and graph.nodes[0].version == 13


def test_missing_dim_becomes_generated_symbol():
    # prepare
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])
    # act
    graph = load_model(_model([_relu()], inputs=[vi]))
    # assert
    (dim, three) = graph.inputs[0].type.shape
    assert isinstance(dim, str) and dim and three == 3


def test_constant_is_folded_into_readonly_initializer():
    # prepare
    value = np.array([1.0, -2.0, 3.0], np.float32)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(value, "c")),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    # act
    graph = load_model(_model(nodes))
    # assert
    assert [n.op_type for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.initializers["c"], value)
    assert not graph.initializers["c"].flags.writeable
    out = interpreter.run(graph, {"x": np.ones((2, 3), np.float32)})["y"]
    np.testing.assert_array_equal(out, np.ones((2, 3), np.float32) + value)


def test_attributes_are_converted_and_names_generated(tmp_path):
    # prepare
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 5, 5])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("Identity", ["y"], ["z"], name="Relu_1")]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, inputs=[x], outputs=("z",), inits=[w], out_shape=("batch", 2, 5, 5)), str(path))
    # act
    graph = load_model(path)
    # assert
    conv, relu, ident = graph.nodes
    assert conv.attrs == {"auto_pad": "SAME_UPPER", "strides": (1, 1)}
    assert len({conv.name, relu.name, ident.name}) == 3 and conv.name.startswith("Conv")
    assert not graph.initializers["w"].flags.writeable
    assert graph.types["z"].shape == ("batch", 2, 5, 5)


# --- bad models: one named test each ---------------------------------------------------


@pytest.mark.parametrize("op", ["Bernoulli", "StringNormalizer"])  # random and string ops stay out of scope
def test_unsupported_op_names_op_node_and_where_the_supported_ops_are(op):
    # prepare
    model = _model([helper.make_node(op, ["x"], ["y"], name="the_node")])
    # act
    with pytest.raises(UnsupportedOpError) as info:
        load_model(model)
    # assert: a pointer to the list, not the list itself
    message = str(info.value)
    assert op in message and "the_node" in message
    assert "docs/OPS.md" in message and "`cuvil-edge ops`" in message and len(message) < 300


def test_non_default_domain_is_rejected():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="custom", domain="com.example")],
                   extra_opsets=[("com.example", 1)])
    with pytest.raises(UnsupportedOpError, match="com.example"):
        load_model(model)


def test_garbage_bytes():
    with pytest.raises(MalformedModelError, match="not an ONNX model") as info:
        load_model(b"\xff\xff\xff\xff\xff\xff garbage")
    assert info.value.__cause__ is not None


def test_empty_bytes():
    with pytest.raises(MalformedModelError, match="no graph"):
        load_model(b"")


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model(tmp_path / "absent.onnx")


def test_cycle():
    model = _model([_relu("x", "a", "r1"), helper.make_node("Add", ["a", "y"], ["b"], name="add"),
                    _relu("b", "y", "r2")])
    with pytest.raises(MalformedModelError, match="cycle"):
        load_model(model)


def test_dangling_input():
    with pytest.raises(MalformedModelError, match="nowhere"):
        load_model(_model([_relu("nowhere", "y")]))


def test_negative_dim():
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-2, 3])
    with pytest.raises(MalformedModelError, match="-2"):
        load_model(_model([_relu()], inputs=[vi]))


def test_duplicate_output_names():
    model = _model([_relu("x", "y", "r1"), _relu("x", "y", "r2")])
    with pytest.raises(MalformedModelError, match="'y' is produced twice"):
        load_model(model)


@pytest.mark.parametrize("elem,name", [(TensorProto.COMPLEX64, "complex64"), (TensorProto.STRING, "string")])
def test_unknown_input_dtype(elem, name):
    vi = helper.make_tensor_value_info("x", elem, ["batch", 3])
    model = _model([helper.make_node("Identity", ["x"], ["y"], name="i")], inputs=[vi])
    with pytest.raises(UnsupportedAttributeError, match=name):
        load_model(model)


def test_unknown_initializer_dtype():
    init = numpy_helper.from_array(np.ones(3, np.complex64), "c")
    model = _model([helper.make_node("Add", ["x", "c"], ["y"], name="add")], inits=[init])
    with pytest.raises(UnsupportedAttributeError, match="complex64"):
        load_model(model)


def test_no_default_opset():
    model = _model([_relu()])
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(MalformedModelError, match="opset"):
        load_model(model)


def test_every_failure_is_a_model_error():
    for source in (b"\x00\x01\x02", b"\x0a\x03abc"):
        with pytest.raises(ModelError):
            load_model(source)
