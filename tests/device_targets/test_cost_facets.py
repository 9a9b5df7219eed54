"""The cost model reads what it knows of an op from the op's OpDef (its ``cost_kind``,
``cost_native``, ``transcendental`` and ``view`` facets) and from nowhere else: its modules name no
registered op, and every op declaring a facet is costed as that facet's kernel."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
from onnx import helper, numpy_helper, shape_inference

from cuvil_edge.device_targets import cost_int8, cost_kernels, cost_model, cost_work
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import ops


def _named_ops(source: str) -> set[str]:
    """Registered op types written as string literals in ``source`` (docstrings aside)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    literals = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }
    return literals & set(ops.registry())


@pytest.mark.parametrize("module", [cost_model, cost_work, cost_int8, cost_kernels], ids=lambda m: m.__name__)
def test_the_cost_modules_name_no_op(module):
    assert _named_ops(inspect.getsource(module)) == set()


def test_the_scan_sees_an_op_named_in_code_and_not_one_in_a_docstring():
    source = 'TAPS = frozenset({"MaxPool"})\n\n\ndef f():\n    """Conv is costed elsewhere."""\n'
    assert _named_ops(source) == {"MaxPool"}


def _single(op_type: str, shape, consts=(), **attrs):
    inits = [numpy_helper.from_array(c, f"c{i}") for i, c in enumerate(consts)]
    node = helper.make_node(op_type, ["x", *(t.name for t in inits)], ["y"], name="n", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, list(shape))],
        [helper.make_tensor_value_info("y", 1, None)],
        inits,
    )
    return load_model(
        shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    )


#: facet -> the kernel label the cost model gives a node of it (x86-64: native kernels built)
CASES = {
    "reduce": ("ReduceMax", (2, 8, 4), (), {"axes": [1]}),
    "gather": ("Gather", (8, 4), (np.array([1, 0], np.int64),), {"axis": 0}),
    "transpose": ("Transpose", (2, 8, 4), (), {"perm": [0, 2, 1]}),
    "native": ("Sigmoid", (2, 8, 4), (), {}),
    "view": ("Flatten", (2, 8, 4), (), {}),
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_each_facet_gives_its_kernel_label(label):
    op_type, shape, consts, attrs = CASES[label]
    (node,) = predict(_single(op_type, shape, consts, **attrs), "x86-64", batch=1).nodes
    assert node.kernel == label


# ---------------------------------------------------------------- calibration probes


def _measured_kinds(target: str) -> dict[str, str]:
    """Kernel kind -> the op whose probe calibrate times for it on ``target`` (first in name order,
    among the probes that list the kind or list none)."""
    from cuvil_edge.device_targets import calibrate_probes

    kinds: dict[str, str] = {}
    for op, probe in calibrate_probes.kind_probes():
        kind = predict(calibrate_probes.chain(op, probe, 2), target).nodes[0].kernel
        if not probe.kinds or kind in probe.kinds:
            kinds.setdefault(kind, op)
    return kinds


def test_calibrate_times_each_kernel_kind_by_a_probe_its_op_declares():
    assert _measured_kinds("x86-64") == {
        "conv native gemm": "Conv",  # its 3x3 and 1x1 probes alike, in the C GEMM
        "conv depthwise native": "Conv",
        "gather": "Gather",
        "gemm": "Gemm",
        "normalization": "InstanceNormalization",
        "native layer norm": "LayerNormalization",
        "gemm rows collapsed": "MatMul",
        "view": "Reshape",
        "native": "Softmax",
    }
    # MaxPool's probe is for the numpy window loop, which runs without the C kernels; and there
    # LayerNormalization's probe (declared for its C kernel) times nothing
    numpy_only = _measured_kinds("ascend-310")
    assert numpy_only["numpy window taps"] == "MaxPool" and numpy_only["normalization"] == "InstanceNormalization"
    assert "native" not in numpy_only and numpy_only["conv im2col"] == "Conv"


def test_a_probe_declared_on_a_new_row_is_calibrated(monkeypatch):
    import dataclasses

    from cuvil_edge.device_targets import calibrate_probes
    from cuvil_edge.ir.ops._contract import Probe

    relu = dataclasses.replace(ops.get("Relu"), probes=(Probe((4, 16)),))
    monkeypatch.setitem(ops.registry(), "Relu", relu)
    assert ("Relu", relu.probes[0]) in calibrate_probes.kind_probes()
    mixed = calibrate_probes.mixed(2)
    assert sum(n.op_type == "Relu" for n in mixed.nodes) == 2
