"""Helpers for pass tests: ONNX-text graphs with random weights, and before/after comparison."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.graph import Graph

RNG = np.random.default_rng(0)


def graph_from_text(text: str, opset: int = 13, **weights: np.ndarray) -> Graph:
    """Parse the graph body (ONNX text) and attach ``weights`` as initializers."""
    model = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n{text}')
    for name, array in weights.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    return load_model(model)


def w(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def feeds_for(graph: Graph, batch: int = 2, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        shape = [batch if isinstance(d, str) else d for d in v.type.shape]
        out[v.name] = (rng.standard_normal(shape) * 2).astype(v.type.dtype)
    return out


def assert_same_outputs(before: Graph, after: Graph, batches=(1, 4), rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """The interpreter gives the same outputs for both graphs at every batch size."""
    for batch in batches:
        feeds = feeds_for(before, batch)
        want, got = interpreter.run(before, feeds), interpreter.run(after, feeds)
        assert list(want) == list(got)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=f"output {name}")


def op_types(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]
