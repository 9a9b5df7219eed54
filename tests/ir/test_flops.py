"""Exact FLOP counts worked out by hand (a multiply-add counts 2)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node, Value, TensorType
from cuvil_edge.ir.infer import build_graph


def _w(*shape):
    return np.zeros(shape, np.float32)


CASES = [
    # out (1,4,5,5) = 100 outputs x (2 ch x 9 taps x 2) + 100 bias adds
    ("conv_pads_bias", "Conv", (1, 2, 5, 5), [_w(4, 2, 3, 3), _w(4)], {"pads": (1, 1, 1, 1)}, 100 * 36 + 100),
    # group 2: out (1,6,4,4) = 96 outputs x (2 ch per group x 9 taps x 2)
    ("conv_group2", "Conv", (1, 4, 6, 6), [_w(6, 2, 3, 3)], {"group": 2}, 96 * 36),
    # stride 2, 1x1: out (2,3,3,3) = 54 outputs x (5 ch x 1 tap x 2)
    ("conv_1x1_stride2", "Conv", (2, 5, 5, 5), [_w(3, 5, 1, 1)], {"strides": (2, 2)}, 54 * 10),
    # (8x4) @ (4x3): 2*8*4*3 = 192, + 24 bias adds
    ("gemm_bias", "Gemm", (8, 4), [_w(4, 3), _w(3)], {}, 192 + 24),
    # transB, no C: 2*8*4*3
    ("gemm_transB", "Gemm", (8, 4), [_w(3, 4)], {"transB": 1}, 192),
    # batch 2 of (3x4) @ (4x5): 2*2*3*4*5
    ("matmul_batched", "MatMul", (2, 3, 4), [_w(4, 5)], {}, 240),
]


@pytest.mark.parametrize("name,op,x_shape,weights,attrs,expected", CASES, ids=[c[0] for c in CASES])
def test_flops_by_hand(name, op, x_shape, weights, attrs, expected):
    # prepare
    inits = {f"w{i}": w for i, w in enumerate(weights)}
    node = Node("n0", op, ("x", *inits), ("y",), attrs)
    graph = build_graph(name, [Value("x", TensorType("float32", x_shape))], ["y"], [node], inits, 13)
    types = [graph.types[i] for i in node.inputs]
    # act
    flops = ops.get(op).flops(node, types, [graph.types["y"]])
    # assert
    assert flops == expected
