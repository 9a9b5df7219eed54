"""Model import.  ``load_model`` (ONNX -> :class:`~cuvil_edge.ir.graph.Graph`) is imported
lazily so that importing this package does not pull in ``onnx``."""

from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from cuvil_edge.frontend.onnx_import import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
