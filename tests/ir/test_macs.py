"""Multiply-accumulate counts worked out by hand (bias adds and activations count 0)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.cost import node_macs, total_macs
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph


def _w(*shape):
    return np.zeros(shape, np.float32)


def test_macs_by_hand():
    # prepare: conv (batch,2,5,5) * W(4,2,3,3) pads 1 -> (batch,4,5,5): 100 outputs x 18 taps = 1800 per sample;
    # relu 0; fused conv W(3,4,1,1) -> (batch,3,5,5): 75 x 4 = 300; flatten; gemm (batch,75)@(75,2): 150;
    # matmul (batch,2)@(2,6): 12
    nodes = [
        Node("conv", "Conv", ("x", "w1", "b1"), ("c",), {"pads": (1, 1, 1, 1)}),
        Node("relu", "Relu", ("c",), ("r",)),
        Node("fused", "CuvilFusedConv", ("r", "w2"), ("f",), {"activation": "relu6"}),
        Node("flat", "Flatten", ("f",), ("v",)),
        Node("gemm", "Gemm", ("v", "w3", "b3"), ("g",)),
        Node("mm", "MatMul", ("g", "w4"), ("y",)),
    ]
    inits = {"w1": _w(4, 2, 3, 3), "b1": _w(4), "w2": _w(3, 4, 1, 1), "w3": _w(75, 2), "b3": _w(2), "w4": _w(2, 6)}
    graph = build_graph("g", [Value("x", TensorType("float32", ("batch", 2, 5, 5)))], ["y"], nodes, inits, 13)
    # act
    per_node = node_macs(graph)
    # assert
    assert per_node == {"conv": 1800, "relu": 0, "fused": 300, "flat": 0, "gemm": 150, "mm": 12}
    assert total_macs(graph, {"batch": 4}) == 4 * (1800 + 300 + 150 + 12)
