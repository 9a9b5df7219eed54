"""Known values at build time: constants folded by kernels and symbolic shape vectors."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import interpreter, shape_values
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph, known_values

I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
SYM = lambda *v: np.array(v, dtype=object)  # noqa: E731
X = Value("x", TensorType("float32", ("batch", 2, 3, 4)))


def _flatten_graph(gather_index=np.array(0, np.int64)):
    nodes = [
        Node("shape", "Shape", ("x",), ("s",)),
        Node("gather", "Gather", ("s", "zero"), ("b",), {"axis": 0}),
        Node("unsq", "Unsqueeze", ("b", "axes"), ("u",)),
        Node("concat", "Concat", ("u", "minus1"), ("t",), {"axis": 0}),
        Node("reshape", "Reshape", ("x", "t"), ("y",)),
    ]
    inits = {"zero": gather_index, "axes": I64(0), "minus1": I64(-1)}
    return build_graph("flatten", [X], ["y"], nodes, inits, 13)


def test_shape_gather_unsqueeze_concat_reshape_keeps_batch_symbol():
    # prepare: x.view(x.size(0), -1) as torch exports it with a dynamic batch
    # act
    g = _flatten_graph()
    known = known_values(g)
    # assert
    assert g.types["y"] == TensorType("float32", ("batch", 24))
    assert known["s"].dtype == object and known["s"].tolist() == ["batch", 2, 3, 4]
    assert known["t"].tolist() == ["batch", -1]
    x = np.random.default_rng(0).standard_normal((3, 2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(interpreter.run(g, {"x": x})["y"], x.reshape(3, -1))


def test_static_part_of_shape_becomes_int64_constant():
    nodes = [Node("shape", "Shape", ("x",), ("s",)), Node("gather", "Gather", ("s", "idx"), ("y",), {"axis": 0})]
    g = build_graph("g", [X], ["y"], nodes, {"idx": I64(1, 3)}, 13)
    value = known_values(g)["y"]
    assert value.dtype == np.int64 and value.tolist() == [2, 4]


def test_small_constant_subgraph_evaluated_by_kernels():
    nodes = [Node("add", "Add", ("a", "b"), ("c",)), Node("mul", "Mul", ("x", "c"), ("y",))]
    inputs = [Value("x", TensorType("float32", ("batch", 3)))]
    a, b = np.ones(3, np.float32), np.arange(3, dtype=np.float32)
    known = known_values(build_graph("g", inputs, ["y"], nodes, {"a": a, "b": b}, 13))
    np.testing.assert_array_equal(known["c"], a + b)
    assert "y" not in known


def test_large_constants_are_not_evaluated():
    big = np.ones(shape_values.SMALL + 1, np.float32)
    nodes = [Node("add", "Add", ("a", "a"), ("c",)), Node("out", "Add", ("x", "c"), ("y",))]
    inputs = [Value("x", TensorType("float32", (shape_values.SMALL + 1,)))]
    assert "c" not in known_values(build_graph("g", inputs, ["y"], nodes, {"a": big}, 13))


@pytest.mark.parametrize("op,attrs,values,expected", [
    ("Gather", {"axis": 0}, [SYM("b", 2, 3), I64(0, 2)], ["b", 3]),
    ("Gather", {"axis": 0}, [SYM("b", 2, 3), np.array(-1, np.int64)], 3),
    ("Unsqueeze", {}, [np.array("b", dtype=object), I64(0)], ["b"]),
    ("Squeeze", {}, [SYM("b"), I64(0)], "b"),
    ("Concat", {"axis": 0}, [SYM("b"), I64(-1, 4)], ["b", -1, 4]),
    ("Slice", {}, [SYM("b", 2, 3, 4), I64(1), I64(2**62)], [2, 3, 4]),
    ("Slice", {}, [SYM("b", 2, 3, 4), I64(-1), I64(-5), I64(0), I64(-2)], [4, 2]),
    ("Cast", {"to": 7}, [SYM("b", 2)], ["b", 2]),
    ("Identity", {}, [SYM("b", 2)], ["b", 2]),
], ids=["gather", "gather_scalar_negative", "unsqueeze", "squeeze", "concat", "slice_tail", "slice_step",
        "cast", "identity"])
def test_symbolic_vectors_through_shape_ops(op, attrs, values, expected):
    # prepare
    names = tuple(f"i{k}" for k in range(len(values)))
    node = Node("n", op, names, ("y",), attrs, 13)
    types = [TensorType("int64", v.shape) for v in values]
    # act
    (result, ) = shape_values.evaluate(node, None, values, types, [TensorType("int64", ())])
    # assert
    assert result.tolist() == expected
    if not any(isinstance(v, str) for v in np.asarray(result, dtype=object).reshape(-1)):
        assert result.dtype == np.int64


def test_reshape_target_resolves_symbols_on_matching_axes_only():
    node = Node("r", "Reshape", ("x", "t"), ("y",))
    t = TensorType("float32", ("batch", 2, 3))
    assert shape_values.reshape_target(node, SYM("batch", -1), t).tolist() == [0, -1]
    assert shape_values.reshape_target(node, SYM(2, "batch", -1), t) is None
    assert shape_values.reshape_target(Node("r", "Reshape", ("x", "t"), ("y",), {"allowzero": 1}, 14),
                                       SYM("batch", -1), t) is None


def test_graphs_without_shape_subgraphs_build_as_before():
    nodes = [Node("r", "Reshape", ("x", "t"), ("y",))]
    inputs = [Value("x", TensorType("float32", ("batch", 2, 3)))]
    # a -1 the build cannot divide exactly stays a division, checked when it runs (as numpy does)
    assert build_graph("g", inputs, ["y"], nodes, {"t": I64(4, -1)}, 13).types["y"].shape == (4, "(6*batch//4)")
    with pytest.raises(ShapeInferenceError):
        build_graph("g", inputs, ["y"], nodes, {"t": I64(4, 5)}, 13)
    g = build_graph("g", inputs, ["y"], nodes, {"t": I64(0, 6)}, 13)
    assert g.types["y"].shape == ("batch", 6)
