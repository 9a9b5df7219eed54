"""Kernels specialised per call site: static attributes become literals, the branches they decide
are pruned, identical sites share one copy, and the result computes what the interpreter does."""

from __future__ import annotations

import ast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.device_targets import build
from cuvil_edge.device_targets.codegen import generate_source
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.device_targets.specialise import specialise_function
from cuvil_edge.errors import BuildError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES


# --- the AST step --------------------------------------------------------------------------------
KERNEL = '''
def k_demo(x, b=None, *, scale, mode, flip):
    if mode == "twice":
        y = x * 2
    else:
        y = x
    if flip:
        y = -y
    if b is not None:
        y = y + b
    return y * scale
'''


def test_literal_parameters_are_substituted_and_their_branches_pruned():
    text, bound, changed = specialise_function(KERNEL, "k_demo_1", {"scale": 3.0, "mode": "twice", "flip": 0,
                                                                    "b": None}, doc="for the demo")
    assert sorted(bound) == ["b", "flip", "mode", "scale"] and changed
    function = ast.parse(text).body[0]
    assert function.name == "k_demo_1"
    assert [a.arg for a in function.args.args + function.args.kwonlyargs] == ["x"]
    assert "if" not in text and "mode" not in text and "flip" not in text
    assert ast.get_docstring(function) == "for the demo"
    namespace = {}
    exec(text, namespace)
    assert namespace["k_demo_1"](np.float32(2)) == 12.0


def test_a_parameter_the_kernel_rebinds_or_a_non_literal_stays_a_parameter():
    rebinding = "def k(x, *, axis):\n    if axis < 0:\n        axis += x.ndim\n    return x.sum(axis=axis)\n"
    text, bound, changed = specialise_function(rebinding, "k_1", {"axis": -1})
    assert (text, bound, changed) == (rebinding, (), False)
    text, bound, _ = specialise_function(KERNEL, "k_2", {"scale": np.float32(2), "mode": "x", "flip": [1]})
    assert bound == ("mode",)  # a numpy scalar and a list are not literals the generated code may hold


def test_an_input_known_to_be_given_prunes_its_none_checks():
    text, bound, changed = specialise_function(KERNEL, "k_3", {"scale": 1.0, "mode": "x", "flip": 0}, present=["b"])
    assert changed and "is not None" not in text and "y = y + b" in text
    text, bound, changed = specialise_function(KERNEL, "k_4", {}, present=["b"])
    assert changed and bound == () and "is not None" not in text


def test_varargs_kernels_are_left_alone():
    source = "def k(*xs):\n    return xs[0]\n"
    assert specialise_function(source, "k_1", {}) == (source, (), False)


def test_source_that_is_not_one_function_is_refused():
    with pytest.raises(BuildError, match="not one function"):
        specialise_function("x = 1\n", "k_1", {})


# --- whole modules -------------------------------------------------------------------------------
def _model(opset: int, auto_pad: str = "NOTSET") -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w2")
    fc = numpy_helper.from_array(rng.standard_normal((5, 64)).astype(np.float32), "fc")
    pads = {"pads": [1, 1, 1, 1]} if auto_pad == "NOTSET" else {"auto_pad": auto_pad}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], name="conv1", kernel_shape=[3, 3], **pads),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="conv2", kernel_shape=[3, 3], **pads),
        helper.make_node("Conv", ["c2", "w2"], ["c3"], name="conv3", kernel_shape=[3, 3], **pads),
        helper.make_node("MaxPool", ["c3"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "fc"], ["g"], name="fc", transB=1),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "specialise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w, b, w2, fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _function(source: str, name: str) -> ast.FunctionDef:
    return next(s for s in ast.parse(source).body if isinstance(s, ast.FunctionDef) and s.name == name)


def _code(source: str, name: str) -> str:
    """Function ``name``'s code without its docstring (which names the values it was specialised for)."""
    function = _function(source, name)
    if ast.get_docstring(function) is not None:
        function.body = function.body[1:]
    return ast.unparse(function)


def test_static_attributes_are_substituted_and_dead_branches_pruned():
    source = prune(generate_source(load_model(_model(11))), DEFAULT_CAPABILITIES)
    conv = _code(source, "k_conv_1")
    assert "SAME" not in conv and "_win_same_pads" not in conv  # explicit pads: no auto_pad branch
    assert "auto_pad" not in conv and "pads" not in conv and "pd =" not in conv  # folded into its helpers
    assert "_activate" not in conv  # a plain Conv: the activation call is gone
    assert "is not None" not in conv and "y += b" in conv  # conv1 is given its bias
    assert "specialised for" in ast.get_docstring(_function(source, "k_conv_1"))  # survives pruning
    gemm = _code(source, "k_gemm_1")
    assert "trans_a" not in gemm and "a @ b.T" in gemm and "alpha" not in gemm
    softmax = _code(source, "k_softmax_1")
    assert "legacy" not in softmax and "reshape" in softmax  # opset 11: the 2-D flattening only
    # the generic kernels are unused and the pruner dropped them
    assert "def k_conv(" not in source and "def k_gemm(" not in source
    # conv2 and conv3 have the same attributes and no bias: one copy; conv1 has a bias: another
    assert source.count("= k_conv_2(") == 2 and source.count("= k_conv_1(") == 1
    assert "# Conv node 'conv2'" in source  # node names stay in comments


def test_opset_13_softmax_and_same_padding_keep_their_own_branches():
    source = prune(generate_source(load_model(_model(13, "SAME_UPPER"))), DEFAULT_CAPABILITIES)
    conv = _code(source, "k_conv_1")
    # SAME_UPPER over a static input size: the pads are worked out when the module is built, so
    # neither the SAME helper nor the auto_pad branch is left (the next test runs the result)
    assert "_win_same_pads" not in conv and "auto_pad" not in conv
    softmax = _code(source, "k_softmax_1")
    assert "reshape(int(" not in softmax


@pytest.mark.parametrize("opset,auto_pad", [(11, "NOTSET"), (13, "SAME_UPPER"), (13, "SAME_LOWER")])
@pytest.mark.parametrize("target", ["x86-64", "rpi4"])
def test_specialised_module_matches_interpreter_and_onnxruntime(tmp_path, opset, auto_pad, target):
    model = _model(opset, auto_pad)
    graph = load_model(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)

    class Package:
        payload_digest = "ab" * 32

    Package.graph = graph
    compiled = build(Package(), target, cache_dir=tmp_path)
    got = compiled.run({"x": x})["y"]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(interpreter.run(graph, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


# --- helpers the kernels call, specialised at each call site too ---------------------------------
def test_literal_tuple_items_and_literal_mapping_lookups_fold():
    text, _, _ = specialise_function("def f(x, k, mode):\n    return x[(1, 2)[0]] * k[1] + {'a': 1, 'b': 2}.get(mode, 0)\n",
                                     "f_1", {"k": (3, 4), "mode": "b"})
    assert "x[1] * 4 + 2" in text
    text, _, _ = specialise_function("def f(x, mode):\n    return {'a': 1}.get(mode, x)\n", "f_1", {"mode": "z"})
    assert ".get(" in text  # a default that is not a literal is left to run time


def _digits_source(target: str) -> str:
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx
    from cuvil_edge.passes import optimize
    from cuvil_edge.device_targets import load_target

    graph, _ = optimize(load_model(digits_cnn_onnx(0)))
    return prune(generate_source(graph), load_target(target).capabilities())


@pytest.mark.parametrize("target", ["x86-64", "rpi4"])
def test_a_module_holds_the_helpers_its_call_sites_take_not_every_activation(target):
    """The digits CNN's Conv fuses a Relu: its module keeps the Relu branch of the activation
    helper and none of the others (sigmoid, GELU with its erf, swish, hard-swish), and no tuple
    attribute is indexed at run time."""
    source = _digits_source(target)
    defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    assert not defined & {"_activate", "k_sigmoid", "k_gelu", "_erf64", "k_swish", "k_hard_swish"}, defined
    assert "_activate_1" in defined
    assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Subscript)
                and isinstance(n.value, ast.Tuple) and isinstance(n.slice, ast.Constant)]
