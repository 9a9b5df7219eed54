"""Every name a pass creates is one the package accepts (PACKAGE_SPEC §1.3).

torch names nodes and values like paths (``/Reshape``, ``/conv/Conv``, ``/Constant_output_0``);
a pass that made an initializer name from one of those (``/Reshape_const1``) produced a graph that
optimized but could not be packaged.  The rule in :mod:`cuvil_edge.passes.naming` is a copy of the
package reader's (a layer above the passes), so the first tests hold the two to one table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_edge.errors import BadNameError, PackageFormatError, PassError
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import encode_payload
from cuvil_edge.ir_serialize._canonical import check_graph_name, check_tensor_name
from cuvil_edge.passes import ConstantFolding, FoldBatchNorm, FuseBias, Pass, PassResult, optimize
from cuvil_edge.passes._infra import rebuild
from cuvil_edge.passes.naming import (
    fresh_tensor_name, graph_stem, is_graph_name, is_tensor_name, tensor_stem,
)
from cuvil_edge.passes.quantize import store_fp16
from pass_helpers import assert_same_outputs

NAMES = ["w", "conv.weight", "a/b", "a//b", "a/", "/w", "/conv/weight", "a/../b", "..", "../w", "...", "a..b",
         "a\\b", "C:w", "x:0", "1:w", "é", "\x00a", "a\x1fb", "a\x7fb", "a\x85b", "a\u202eb", "a\u2066b", "a\u2028b",
         "\ufeffa", "", "a" * 4096, "a" * 4097]


def _accepts(check, name: str) -> bool:
    try:
        check(name, "name")
    except (BadNameError, PackageFormatError):
        return False
    return True


@pytest.mark.parametrize("name", NAMES, ids=ascii)
def test_the_rule_is_the_package_readers(name):
    assert is_tensor_name(name) == _accepts(check_tensor_name, name)
    assert is_graph_name(name) == _accepts(check_graph_name, name)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_stems_of_any_text_are_accepted_and_valid_names_kept(name):
    assert _accepts(check_tensor_name, tensor_stem(name)) and _accepts(check_graph_name, graph_stem(name))
    if is_tensor_name(name):
        assert tensor_stem(name) == name
    if is_graph_name(name):
        assert graph_stem(name) == name


@pytest.mark.parametrize("base, taken, want", [
    ("/Reshape_const1", set(), "Reshape_const1"),
    ("/Reshape_const1", {"Reshape_const1"}, "Reshape_const1_1"),
    ("/conv/Conv_bias", {"conv/Conv_bias", "conv/Conv_bias_1"}, "conv/Conv_bias_2"),
    ("../../etc/passwd", set(), "etc/passwd"),
    ("C:w.fp16", set(), "_C:w.fp16"),
    ("/", set(), "tensor"),
])
def test_fresh_tensor_names_are_valid_and_unused(base, taken, want):
    before = set(taken)
    assert fresh_tensor_name(taken, base) == want
    assert taken == before | {want}


# --- each pass that creates initializers, on torch-style names -----------------------------------
def _value(name, *shape):
    return Value(name, TensorType("float32", shape))


def _flatten_graph():
    """x.reshape(x.shape[0], -1) as torch writes it: the shape is computed from Shape(x)."""
    nodes = [Node("/Shape", "Shape", ("x",), ("/Shape_output_0",)),
             Node("/Gather", "Gather", ("/Shape_output_0", "zero"), ("/Gather_output_0",), {"axis": 0}),
             Node("/Unsqueeze", "Unsqueeze", ("/Gather_output_0", "axes"), ("/Unsqueeze_output_0",)),
             Node("/Concat", "Concat", ("/Unsqueeze_output_0", "rest"), ("/Concat_output_0",), {"axis": 0}),
             Node("/Reshape", "Reshape", ("x", "/Concat_output_0"), ("/Reshape_output_0",)),
             Node("/fc/Gemm", "Gemm", ("/Reshape_output_0", "fc.weight"), ("y",), {"transB": 1})]
    inits = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64), "rest": np.array([-1], np.int64),
             "fc.weight": np.random.default_rng(0).standard_normal((3, 12)).astype(np.float32)}
    return build_graph("flatten", [_value("x", "batch", 3, 4)], ["y"], nodes, inits, 13)


def _folded_constant_graph():
    """A value computed from constants only (folded into an initializer), named like torch does."""
    nodes = [Node("/Add", "Add", ("a", "b"), ("/Add_output_0",)), Node("/Mul", "Mul", ("x", "/Add_output_0"), ("y",))]
    inits = {"a": np.ones(4, np.float32), "b": np.full(4, 2.0, np.float32)}
    return build_graph("folded", [_value("x", "batch", 4)], ["y"], nodes, inits, 13)


def _conv_bn_graph():
    rng = np.random.default_rng(1)
    nodes = [Node("/conv/Conv", "Conv", ("x", "conv.weight"), ("/conv/Conv_output_0",), {"pads": [1, 1, 1, 1]}),
             Node("/bn/BatchNormalization", "BatchNormalization",
                  ("/conv/Conv_output_0", "bn.weight", "bn.bias", "bn.mean", "bn.var"), ("y",), {"epsilon": 1e-5})]
    inits = {"conv.weight": rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
             "bn.weight": rng.random(4).astype(np.float32) + 0.5, "bn.bias": rng.standard_normal(4).astype(np.float32),
             "bn.mean": rng.standard_normal(4).astype(np.float32), "bn.var": rng.random(4).astype(np.float32) + 0.5}
    return build_graph("conv_bn", [_value("x", "batch", 2, 5, 5)], ["y"], nodes, inits, 13)


def _matmul_add_graph():
    rng = np.random.default_rng(2)
    nodes = [Node("/fc/MatMul", "MatMul", ("x", "fc.weight"), ("/fc/MatMul_output_0",)),
             Node("/fc/Add", "Add", ("/fc/MatMul_output_0", "fc.bias"), ("y",))]
    inits = {"fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
             "fc.bias": rng.standard_normal(3).astype(np.float32)}
    return build_graph("fc", [_value("x", "batch", 4)], ["y"], nodes, inits, 13)


CASES = {
    "fold-constants: Reshape's symbolic shape": (_flatten_graph, [ConstantFolding()]),
    "fold-constants: a folded value": (_folded_constant_graph, [ConstantFolding()]),
    "fold-batchnorm": (_conv_bn_graph, [FoldBatchNorm()]),
    "fuse-bias": (_matmul_add_graph, [FuseBias()]),
    "optimize: flatten": (_flatten_graph, None),
    "optimize: conv + bn": (_conv_bn_graph, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_on_torch_names_creates_only_names_the_package_accepts(case):
    make, passes = CASES[case]
    before = make()
    after, report = optimize(before, passes)
    assert any(r.modified for r in report.runs), "the pass must have rewritten something"
    new = set(after.initializers) - set(before.initializers)
    assert new and all(is_tensor_name(n) for n in new), sorted(new)
    encode_payload(after)  # the writer applies the reader's checks
    assert_same_outputs(before, after)


def test_store_fp16_names_its_half_weights_validly():
    graph = build_graph("w", [_value("x", "batch", 8)], ["y"], [Node("/fc/MatMul", "MatMul", ("x", "C:w"), ("y",))],
                        {"C:w": np.ones((8, 4), np.float32)}, 13)
    half = store_fp16(graph)
    assert [n for n in half.initializers if n not in graph.initializers] == ["_C:w.fp16"]


class _PathNamedConstant(Pass):
    """A pass that names a new initializer like a path, as fold-constants used to."""

    name = "path-named-constant"

    def rewrite(self, graph):
        inits = dict(graph.initializers)
        inits["/Reshape_const1"] = np.ones(4, np.float32)
        node = Node("/Add", "Add", ("x", "/Reshape_const1"), ("y",), {}, 13)
        return PassResult(rebuild(graph, [node], inits), True, ["added a constant"])


def test_the_manager_refuses_a_pass_that_creates_a_refused_name():
    graph = build_graph("g", [_value("x", "batch", 4)], ["y"], [Node("/Relu", "Relu", ("x",), ("y",))], {}, 13)
    with pytest.raises(PassError, match=r"path-named-constant.*'/Reshape_const1'"):
        optimize(graph, [_PathNamedConstant()])
