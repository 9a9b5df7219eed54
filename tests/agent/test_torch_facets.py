"""How an op trains is declared on its OpDef: its torch lowering (``torch``), the build-time
refusals of that lowering (``torch_check``) and the torch layer it trains as (``trainable``). The
agent keeps no table of op types: an op declared in a module of its own (written by this test)
trains as a layer from its row alone."""

from __future__ import annotations

import importlib.util
import textwrap

import numpy as np
import onnx
import pytest
import torch

from cuvil_edge.agent import torch_functions, torch_model
from cuvil_edge.agent.torch_model import IRTorchModule
from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import ops
from cuvil_edge.ir.ops._contract import TRAINABLE_KINDS, OpDef

#: The ops the agent's own table lowered before the lowerings moved onto the rows.
LOWERED = (
    "Swish PRelu Identity IsInf LRN Clip Dropout Div Max Min Sum Mean Mod MatMul Gemm CuvilFusedGemm "
    "CuvilFusedMatMul Conv CuvilFusedConv MaxPool AveragePool GlobalAveragePool GlobalMaxPool "
    "BatchNormalization InstanceNormalization GroupNormalization LayerNormalization Softmax LogSoftmax "
    "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceSumSquare ReduceLogSumExp "
    "ReduceLogSum Flatten Reshape Shape Cast CastLike ConstantOfShape Split Tile Range Transpose Unsqueeze "
    "Squeeze Slice Gather Concat Expand Pad QuantizeLinear DequantizeLinear Einsum"
).split()

TRAINABLE = {
    "Conv": "conv",
    "CuvilFusedConv": "conv",
    "Gemm": "gemm",
    "CuvilFusedGemm": "gemm",
    "MatMul": "matmul",
    "CuvilFusedMatMul": "matmul",
    "InstanceNormalization": "instance_norm",
    "GroupNormalization": "group_norm",
    "LayerNormalization": "layer_norm",
}


def test_every_lowering_and_layer_is_declared_on_its_row_and_the_agent_keeps_no_op_table():
    registry = ops.registry()
    assert [op for op in LOWERED if registry[op].torch is None] == []
    assert {name: op.trainable for name, op in registry.items() if op.trainable} == TRAINABLE
    assert torch_functions.trainable_ops() == set(TRAINABLE)
    for table in ("FUNCTIONS", "TRAINABLE_OPS"):
        assert not hasattr(torch_functions, table) and not hasattr(torch_model, table)
    assert set(torch_model._LAYERS) == set(TRAINABLE_KINDS)  # keyed by kind, one builder each


def test_a_trainable_kind_outside_the_vocabulary_is_refused_when_the_row_is_made():
    with pytest.raises(ValueError, match="trainable facet 'dense'"):
        OpDef("CuvilBad", (1,), lambda node, inputs: inputs, lambda x: x, lambda *a: 0, trainable="dense")


DENSE = '''
from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir.ops import matmul
from cuvil_edge.ir.ops._contract import OpDef

_MATMUL = next(op for op in matmul.OPS if op.OP_TYPE == "MatMul")


def _check(node):
    if node.attr("flavour", "plain") != "plain":
        raise UnsupportedAttributeError(f"{node.describe()}: flavour has no training lowering")


OPS = (
    OpDef(
        "CuvilDense",
        (1,),
        infer=_MATMUL.infer,
        fn=_MATMUL.fn,
        flops=_MATMUL.flops,
        torch=lambda t, node, a, b: a @ b,
        torch_check=_check,
        {facets}
    ),
)
'''

TEXT = """
g (float[N, 3] x) => (float[N, 2] y) <float[3, 2] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}> {
    y = MatMul(x, w)
}"""


def _dense(tmp_path, monkeypatch, facets: str, **attrs):
    """The graph x @ w with its MatMul made a CuvilDense declared from a module of its own."""
    from cuvil_edge.frontend import load_model
    from cuvil_edge.ir.graph import Node
    from cuvil_edge.passes._infra import rebuild

    path = tmp_path / f"dense_{abs(hash(facets))}.py"
    path.write_text(textwrap.dedent(DENSE).replace("{facets}", facets))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (op,) = module.OPS
    monkeypatch.setitem(ops.registry(), op.OP_TYPE, op)
    graph = load_model(onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : 13]>\n{TEXT}'))
    nodes = [Node(n.name, "CuvilDense", n.inputs, n.outputs, attrs, 1) for n in graph.nodes]
    return rebuild(graph, nodes)


def test_an_op_declared_trainable_in_a_module_of_its_own_trains_as_a_layer(tmp_path, monkeypatch):
    graph = _dense(tmp_path, monkeypatch, 'trainable="matmul",')
    model = IRTorchModule(graph)
    (layer,) = model.layers.values()
    assert isinstance(layer, torch.nn.Linear)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    out = model(x)
    np.testing.assert_allclose(out.detach().numpy(), x.numpy() @ graph.initializers["w"], rtol=1e-5)
    out.sum().backward()
    assert layer.weight.grad is not None and float(layer.weight.grad.abs().sum()) > 0
    np.testing.assert_allclose(model.ir_weights()["w"], graph.initializers["w"])


def test_without_the_trainable_facet_the_op_runs_as_a_function_with_its_weight_constant(tmp_path, monkeypatch):
    graph = _dense(tmp_path, monkeypatch, "")
    model = IRTorchModule(graph)
    assert len(model.layers) == 0 and model.ir_weights() == {}
    x = torch.ones((2, 3))
    np.testing.assert_allclose(model(x).numpy(), x.numpy() @ graph.initializers["w"], rtol=1e-5)


def test_the_torch_check_facet_refuses_the_node_when_the_module_is_built(tmp_path, monkeypatch):
    graph = _dense(tmp_path, monkeypatch, 'trainable="matmul",', flavour="spicy")
    with pytest.raises(UnsupportedAttributeError, match="flavour has no training lowering"):
        IRTorchModule(graph)
