"""Linear (de)quantization, one table row each (the op contract: ``_contract.py``):

* QuantizeLinear: y = saturate(round_half_even(x / scale) + zero_point), int8/uint8, per tensor or
  per axis. 13 axis (per-axis scales); 19 saturate, float16 x; 21 block_size, output_dtype;
  23 precision; 24/25/28 only add dtypes (float8e8m0 scales, int2, float6) this IR rejects.
* DequantizeLinear: y = (x - zero_point) * scale for int8/uint8/int32 x, per tensor or per axis.
  13 axis; 19 float16 scales (y takes the scale's dtype); 21 block_size; 23 output_dtype;
  24/25/28 only add dtypes this IR rejects.

Both compute in float32 (QuantizeLinear divides in ``precision`` when given) and round once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._quant import (
    ONNX_FLOAT_CODES,
    ONNX_QUANT_CODES,
    QUANT,
    _q_along,
    _q_saturate,
    no_blocks,
    per_axis,
    quant_dtype,
    same_pair,
    scale_dtype,
)
from cuvil_edge.ir.ops._util import INT, need, want_dtype

VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_quantize_linear(x, scale, zero_point=None, axis=1, dtype="uint8", precision=""):
    work = np.dtype(precision or np.float32)
    y = np.rint(x.astype(work) / _q_along(scale, x.ndim, axis).astype(work)).astype(np.float32)
    if zero_point is None:
        return _q_saturate(y, np.dtype(dtype))
    return _q_saturate(y + _q_along(zero_point, x.ndim, axis).astype(np.float32), zero_point.dtype)


def k_dequantize_linear(x, scale, zero_point=None, axis=1, dtype=""):
    y = x.astype(np.float32)
    if zero_point is not None:
        y = y - _q_along(zero_point, x.ndim, axis).astype(np.float32)
    y = y * _q_along(scale, x.ndim, axis).astype(np.float32)
    return y.astype(dtype or scale.dtype)


# --- inference and attributes -------------------------------------------------------------------
def _quant_code(node):
    return node.attr("output_dtype", 0) if node.version >= 21 else 0


def _quantized_dtype(node, zero_point):
    code = _quant_code(node)
    if code and code not in ONNX_QUANT_CODES:
        raise UnsupportedAttributeError(
            f"{node.describe()}: output_dtype {code} is not supported; only uint8 (2) and int8 (3) quantization is"
        )
    if zero_point is not None:
        quant_dtype(node, zero_point, "y_zero_point")
        if code and ONNX_QUANT_CODES[code] != zero_point.dtype:
            raise ShapeInferenceError(
                f"{node.describe()}: output_dtype {ONNX_QUANT_CODES[code]} differs from y_zero_point {zero_point.dtype}"
            )
        return zero_point.dtype
    return ONNX_QUANT_CODES.get(code, "uint8")


def _precision(node):
    code = node.attr("precision", 0) if node.version >= 23 else 0
    if code and code not in ONNX_FLOAT_CODES:
        raise UnsupportedAttributeError(
            f"{node.describe()}: precision {code} is not supported; use float32 (1) or float16 (10)"
        )
    return ONNX_FLOAT_CODES.get(code, "")


def _axis(node):
    """The per-axis axis; None before opset 13 (per tensor only)."""
    return node.attr("axis", 1) if node.version >= 13 else None


def _infer_quantize(node, inputs):
    need(node, inputs, 2, optional=1)
    x, scale = inputs[0], inputs[1]
    zero_point = inputs[2] if len(inputs) > 2 else None
    want_dtype(node, x, {"float32", "float16", "int32"})
    scale_dtype(node, [scale])
    no_blocks(node)
    _precision(node)
    dtype = _quantized_dtype(node, zero_point)
    per_axis(node, scale, x, _axis(node), "y_scale")
    per_axis(node, zero_point, x, _axis(node), "y_zero_point")
    return [TensorType(dtype, x.shape)]


def _quantize_attrs(node):
    # dtype: the output's when there is no zero point (the kernel takes the zero point's otherwise)
    return {
        "axis": int(node.attr("axis", 1)),
        "dtype": ONNX_QUANT_CODES.get(_quant_code(node), "uint8"),
        "precision": _precision(node),
    }


def _float_dtype(node, scale_type):
    code = node.attr("output_dtype", 0) if node.version >= 23 else 0
    if code and code not in ONNX_FLOAT_CODES:
        raise UnsupportedAttributeError(
            f"{node.describe()}: output_dtype {code} is not supported; use float32 (1) or float16 (10)"
        )
    return ONNX_FLOAT_CODES.get(code, scale_type)


def _infer_dequantize(node, inputs):
    need(node, inputs, 2, optional=1)
    x, scale = inputs[0], inputs[1]
    zero_point = inputs[2] if len(inputs) > 2 else None
    quant_dtype(node, x, "x", QUANT | {"int32"})
    scale_dtype(node, [scale])
    if node.version < 19 and scale.dtype != "float32":
        raise ShapeInferenceError(f"{node.describe()}: x_scale must be float32 before opset 19, got {scale.dtype}")
    no_blocks(node)
    same_pair(node, x, zero_point, "x and x_zero_point")
    per_axis(node, scale, x, _axis(node), "x_scale")
    per_axis(node, zero_point, x, _axis(node), "x_zero_point")
    return [TensorType(_float_dtype(node, scale.dtype), x.shape)]


OPS = (
    OpDef(
        "QuantizeLinear",
        VERSIONS,
        batch="quantize",
        infer=_infer_quantize,
        fn=k_quantize_linear,
        flops=per_element(3),
        attrs=_quantize_attrs,
        helpers=(_q_along, _q_saturate),
        ATTRS={"axis": INT, "block_size": INT, "output_dtype": INT, "precision": INT, "saturate": INT},
        torch=_torch.quantize_linear,
        torch_check=_torch.check_quantize,
    ),
    OpDef(
        "DequantizeLinear",
        VERSIONS,
        batch="quantize",
        infer=_infer_dequantize,
        fn=k_dequantize_linear,
        flops=per_element(2),
        attrs=lambda node: {"axis": int(node.attr("axis", 1)), "dtype": _float_dtype(node, "")},
        helpers=(_q_along,),
        ATTRS={"axis": INT, "block_size": INT, "output_dtype": INT},
        torch=_torch.dequantize_linear,
        torch_check=_torch.check_dequantize,
    ),
)
