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
    "min(batch)", "f(batch)", "batch,seq", "", "x" * 2100, "(" * 40 + "batch" + ")" * 40, "-" * 40 + "batch",
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


def test_a_division_by_a_product_reads_back_as_one():
    """``a // (b*c)`` is not ``(a//b)*c``: the text keeps the divisor whole, and every atom's text
    parses back to the same value (Swin's windows per image is ``(batch*n)//(h*w)``)."""
    e = dims.floordiv(parse("batch*h*w"), parse("h*w"))
    assert e == parse("batch")
    odd = dims.floordiv(parse("batch*x"), parse("2*h*w"))
    assert str(odd) == "(batch*x//(2*h*w))"
    for b, x, h, w in itertools.product((1, 3), (5, 24), (1, 2), (3, 4)):
        binding = {"batch": b, "x": x, "h": h, "w": w}
        assert parse(str(odd)).evaluate(binding) == odd.evaluate(binding) == (b * x) // (2 * h * w)
    for text in ("(a%(2*b))", "(a//(b+1))", "((a+b)//(c*d))"):
        assert str(parse(str(parse(text)))) == str(parse(text))


def _random_expr(rng: np.random.Generator, depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.2:
        return Expr.symbol(str(rng.choice(["a", "b", "c"]))) if rng.random() < 0.7 else Expr.const(int(rng.integers(1, 9)))
    x, y = _random_expr(rng, depth - 1), _random_expr(rng, depth - 1)
    op = rng.choice(["+", "-", "*", "//k", "%k", "//e", "%e", "min", "max"])
    k = Expr.const(int(rng.integers(1, 8)))
    # divisors that are never 0: a sum, or a product of symbols with a coefficient (a//(2*b*c))
    monomial = Expr.const(int(rng.integers(1, 4))) * Expr.symbol(str(rng.choice(["a", "b"]))) * Expr.symbol("c")
    positive = y * y + 1 if rng.random() < 0.5 else monomial
    return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "//k": lambda: x // k, "%k": lambda: x % k,
            "//e": lambda: x // positive, "%e": lambda: x % positive, "min": lambda: dims.minimum(x, y),
            "max": lambda: dims.maximum(x, y)}[op]()


def test_random_expressions_keep_their_value_through_their_text():
    """Whatever the arithmetic builds, its canonical text parses back to the same value (at random
    bindings, against the expression's own evaluation), and the Python text the compiled module
    writes computes it too."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        try:
            e = _random_expr(rng, 4)
        except DimError:  # grew past MAX_TERMS: refused, as it should be
            continue
        back = parse(str(e))
        source = e.python(lambda s: f"S[{s!r}]")
        for binding in ({"a": int(a), "b": int(b), "c": int(c)} for a, b, c in rng.integers(1, 30, (5, 3))):
            want = e.evaluate(binding)
            assert back.evaluate(binding) == want, (str(e), binding)
            assert eval(source, {"min": min, "max": max, "S": binding}) == want, (source, binding)
        checked += 1
    assert checked > 300
