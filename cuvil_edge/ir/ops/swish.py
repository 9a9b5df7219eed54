"""Gated activations, one table row each (the op contract: ``_contract.py``): Swish (opset 24:
x * sigmoid(alpha * x)) and SwiGLU (opset 28: Swish(A) * B, A and B of one shape). float16 is
computed in float32 and rounded once; the sigmoid never overflows."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, infer_unary
from cuvil_edge.ir.ops._native import _native_lib, _native_map
from cuvil_edge.ir.ops._scratch import swish_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, FLOAT, need

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


def k_swish(x, alpha):
    if TARGET_NATIVE:
        y = _native_map(x, "cuvil_swish_f32", alpha)
        if y is not None:
            return y
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    z = w * w.dtype.type(alpha)
    e = np.exp(-np.abs(z))
    return np.asarray((w * np.where(z >= 0, 1 / (1 + e), e / (1 + e))).astype(x.dtype))


def k_swiglu(a, b, alpha):
    w = a.astype(np.float32) if a.dtype == np.float16 else a
    z = w * w.dtype.type(alpha)
    e = np.exp(-np.abs(z))
    return np.asarray((w * np.where(z >= 0, 1 / (1 + e), e / (1 + e)) * b.astype(w.dtype)).astype(a.dtype))


def _infer_swiglu(node, inputs):
    need(node, inputs, 2)
    a, b = inputs
    if b.dtype != a.dtype or tuple(b.shape) != tuple(a.shape):
        raise ShapeInferenceError(
            f"{node.describe()}: A {a} and B {b} must have one dtype and one shape (no broadcast)"
        )
    return infer_unary(node, [a], ((28, FLOATS),))


OPS = (
    OpDef(
        "Swish",
        (24,),
        infer=lambda node, inputs: infer_unary(node, inputs, ((24, FLOATS),)),
        fn=k_swish,
        flops=per_element(TRANSCENDENTAL + 4),
        attrs=lambda node: {"alpha": float(node.attr("alpha", 1.0))},
        helpers=(_native_lib, _native_map),
        ATTRS={"alpha": FLOAT},
        torch=_torch.swish,
        scratch=swish_scratch,
        transcendental=True,
        cost_native="map",
    ),
    OpDef(
        "SwiGLU",
        (28,),
        infer=_infer_swiglu,
        fn=k_swiglu,
        flops=per_element(TRANSCENDENTAL + 5),
        attrs=lambda node: {"alpha": float(node.attr("alpha", 1.0))},
        ATTRS={"alpha": FLOAT},
    ),
)
