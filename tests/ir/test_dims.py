"""Symbolic dims as integer expressions: canonical text, exact arithmetic, the few facts sizes
give (a symbol is at least 1), and a parser that treats a dim as data from outside the device."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cuvil_edge.errors import MalformedModelError
from cuvil_edge.ir import dims
from cuvil_edge.ir.dims import DimError, Expr, parse
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph


@pytest.mark.parametrize("text, canonical", [
    ("batch", "batch"), ("seq*batch*2", "2*batch*seq"), ("batch*(seq+1)", "batch*seq+batch"),
    ("seq+1-1", "seq"), ("(4*batch)//4", "batch"), ("(N*w)//w", "N"), ("(H-16)//16+1", "(H//16)"),
    ("(2*seq+1)//2", "seq"), ("(2*seq+1)%2", "1"), ("max(batch,1)", "batch"), ("min(seq,seq+1)", "seq"),
    ("min(seq,1024)", "min(1024,seq)"), ("3-(x//2)", "-(x//2)+3"), ("  batch  ", "batch"),
])
def test_text_is_canonical(text, canonical):
    assert str(parse(text)) == canonical
    assert parse(str(parse(text))) == parse(text)  # the canonical text reads back as the same expression


def test_equal_expressions_have_one_text_whatever_the_order_they_were_built_in():
    b, s = Expr.symbol("batch"), Expr.symbol("seq")
    assert str((s + 1) * b) == str(b * s + b) == str(b * (1 + s))
    assert dims.product(["batch", "seq+1", 768]) == "768*batch*seq+768*batch"


def test_expressions_evaluate_as_python_integers_do():
    rng = np.random.default_rng(0)
    texts = ["(H+(7-H%7)%7)//7", "batch*seq+batch", "max(seq-4,0)", "min(5,seq)", "(3*batch//2)", "(seq%3)"]
    for text, (h, batch, seq) in itertools.product(texts, rng.integers(1, 40, (20, 3))):
        bindings = {"H": int(h), "batch": int(batch), "seq": int(seq)}
        want = eval(text, {"max": max, "min": min}, dict(bindings))  # the test's own oracle, on trusted text
        assert parse(text).evaluate(bindings) == want, (text, bindings)
        assert parse(text).substitute({"H": int(h)}).evaluate(bindings) == want


def test_exact_division_and_what_cannot_be_proven():
    total = parse("768*batch*seq+768*batch")
    assert dims.divide_exactly(total, parse("seq+1")) == parse("768*batch")
    assert dims.divide_exactly(parse("batch*seq+1"), parse("seq")) is None
    assert dims.provably_different(parse("6*batch"), Expr.const(20))  # no integer batch makes 20
    assert not dims.provably_different(parse("6*batch"), Expr.const(18))
    assert dims.provably_le(parse("H"), parse("H+(7-H%7)%7"))  # padding never shrinks an axis


def test_symbol_for_a_value_name_is_a_symbol_and_keeps_names_apart():
    a, b = dims.symbol_for("/NonZero:0", "count"), dims.symbol_for("/NonZero_0", "count")
    assert dims.SYMBOL.match(a) and dims.SYMBOL.match(b) and a != b
    assert dims.symbol_for("idx", "count") == "idx_count"


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "batch; rm -rf /", "batch**2", "batch/2", "2*", "(batch", "batch)",
    "min(batch)", "f(batch)", "batch,seq", "", "x" * 600, "(" * 40 + "batch" + ")" * 40, "-" * 40 + "batch",
    "batch\nseq", "bätch", "1//0", "seq%0", "lambda: 0",
])
def test_text_that_is_not_a_dim_is_refused_without_running_anything(text):
    with pytest.raises(DimError):
        parse(text)


def test_a_graph_whose_input_has_a_bad_dim_is_a_malformed_model():
    """Graph inputs' dims reach the device inside a package: a bad one is a typed error there."""
    for bad in ("__import__('os')", "batch size", "((((batch"):
        with pytest.raises(MalformedModelError, match="dim"):
            build_graph("g", [Value("x", TensorType("float32", (bad, 4)))], ["y"],
                        [Node("n", "Relu", ("x",), ("y",))], {}, 17)


def test_a_graph_input_dim_is_kept_in_canonical_text():
    graph = build_graph("g", [Value("x", TensorType("float32", ("seq*2*batch", 4)))], ["y"],
                        [Node("n", "Relu", ("x",), ("y",))], {}, 17)
    assert graph.types["y"].shape == ("2*batch*seq", 4)


def test_dynamic_axes_named_with_any_text_import_as_symbols():
    """ONNX allows any dim_param text; the IR names each distinct one with a symbol of its own."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from cuvil_edge.frontend import load_model
    from cuvil_edge.ir import interpreter

    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch size", "2*N"]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch_size", None])]
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["b"], ["z"])], "g",
                              inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch size", "2*N"]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch_size", None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    g = load_model(model)
    (a, b) = (v.type.shape for v in g.inputs)
    assert a == ("batch_size", "d_2_N") and b == ("batch_size_2", "b_dim1")
    feeds = {"a": np.ones((2, 3), np.float32), "b": -np.ones((4, 5), np.float32)}  # two different batch sizes
    got = interpreter.run(g, feeds)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["z"], want[1])
