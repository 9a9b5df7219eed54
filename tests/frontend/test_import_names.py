"""A model whose own names a package refuses (PACKAGE_SPEC §1.3) imports with valid ones.

torch writes initializer-like names as paths (the outputs of its Constant nodes,
``/Constant_output_0``, become initializers on import) and other exporters name weights
``/conv/weight``; a user expects such a model to package.  The importer renames exactly the names
the package would refuse, keeps them unique, and never renames a graph input or output (feeds and
results are keyed by those).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir_serialize import encode_payload
from cuvil_edge.passes import optimize
from cuvil_edge.passes.naming import is_graph_name, is_tensor_name

RNG = np.random.default_rng(0)


def _model() -> bytes:
    """x[N,4] -> Gemm(/conv/weight) + /Constant_output_0 -> ... -> y, and a constant second output."""
    init = [numpy_helper.from_array(RNG.standard_normal((3, 4)).astype(np.float32), "/conv/weight"),
            numpy_helper.from_array(RNG.standard_normal((3, 3)).astype(np.float32), "../w2"),
            numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "/w"),
            numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "w")]  # "/w" may not become "w"
    nodes = [
        helper.make_node("Constant", [], ["/Constant_output_0"], name="/Constant",
                         value=numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32))),
        helper.make_node("Constant", [], ["/const_out"], name="/Constant_1",
                         value=numpy_helper.from_array(np.arange(2, dtype=np.float32))),
        helper.make_node("Gemm", ["/x", "/conv/weight", "/Constant_output_0"], ["h\\1"], name="C:gemm", transB=1),
        helper.make_node("Add", ["h\\1", "/w"], ["/Add_output_0"], name="/Add"),
        helper.make_node("Mul", ["/Add_output_0", "w"], ["/Mul_output_0"], name="/Mul"),
        helper.make_node("MatMul", ["/Mul_output_0", "../w2"], ["/y"], name="/MatMul"),
    ]
    graph = helper.make_graph(nodes, "names", [helper.make_tensor_value_info("/x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("/y", TensorProto.FLOAT, ["N", 3]),
                               helper.make_tensor_value_info("/const_out", TensorProto.FLOAT, [2])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_refused_names_are_renamed_and_the_model_packages():
    data = _model()
    graph = load_model(data)
    assert [v.name for v in graph.inputs] == ["/x"] and [v.name for v in graph.outputs] == ["/y", "/const_out"]
    assert all(is_tensor_name(n) for n in graph.initializers), sorted(graph.initializers)
    assert all(is_graph_name(n) for n in graph.types) and all(is_graph_name(n.name) for n in graph.nodes)
    assert {"conv/weight", "w2", "w", "w_1", "Constant_output_0", "const_out"} <= set(graph.initializers)
    assert np.array_equal(graph.initializers["w"], numpy_helper.to_array(onnx.load_from_string(data).graph.initializer[3]))
    for g in (graph, optimize(graph)[0]):
        encode_payload(g)  # the writer applies the reader's checks
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"/x": x})
    got = interpreter.run(optimize(graph)[0], {"/x": x})
    np.testing.assert_allclose(got["/y"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["/const_out"], want[1])


def test_valid_names_are_left_alone():
    nodes = [helper.make_node("Add", ["x", "layer/w"], ["/layer/Add_output_0"], name="/layer/Add"),
             helper.make_node("Relu", ["/layer/Add_output_0"], ["y"], name="/layer/Relu")]
    graph = helper.make_graph(nodes, "ok", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(np.ones(2, np.float32), "layer/w")])
    imported = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [(n.name, n.inputs, n.outputs) for n in imported.nodes] == [
        ("/layer/Add", ("x", "layer/w"), ("/layer/Add_output_0",)), ("/layer/Relu", ("/layer/Add_output_0",), ("y",))]
    assert list(imported.initializers) == ["layer/w"]
