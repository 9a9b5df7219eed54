"""The graphs `cuvil-edge calibrate` builds and times (:mod:`calibrate`).

Per kernel kind, the probes the ops declare (their ``probes`` facet): a chain of the op on a small
float32 input, the chains timed one by one and interleaved in one module; and the fixed graphs of
its other measurements (a chain of typical small calls for per-node overhead, a depthwise
convolution for the native kernels' rate).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from cuvil_edge.ir import ops
from cuvil_edge.ir.ops._contract import Probe


def kind_probes() -> tuple[tuple[str, Probe], ...]:
    """Every op's calibration probes (its ``probes`` facet), ops in name order: (op type, probe).
    The kind each probe measures is what cost_model labels its node on the spec being written."""
    return tuple((op_type, probe) for op_type, op in sorted(ops.registry().items()) for probe in op.probes)


def chain_parts(op: str, probe: Probe, count: int, prefix: str = ""):
    """(nodes, initializers, input info, output info) of ``count`` chained ``op`` nodes."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(c, f"{prefix}c{i}") for i, c in enumerate(probe.consts())]
    x, y = f"{prefix}x", "y" if not prefix else f"{prefix}y"
    nodes = [
        helper.make_node(
            op,
            [x if i == 0 else f"{prefix}v{i}", *(t.name for t in inits)],
            [y if i == count - 1 else f"{prefix}v{i + 1}"],
            **probe.attrs,
        )
        for i in range(count)
    ]
    info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, list(probe.shape))  # noqa: E731
    return nodes, inits, info(x), info(y)


def chain(op: str, probe: Probe, count: int):
    """``count`` ``op`` nodes, each fed the previous one's output (same shape) and the probe's constants."""
    from onnx import helper

    nodes, inits, x, y = chain_parts(op, probe, count)
    return graph_of(helper.make_graph(nodes, f"probe_{op.lower()}", [x], [y], inits))


def mixed(count: int):
    """Every probe's chain in one module, their calls interleaved (one of each kind in turn), as a
    real model's calls are: caches and branch predictors do not stay warm for one kernel."""
    from onnx import helper

    parts = [chain_parts(op, probe, count, prefix=f"p{i}_") for i, (op, probe) in enumerate(kind_probes())]
    nodes = [part[0][step] for step in range(count) for part in parts]
    return graph_of(
        helper.make_graph(
            nodes, "probe_mixed", [p[2] for p in parts], [p[3] for p in parts], [t for p in parts for t in p[1]]
        )
    )


class ProbePackage:
    """What build() needs: a graph and a payload digest (sha256 of its description)."""

    def __init__(self, graph) -> None:
        self.graph = graph
        self.payload_digest = hashlib.sha256(repr(graph.to_dict()).encode()).hexdigest()


def probe_chain(blocks: int):
    """``blocks`` x (Add, Mul, Reshape, Transpose, Reshape, Relu) on a (1, 8) tensor: the kinds of small
    calls a real module makes (a broadcast operand, views, a copy), so per-node overhead is typical."""
    from onnx import TensorProto, helper, numpy_helper  # lazily: only the probe graphs need onnx

    inits = [
        numpy_helper.from_array(np.full((8,), 0.5, np.float32), "c"),
        numpy_helper.from_array(np.array([2, 4], np.int64), "s24"),
        numpy_helper.from_array(np.array([1, 8], np.int64), "s18"),
    ]
    nodes, v = [], "x"
    steps: list[tuple[str, list[str | None], dict[str, Any]]]
    for b in range(blocks):
        steps = [
            ("Add", [v, "c"], {}),
            ("Mul", [None, "c"], {}),
            ("Reshape", [None, "s24"], {}),
            ("Transpose", [None], {"perm": [1, 0]}),
            ("Reshape", [None, "s18"], {}),
            ("Relu", [None], {}),
        ]
        for i, (op, args, attrs) in enumerate(steps):
            out = "y" if b == blocks - 1 and i == len(steps) - 1 else f"b{b}_{i}"
            nodes.append(helper.make_node(op, [a or v for a in args], [out], **attrs))
            v = out
    return graph_of(
        helper.make_graph(
            nodes,
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
            inits,
        )
    )


def depthwise(c: int, size: int):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((c, 1, 3, 3), 0.1, np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    shape = [1, c, size, size]
    return graph_of(
        helper.make_graph(
            [node],
            "depthwise",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
            [w],
        )
    )


def graph_of(onnx_graph):
    from onnx import helper

    from cuvil_edge.frontend import load_model

    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", 17)])
    return load_model(model.SerializeToString())
