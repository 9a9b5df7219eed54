"""Every op's batch rule is declared on its OpDef (the ``batch`` facet); privacy keeps the rules."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.errors import BatchMixingError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir.ops._contract import BATCH_KINDS, BatchRule, OpDef, per_element
from cuvil_edge.passes import FuseBias, optimize
from cuvil_edge.privacy import _batch_rules
from cuvil_edge.privacy.batch_independence import batch_axes, check_batch_independent

#: the rule kind each op had in the former op-type table of privacy/_batch_rules.py
EXPECTED = {
    **dict.fromkeys(("Cast", "Identity", "Dropout"), "same"),
    **dict.fromkeys(("Sum", "Clip"), "broadcast"),
    **dict.fromkeys(("Softmax", "LogSoftmax"), "softmax"),
    **dict.fromkeys(("ReduceSum", "ReduceMean", "ReduceMax"), "reduce"),
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), "reshaped"),
    **{k: k.lower() for k in ("Transpose", "Concat", "Split", "Slice", "Gather", "Pad", "Shape", "Resize", "Gemm")},
    **dict.fromkeys(("Expand", "ConstantOfShape"), "created"),
    **dict.fromkeys(
        (
            "Conv",
            "ConvTranspose",
            "ConvInteger",
            "QLinearConv",
            "CuvilFusedConv",
            "MaxPool",
            "AveragePool",
            "GlobalAveragePool",
            "GlobalMaxPool",
            "InstanceNormalization",
            "GroupNormalization",
        ),
        "windowed",
    ),
    "BatchNormalization": "batch_norm",
    "LayerNormalization": "layer_norm",
    **dict.fromkeys(("MatMul", "MatMulInteger", "QLinearMatMul"), "matmul"),
    "CuvilFusedGemm": "gemm",
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear"), "quantize"),
}


@pytest.mark.parametrize("op_type", sorted(EXPECTED))
def test_each_former_table_op_declares_its_rule(op_type):
    facet = ops.get(op_type).batch
    assert (facet if isinstance(facet, str) else facet.kind) == EXPECTED[op_type]
    assert _batch_rules.row_of(op_type) is not None


def test_no_op_type_table_remains():
    assert not hasattr(_batch_rules, "ROWS")
    assert _batch_rules.RULES.keys() == BATCH_KINDS.keys()


@pytest.mark.parametrize(
    "make",
    [
        lambda: BatchRule("rowwise"),
        lambda: BatchRule("windowed", sample_axis=(0,)),
        lambda: OpDef("Odd", (1,), infer=lambda *a: [], fn=lambda x: x, flops=per_element(0), batch="windowed"),
    ],
)
def test_unknown_kind_or_parameter_is_refused_when_the_row_is_made(make):
    with pytest.raises(ValueError, match="batch"):
        make()


# --- CuvilFusedMatMul: a Linear on a batch of sequences, as passes/fuse_bias.py makes it ------
def _linear(x: TensorType, *nodes: Node, inputs: tuple[Value, ...] = (), **inits: np.ndarray):
    return build_graph("linear", [Value("x", x), *inputs], ["y"], list(nodes), inits, 17)


def _weights(rng=None):
    rng = rng or np.random.default_rng(0)
    return rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)


def test_a_fused_linear_on_sequences_keeps_the_samples_apart():
    """MatMul then Add of the bias on (N, T, D), fused: the batch stays on axis 0, and the probe agrees."""
    w, b = _weights()
    nodes = (Node("mm", "MatMul", ("x", "w"), ("m",), {}, 17), Node("add", "Add", ("m", "b"), ("y",), {}, 17))
    fused = FuseBias()(_linear(TensorType("float32", ("batch", 5, 8)), *nodes, w=w, b=b)).graph
    assert [n.op_type for n in fused.nodes] == ["CuvilFusedMatMul"]
    assert batch_axes(fused)["y"] == 0
    check_batch_independent(fused)


def test_a_transformer_block_whose_linears_are_fused_passes():
    import torch
    import io
    import sys
    import warnings
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "architectures"))
    from torch_models import EncoderBlock

    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            EncoderBlock().eval(),
            (torch.randn(2, 6, 32),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )
    graph, _ = optimize(load_model(buffer.getvalue()))
    assert sum(n.op_type == "CuvilFusedMatMul" for n in graph.nodes) >= 3  # qkv, proj, the feed-forward
    check_batch_independent(graph)


@pytest.mark.parametrize("name", ["bias", "weight_columns"])
def test_a_fused_linear_whose_bias_or_weight_carries_samples_is_refused(name):
    """Only A carries samples: a bias from the samples adds each sample's values to every sample's
    row; a weight whose columns are the samples gives each sample the bias entry of its position."""
    w, b = _weights()
    if name == "bias":  # a static batch of 6: x and c each hold one sample per index of axis 0
        g = _linear(
            TensorType("float32", (6, 5, 8)),
            Node("mm", "CuvilFusedMatMul", ("x", "w", "c"), ("y",), {}, 17),
            inputs=(Value("c", TensorType("float32", (6,))),),
            w=w,
        )
        index, batched = 2, ["x", "c"]
    else:  # x, 6 samples of 8, transposed into the weight's 6 columns; a is a constant input
        g = _linear(
            TensorType("float32", (6, 8)),
            Node("t", "Transpose", ("x",), ("k",), {}, 17),
            Node("mm", "CuvilFusedMatMul", ("a", "k", "c"), ("y",), {}, 17),
            inputs=(Value("a", TensorType("float32", (5, 8))),),
            c=b,
        )
        index, batched = 1, ["x"]
    with pytest.raises(BatchMixingError, match=rf"'mm' \(CuvilFusedMatMul.* its input {index} .* a weight or setting"):
        batch_axes(g, batch_axis_inputs=batched)
