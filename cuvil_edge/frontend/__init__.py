"""Model import.  :func:`load_model` (ONNX -> :class:`~cuvil_edge.ir.graph.Graph`) imports ``onnx``
when it is first called, not when this package is imported: a device installs no onnx (it
receives packages, never models), yet modules it imports name this function."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuvil_edge.extras import require

if TYPE_CHECKING:
    from cuvil_edge.ir.graph import Graph

__all__ = ["load_model"]


def load_model(source: Any) -> Graph:
    """Import an ONNX model (a path, serialized bytes or a ModelProto) as a checked, typed Graph:
    :func:`cuvil_edge.frontend.onnx_import.load_model`, whose errors it raises.

    Raises:
        MissingDependencyError: onnx is not installed (it comes with ``cuvil-edge[coordinator]``).
    """
    require(("onnx",), "importing an ONNX model needs onnx", "coordinator")
    from cuvil_edge.frontend.onnx_import import load_model as load

    return load(source)
