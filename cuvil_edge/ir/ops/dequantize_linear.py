"""DequantizeLinear: y = (x - zero_point) * scale for int8/uint8/int32 x, per tensor or per axis."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._quant import HELPERS_TEMPLATE, ONNX_FLOAT_CODES, QUANT, no_blocks, per_axis, quant_dtype, same_pair, scale_dtype
from cuvil_edge.ir.ops._util import INT, need, template_function

OP_TYPE = "DequantizeLinear"
#: 13 axis (per-axis scales); 19 float16 scales (y takes the scale's dtype); 21 block_size;
#: 23 output_dtype; 24/25/28 only add dtypes (float8e8m0 scales, int2, float6) this IR rejects.
VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)
ATTRS = {"axis": INT, "block_size": INT, "output_dtype": INT}


def _out_dtype(node, scale_type):
    code = node.attr("output_dtype", 0) if node.version >= 23 else 0
    if code and code not in ONNX_FLOAT_CODES:
        raise UnsupportedAttributeError(f"{node.describe()}: output_dtype {code} is not supported; use float32 (1) or float16 (10)")
    return ONNX_FLOAT_CODES.get(code, scale_type)


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    x, scale = inputs[0], inputs[1]
    zero_point = inputs[2] if len(inputs) > 2 else None
    quant_dtype(node, x, "x", QUANT | {"int32"})
    scale_dtype(node, [scale])
    if node.version < 19 and scale.dtype != "float32":
        raise ShapeInferenceError(f"{node.describe()}: x_scale must be float32 before opset 19, got {scale.dtype}")
    no_blocks(node)
    same_pair(node, x, zero_point, "x and x_zero_point")
    axis = node.attr("axis", 1) if node.version >= 13 else None
    per_axis(node, scale, x, axis, "x_scale")
    per_axis(node, zero_point, x, axis, "x_zero_point")
    return [TensorType(_out_dtype(node, scale.dtype), x.shape)]


def kernel(node, x, scale, zero_point=None):
    return [k_dequantize_linear(x, scale, zero_point, int(node.attr("axis", 1)), _out_dtype(node, ""))]


def flops(node, inputs, outputs):
    return 2 * outputs[0].numel()


TEMPLATE = HELPERS_TEMPLATE + '''

def k_dequantize_linear(x, scale, zero_point, axis, dtype):
    y = x.astype(np.float32)
    if zero_point is not None:
        y = y - _q_along(zero_point, x.ndim, axis).astype(np.float32)
    y = y * _q_along(scale, x.ndim, axis).astype(np.float32)
    return y.astype(dtype or scale.dtype)
'''

k_dequantize_linear = template_function(TEMPLATE, "k_dequantize_linear")


def emit(node, args, outs):
    zero_point = args[2] if len(args) > 2 and args[2] else "None"
    return (f"{outs[0]} = k_dequantize_linear({args[0]}, {args[1]}, {zero_point}, {int(node.attr('axis', 1))}, "
            f"{_out_dtype(node, '')!r})")
