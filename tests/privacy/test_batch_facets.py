"""Every op's batch rule is declared on its OpDef (the ``batch`` facet); privacy keeps the rules."""

from __future__ import annotations

import pytest

from cuvil_edge.ir import ops
from cuvil_edge.ir.ops._contract import BATCH_KINDS, BatchRule, OpDef, per_element
from cuvil_edge.privacy import _batch_rules

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
        ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "CuvilFusedConv", "MaxPool", "AveragePool",
         "GlobalAveragePool", "GlobalMaxPool", "InstanceNormalization", "GroupNormalization"),
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


@pytest.mark.parametrize("make", [
    lambda: BatchRule("rowwise"),
    lambda: BatchRule("windowed", sample_axis=(0,)),
    lambda: OpDef("Odd", (1,), infer=lambda *a: [], fn=lambda x: x, flops=per_element(0), batch="windowed"),
])
def test_unknown_kind_or_parameter_is_refused_when_the_row_is_made(make):
    with pytest.raises(ValueError, match="batch"):
        make()
