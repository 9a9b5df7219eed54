"""Linear algebra and running products, one table row each (the op contract: ``_contract.py``):
Det (determinants of the trailing square matrices) and CumProd (opset 26, CumSum's sibling).
float16 is computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._util import INT, need

CUMPROD = FLOATS | {"int32", "int64", "uint32", "uint64"}


def k_det(x):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    return np.asarray(np.linalg.det(w).astype(x.dtype))


def k_cum_prod(x, axis, exclusive, reverse):
    a = int(np.asarray(axis).reshape(())) % x.ndim
    w = np.flip(x, a) if reverse else x
    if exclusive:  # shift right by one along the axis, 1 first
        ones = np.ones(w.shape[:a] + (1,) + w.shape[a + 1 :], dtype=x.dtype)
        w = np.concatenate((ones, np.take(w, np.arange(w.shape[a] - 1), axis=a)), axis=a)
    out = np.cumprod(w, axis=a, dtype=x.dtype)
    return np.flip(out, a) if reverse else out


def _infer_det(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((11, FLOATS),))
    if x.rank < 2 or (isinstance(x.shape[-1], int) and isinstance(x.shape[-2], int) and x.shape[-1] != x.shape[-2]):
        raise ShapeInferenceError(f"{node.describe()} needs square matrices [..., M, M], got {x}")
    return [TensorType(x.dtype, x.shape[:-2])]


def _det_flops(node, inputs, outputs):
    m = inputs[0].shape[-1] if isinstance(inputs[0].shape[-1], int) else 1
    return outputs[0].numel() * (2 * m**3) // 3


def _infer_cum_prod(node, inputs):
    need(node, inputs, 2)
    x, axis = inputs
    want(node, x, ((26, CUMPROD),))
    if axis.dtype not in ("int32", "int64") or axis.rank > 1:
        raise ShapeInferenceError(f"{node.describe()}: axis must be an int32/int64 scalar, got {axis}")
    if x.rank < 1:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 1, got {x}")
    return [x]


OPS = (
    OpDef("Det", (11, 22), infer=_infer_det, fn=k_det, flops=_det_flops),
    OpDef(
        "CumProd",
        (26,),
        infer=_infer_cum_prod,
        fn=k_cum_prod,
        flops=per_element(1),
        attrs=lambda node: {"exclusive": int(node.attr("exclusive", 0)), "reverse": int(node.attr("reverse", 0))},
        ATTRS={"exclusive": INT, "reverse": INT},
    ),
)
