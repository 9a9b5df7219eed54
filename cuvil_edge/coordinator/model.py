"""Which model a federation trains: a builtin demo model or an ONNX file."""

from __future__ import annotations

from pathlib import Path

from cuvil_edge.frontend import load_model
from cuvil_edge.ir.graph import Graph


def load_federation_model(model: str, seed: int = 0) -> Graph:
    """Import the federation's model into the IR.

    Raises:
        ModelError: the ONNX file is malformed or uses unsupported ops.
    """
    if model == "builtin:digits-cnn":
        from cuvil_edge.frontend.demo_model import digits_cnn_onnx

        return load_model(digits_cnn_onnx(seed))
    return load_model(Path(model))
