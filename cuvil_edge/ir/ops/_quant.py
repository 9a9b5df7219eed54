"""Helpers shared by the quantization ops (QuantizeLinear ... ConvInteger).

Only int8/uint8 quantized tensors (plus int32 for DequantizeLinear's input and
the bias of QLinearConv) are supported; float8, int4/int2, int16 and blocked
quantization raise :class:`UnsupportedAttributeError` naming the node.

The ``_q_*`` functions are the kernels' shared helpers (op contract: listed in ``helpers``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import Node, TensorType
from cuvil_edge.ir.ops._util import axis_index

QUANT = frozenset({"int8", "uint8"})
#: ONNX TensorProto codes for ``output_dtype`` attributes we accept.
ONNX_QUANT_CODES = {2: "uint8", 3: "int8"}
ONNX_FLOAT_CODES = {1: "float32", 10: "float16"}


def quant_dtype(node: Node, t: TensorType | None, what: str, allowed: frozenset[str] = QUANT) -> None:
    """Reject a quantized tensor whose dtype is not int8/uint8 (or ``allowed``)."""
    if t is not None and t.dtype not in allowed:
        raise UnsupportedAttributeError(
            f"{node.describe()}: {what} is {t.dtype}; only {', '.join(sorted(allowed))} quantization is "
            "supported (float8, int4/int2 and int16 are not). Re-quantize the model to int8/uint8"
        )


def no_blocks(node: Node) -> None:
    """Reject blocked quantization (``block_size`` > 0)."""
    if node.attr("block_size", 0):
        raise UnsupportedAttributeError(
            f"{node.describe()} uses blocked quantization (block_size={node.attr('block_size')}); only per-tensor "
            "and per-axis quantization are supported"
        )


def per_axis(node: Node, t: TensorType | None, x: TensorType, axis: int | None, what: str) -> None:
    """``t`` must be a scalar, a 1-element vector or (with ``axis``, None before opset 13) a vector of
    x's size at axis."""
    if t is None or t.rank == 0 or t.shape == (1,):
        return
    if t.rank > 1:
        raise UnsupportedAttributeError(
            f"{node.describe()}: {what} has shape {list(t.shape)}; rank > 1 means blocked quantization, "
            "which is not supported (use per-tensor or per-axis)"
        )
    if axis is None:
        raise ShapeInferenceError(
            f"{node.describe()}: {what} must be a scalar at this opset, got shape {list(t.shape)}"
        )
    axis = axis_index(node, axis, x.rank)
    if t.shape[0] != x.shape[axis]:
        raise ShapeInferenceError(
            f"{node.describe()}: {what} has {t.shape[0]} elements but the input has {x.shape[axis]} along axis {axis}"
        )


def same_pair(node: Node, a: TensorType | None, b: TensorType | None, what: str) -> None:
    if a is not None and b is not None and a.dtype != b.dtype:
        raise ShapeInferenceError(f"{node.describe()}: {what} have different dtypes ({a.dtype} vs {b.dtype})")


def scale_dtype(node: Node, scales: Sequence[TensorType | None]) -> None:
    for s in scales:
        if s is not None and s.dtype not in ("float32", "float16"):
            raise UnsupportedAttributeError(
                f"{node.describe()}: scale dtype {s.dtype} is not supported; use float32 (or float16)"
            )


# --- kernel helpers: real functions the quant kernels list as ``helpers`` (compiled modules paste
# their source).
def _q_along(v, ndim, axis):
    """A scale / zero point as an array broadcastable along ``axis`` of an ndim-D tensor."""
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


def _q_saturate(y, dtype):
    """Clip already rounded values to the range of the integer ``dtype`` and cast."""
    info = np.iinfo(dtype)
    return np.clip(y, info.min, info.max).astype(dtype)


def _q_requantize(acc, multiplier, zero_point, dtype):
    """int32 accumulator -> quantized: rint(float32(acc) * multiplier) + zero point, saturated."""
    y = np.rint(acc.astype(np.float32) * multiplier) + zero_point.astype(np.float32)
    return _q_saturate(y, dtype)


def _q_centered_a(a, zero_point):
    """A as int32 minus its zero point (a 1-D zero point is per row)."""
    wide = a.astype(np.int32)
    if zero_point is None:
        return wide
    if zero_point.ndim == 1 and zero_point.size > 1 and a.ndim >= 2:
        return wide - zero_point.astype(np.int32).reshape(-1, 1)
    return wide - zero_point.astype(np.int32)


def _q_centered_b(b, zero_point):
    """B as int32 minus its zero point (a 1-D zero point is per column)."""
    wide = b.astype(np.int32)
    return wide if zero_point is None else wide - zero_point.astype(np.int32)
