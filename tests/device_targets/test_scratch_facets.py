"""The memory plan reads each op's scratch from its ``scratch`` facet and from nowhere else: every
registered op declares one but the few listed here, and memory_plan.py keeps no table of op types
(which ops alias their input is their ``view`` facet)."""

from __future__ import annotations

from collections.abc import Mapping, Set

import numpy as np
import pytest

from cuvil_edge.device_targets import memory_plan
from cuvil_edge.device_targets.memory_plan import Site, plan_memory
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph

#: Ops whose scratch the plan estimates (one output-sized temporary, named in the plan's report):
#: no rule has been read off their kernels and checked against tracemalloc yet, so declaring one
#: would be a guess. Strict: an op that gains a facet fails the test until its name is removed
#: here, and a new op without a facet fails it until it declares one (or is listed, with reason).
ESTIMATED = frozenset(
    {
        # elementwise and trigonometric ops of several numpy calls, never measured
        *("Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cosh", "Sinh", "Tan"),
        *("BitCast", "BitShift", "Celu", "Elu", "HardSigmoid", "IsInf", "IsNaN", "LeakyRelu", "Mish"),
        *("Selu", "Shrink", "Softplus", "Softsign", "ThresholdedRelu", "Max", "Min", "Mean", "Sum"),
        # reductions and scans besides ReduceMax/Mean/Sum
        *("ArgMax", "ArgMin", "CumProd", "CumSum", "Hardmax", "TopK"),
        *("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMin", "ReduceProd", "ReduceSumSquare"),
        # normalizations besides Batch/Instance/Layer/LRN
        *("GroupNormalization", "LpNormalization", "MeanVarianceNormalization", "RMSNormalization"),
        # indexing, scatter and data movement
        *("Compress", "GatherElements", "GatherND", "NonZero", "OneHot", "Pad", "ReverseSequence", "Trilu"),
        *("Scatter", "ScatterElements", "ScatterND", "TensorScatter", "Unique", "CenterCropPad"),
        *("DepthToSpace", "SpaceToDepth", "EyeLike", "Range"),
        # window, sampling and signal kernels besides Conv, ConvTranspose and the pools
        *("Col2Im", "DeformConv", "LpPool", "MaxUnpool", "CausalConvWithState", "CuvilDwPw"),
        *("AffineGrid", "GridSample", "RoiAlign", "NonMaxSuppression"),
        *("DFT", "STFT", "BlackmanWindow", "HammingWindow", "HannWindow", "MelWeightMatrix"),
        # recurrent, attention and linear algebra
        *("GRU", "LSTM", "RNN", "Attention", "LinearAttention", "RotaryEmbedding", "SwiGLU", "Det", "Einsum"),
        # quantized kernels
        *("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "CuvilQLinearAdd"),
        *("DequantizeLinear", "DynamicQuantizeLinear", "QuantizeLinear"),
        # training losses and text
        *("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "TfIdfVectorizer"),
    }
)


def test_every_op_declares_its_scratch_but_the_estimated_ones():
    undeclared = {name for name, op in ops.registry().items() if op.scratch is None}
    assert undeclared - ESTIMATED == set(), "declare a scratch facet (ir/ops/_scratch.py) on these ops"
    assert ESTIMATED - undeclared == set(), "these ops declare a scratch facet now: remove them from ESTIMATED"


def test_memory_plan_keeps_no_table_of_op_types():
    names = set(ops.registry())
    tables = {
        key
        for key, value in vars(memory_plan).items()
        if isinstance(value, (Mapping, Set)) and names & {k for k in value if isinstance(k, str)}
    }
    assert tables == set()


def _window_graph():
    """Conv (padded, biased), MaxPool, Softmax: ops with rules of their own; Elu: an estimated op."""
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((8, 3, 3, 3)).astype(np.float32), np.zeros(8, np.float32)
    nodes = [
        Node("conv", "Conv", ("x", "w", "b"), ("c",), {"pads": (1, 1, 1, 1)}),
        Node("pool", "MaxPool", ("c",), ("p",), {"kernel_shape": (2, 2), "strides": (2, 2)}),
        Node("softmax", "Softmax", ("p",), ("s",), {"axis": 1}),
        Node("elu", "Elu", ("s",), ("y",)),
    ]
    inputs = [Value("x", TensorType("float32", ("batch", 3, 16, 16)))]
    return build_graph("window", inputs, ["y"], nodes, {"w": w, "b": b}, 17)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("target", ["x86-64", "rpi4"])
def test_each_steps_scratch_is_its_ops_facet(target, native):
    graph = _window_graph()
    plan = plan_memory(graph, target, batch=4, native=native)
    large = not plan.low_memory
    types = {name: t.bind({"batch": 4}) for name, t in graph.types.items()}
    for node, step in zip(graph.nodes, plan.steps, strict=False):
        op = ops.registry()[node.op_type]
        site = Site(op.attrs(node), tuple(types[i] for i in node.inputs), tuple(types[o] for o in node.outputs),
                    large, native)
        if node.op_type == "Elu":
            assert step.estimated and step.scratch_bytes == site.out
        else:
            assert op.scratch is not None and not step.estimated, node.op_type
            assert step.scratch_bytes == max(0, op.scratch(site)), node.op_type
    assert plan.steps[0].scratch_bytes > 0  # the conv's padded copy and bias pass: a rule that counts
    assert "scratch estimated (no scratch facet): Elu" in plan.describe()
