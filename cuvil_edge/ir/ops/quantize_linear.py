"""QuantizeLinear: y = saturate(round_half_even(x / scale) + zero_point), int8/uint8, per tensor or per axis."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._quant import (HELPERS_TEMPLATE, ONNX_FLOAT_CODES, ONNX_QUANT_CODES, no_blocks, per_axis,
                                      quant_dtype, scale_dtype)
from cuvil_edge.ir.ops._util import INT, need, template_function, want_dtype

OP_TYPE = "QuantizeLinear"
#: 13 axis (per-axis scales); 19 saturate, float16 x; 21 block_size, output_dtype;
#: 23 precision; 24/25/28 only add dtypes (float8e8m0 scales, int2, float6) this IR rejects.
VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)
ATTRS = {"axis": INT, "block_size": INT, "output_dtype": INT, "precision": INT, "saturate": INT}


def _out_dtype(node, zero_point):
    code = node.attr("output_dtype", 0) if node.version >= 21 else 0
    if code and code not in ONNX_QUANT_CODES:
        raise UnsupportedAttributeError(
            f"{node.describe()}: output_dtype {code} is not supported; only uint8 (2) and int8 (3) quantization is")
    if zero_point is not None:
        quant_dtype(node, zero_point, "y_zero_point")
        if code and ONNX_QUANT_CODES[code] != zero_point.dtype:
            raise ShapeInferenceError(
                f"{node.describe()}: output_dtype {ONNX_QUANT_CODES[code]} differs from y_zero_point {zero_point.dtype}")
        return zero_point.dtype
    return ONNX_QUANT_CODES.get(code, "uint8")


def _precision(node):
    code = node.attr("precision", 0) if node.version >= 23 else 0
    if code and code not in ONNX_FLOAT_CODES:
        raise UnsupportedAttributeError(f"{node.describe()}: precision {code} is not supported; use float32 (1) or float16 (10)")
    return ONNX_FLOAT_CODES.get(code, "")


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    x, scale = inputs[0], inputs[1]
    zero_point = inputs[2] if len(inputs) > 2 else None
    want_dtype(node, x, {"float32", "float16", "int32"})
    scale_dtype(node, [scale])
    no_blocks(node)
    _precision(node)
    dtype = _out_dtype(node, zero_point)
    axis = node.attr("axis", 1) if node.version >= 13 else None
    per_axis(node, scale, x, axis, "y_scale")
    per_axis(node, zero_point, x, axis, "y_zero_point")
    return [TensorType(dtype, x.shape)]


def kernel(node, x, scale, zero_point=None):
    return [k_quantize_linear(x, scale, zero_point, int(node.attr("axis", 1)), _default_dtype(node), _precision(node))]


def flops(node, inputs, outputs):
    return 3 * outputs[0].numel()  # divide, add, clip


TEMPLATE = HELPERS_TEMPLATE + '''

def k_quantize_linear(x, scale, zero_point, axis, dtype, precision):
    work = np.dtype(precision or np.float32)
    y = np.rint(x.astype(work) / _q_along(scale, x.ndim, axis).astype(work)).astype(np.float32)
    if zero_point is not None:
        y = y + _q_along(zero_point, x.ndim, axis).astype(np.float32)
    return _q_saturate(y, zero_point.dtype if zero_point is not None else np.dtype(dtype))
'''

k_quantize_linear = template_function(TEMPLATE, "k_quantize_linear")


def emit(node, args, outs):
    zero_point = args[2] if len(args) > 2 and args[2] else "None"
    return (f"{outs[0]} = k_quantize_linear({args[0]}, {args[1]}, {zero_point}, {int(node.attr('axis', 1))}, "
            f"{_default_dtype(node)!r}, {_precision(node)!r})")


def _default_dtype(node):
    """The output dtype when there is no zero point (the template takes the zero point's otherwise)."""
    code = node.attr("output_dtype", 0) if node.version >= 21 else 0
    return ONNX_QUANT_CODES.get(code, "uint8")
