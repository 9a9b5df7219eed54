"""Adding an elementwise op is one row in one file: an op declared in a module of its own (outside
cuvil_edge, written by this test) is interpreted, compiled, costed, planned, allowed for DP
training and trained in torch from that row alone; the facets it declares are what each layer
reads, and an undeclared facet leaves the op refused or estimated exactly as before."""

from __future__ import annotations

import importlib.util
import textwrap

import numpy as np
import onnx
import pytest
import torch

from cuvil_edge.device_targets import build
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.device_targets.memory_plan import plan_memory
from cuvil_edge.errors import BatchMixingError, UnsupportedOpError
from cuvil_edge.ir import interpreter, ops
from cuvil_edge.ir.ops._contract import OpDef

CUBE = '''
import numpy as np

from cuvil_edge.ir.ops._contract import OpDef, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, infer_unary


def k_cube(x):
    return x * x * x


def _infer(node, inputs):
    return infer_unary(node, inputs, ((1, FLOATS),))


OPS = (
    OpDef("CuvilCube", (1,), _infer, k_cube, per_element(2), {facets}),
)
'''

FACETS = ('batch="same", scratch=no_scratch, transcendental=True, '
          "torch=lambda t, node, x: x * x * x")

TEXT = """
g (float[N, 3] x) => (float[N, 3] y) {
    h = Relu(x)
    y = Neg(h)
}"""


def _declare(tmp_path, monkeypatch, facets: str) -> OpDef:
    path = tmp_path / f"cube_{abs(hash(facets))}.py"
    path.write_text(textwrap.dedent(CUBE).replace("{facets}", facets))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (op,) = module.OPS
    monkeypatch.setitem(ops.registry(), op.OP_TYPE, op)
    return op


def graph_from_text(text):
    """The model imported (onnx.checker knows no CuvilCube, so it is written as Neg), then its Neg
    node made a CuvilCube: the graph is rebuilt and type-checked with the new op's inference."""
    from cuvil_edge.frontend import load_model
    from cuvil_edge.ir.graph import Node
    from cuvil_edge.passes._infra import rebuild

    graph = load_model(onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : 13]>\n{text}'))
    nodes = [Node(n.name, "CuvilCube", n.inputs, n.outputs, {}, 1) if n.op_type == "Neg" else n for n in graph.nodes]
    return rebuild(graph, nodes)


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "fa" * 32


def test_a_new_elementwise_op_runs_everywhere_from_its_one_row(tmp_path, monkeypatch):
    from cuvil_edge.agent.torch_model import IRTorchModule
    from cuvil_edge.privacy.batch_independence import check_batch_independent

    _declare(tmp_path, monkeypatch, FACETS)
    graph = graph_from_text(TEXT)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    want = np.maximum(x, 0) ** 3
    # interpreted and compiled
    np.testing.assert_allclose(interpreter.run(graph, {"x": x})["y"], want, rtol=1e-6)
    module = build(_Payload(graph), "x86-64", cache_dir=tmp_path / "cache")
    assert "def k_cube" in module.source
    np.testing.assert_allclose(module.run({"x": x})["y"], want, rtol=1e-6)
    # costed: its transcendental facet is counted
    cube = next(n for n in predict(graph, "x86-64", batch=4).nodes if n.op_type == "CuvilCube")
    # planned: its scratch facet is read, not estimated
    plan = plan_memory(graph, "x86-64", batch=4)
    step = next(s for s in plan.steps if s.op_type == "CuvilCube")
    assert step.scratch_bytes == 0 and not step.estimated
    # allowed for DP-SGD, and trained: the torch lowering computes the same and has a gradient
    check_batch_independent(graph)
    xt = torch.from_numpy(x).requires_grad_(True)
    out = IRTorchModule(graph)(xt)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5)
    out.sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), 3 * np.maximum(x, 0) ** 2, rtol=1e-5)
    # the transcendental facet is what the cost model read
    monkeypatch.setitem(ops.registry(), "CuvilCube", _declare(tmp_path, monkeypatch, 'batch="same"'))
    plain = next(n for n in predict(graph, "x86-64", batch=4).nodes if n.op_type == "CuvilCube")
    assert cube.seconds > plain.seconds


def test_without_facets_the_op_is_refused_for_training_and_its_scratch_estimated(tmp_path, monkeypatch):
    from cuvil_edge.agent.torch_model import IRTorchModule
    from cuvil_edge.privacy.batch_independence import check_batch_independent

    _declare(tmp_path, monkeypatch, "")
    graph = graph_from_text(TEXT)
    with pytest.raises(BatchMixingError, match="CuvilCube"):
        check_batch_independent(graph)
    with pytest.raises(UnsupportedOpError, match="no training lowering"):
        IRTorchModule(graph)
    step = next(s for s in plan_memory(graph, "x86-64", batch=4).steps if s.op_type == "CuvilCube")
    assert step.estimated


def test_a_batch_facet_outside_the_vocabulary_is_refused_when_the_row_is_made():
    with pytest.raises(ValueError, match="batch facet 'rows'"):
        OpDef("CuvilBad", (1,), lambda node, inputs: inputs, lambda x: x, lambda *a: 0, batch="rows")


def test_every_elementwise_unary_op_declares_its_batch_rule_and_torch_lowering():
    from cuvil_edge.ir.ops import activation, trigonometric, unary

    elementwise = [op for op in unary.OPS + activation.OPS + trigonometric.OPS if op.batch == "same"]
    assert len(elementwise) > 30
    missing = [op.OP_TYPE for op in elementwise if op.torch is None and op.OP_TYPE not in ("IsInf",)]
    assert missing == []


def test_op_rows_name_their_fields():
    """An OpDef row gives its op type and versions, then every field by keyword: eight positional
    arguments read by position are how a kernel ends up in the flops slot."""
    import ast
    from pathlib import Path

    import cuvil_edge.ir.ops as package

    positional = []
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "OpDef" and len(node.args) > 2:
                positional.append(f"{path.name}:{node.lineno}")
    assert positional == []


@pytest.mark.parametrize(
    ("facets", "target", "kernel"),
    [
        ('batch="same"', "x86-64", "elementwise"),  # no cost facet: one numpy pass
        ('cost_native="map"', "x86-64", "native"),  # its C kernel, where the target builds them
        ('cost_native="map"', "ascend-310", "elementwise"),  # ... and not where it does not
        ('cost_kind="reduce"', "x86-64", "reduce"),
        ("view=True", "x86-64", "view"),
    ],
)
def test_the_cost_model_reads_a_new_op_s_cost_facets(tmp_path, monkeypatch, facets, target, kernel):
    _declare(tmp_path, monkeypatch, facets)
    graph = graph_from_text(TEXT)
    cube = next(n for n in predict(graph, target, batch=4).nodes if n.op_type == "CuvilCube")
    assert cube.kernel == kernel
    if kernel == "view":  # nothing moves, and the plan aliases its output to its input's buffer
        assert cube.bytes_read == cube.bytes_written == 0
        aliased = plan_memory(graph, target, batch=4).peak_bytes
        _declare(tmp_path, monkeypatch, "")
        assert plan_memory(graph, target, batch=4).peak_bytes == aliased + 4 * 3 * 4  # y's own buffer
