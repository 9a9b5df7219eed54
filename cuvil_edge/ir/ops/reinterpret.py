"""Ops that change how values are stored, one table row each (the op contract: ``_contract.py``):
BitCast (opset 26: the same bits read as another dtype of the same width) and
DynamicQuantizeLinear (float32 to uint8 with a scale and zero point computed from the data).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import ALL, want
from cuvil_edge.ir.ops._util import INT, need


def k_bit_cast(x, to):
    return np.ascontiguousarray(x).view(to).reshape(x.shape)


def k_dynamic_quantize_linear(x):
    high = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    low = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
    zero = np.rint(np.clip(np.float32(0) - low / scale, 0, 255))
    y = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8)
    return y, np.asarray(scale, dtype=np.float32), np.asarray(zero, dtype=np.uint8)


def _to(node):
    code = node.attr("to")
    name = dtypes.FROM_ONNX_CODE.get(int(code)) if code is not None else None
    if name is None:
        raise UnsupportedAttributeError(f"{node.describe()}: to={code!r} is not an IR dtype")
    return name


def _infer_bit_cast(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((26, ALL),))
    to = _to(node)
    if np.dtype(to).itemsize != np.dtype(x.dtype).itemsize:
        raise ShapeInferenceError(
            f"{node.describe()}: {x.dtype} and {to} have different widths; BitCast keeps the bits"
        )
    return [TensorType(to, x.shape)]


def _infer_dynamic_quantize(node, inputs):
    need(node, inputs, 1)
    want(node, inputs[0], ((11, frozenset({"float32"})),))
    return [TensorType("uint8", inputs[0].shape), TensorType("float32", ()), TensorType("uint8", ())]


OPS = (
    OpDef(
        "BitCast",
        (26,),
        infer=_infer_bit_cast,
        fn=k_bit_cast,
        flops=per_element(0),
        attrs=lambda node: {"to": _to(node)},
        ATTRS={"to": INT},
    ),
    OpDef(
        "DynamicQuantizeLinear",
        (11,),
        infer=_infer_dynamic_quantize,
        fn=k_dynamic_quantize_linear,
        flops=per_element(6),
    ),
)
