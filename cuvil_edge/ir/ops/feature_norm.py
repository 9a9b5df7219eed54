"""Normalisations over trailing axes or a chosen axis, one table row each (the op contract:
``_contract.py``): RMSNormalization (LLaMA-style transformers), LpNormalization and
MeanVarianceNormalization. float16 is computed in float32 and rounded once, as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, broadcast_all, want
from cuvil_edge.ir.ops._util import FLOAT, INT, INTS, axis_index, ints, need


def k_rms_normalization(x, scale, axis, epsilon):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean_square = np.mean(np.square(w), axis=axes, keepdims=True)
    normed = w * np.reciprocal(np.sqrt(mean_square + w.dtype.type(epsilon)))
    s = scale.astype(np.float32) if scale.dtype == np.float16 else scale
    return np.asarray((normed.astype(np.result_type(w.dtype, s.dtype)) * s).astype(scale.dtype))


def k_lp_normalization(x, axis, p):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    if p == 1:
        norm = np.sum(np.abs(w), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(np.square(w), axis=axis, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(norm == 0, w.dtype.type(0), w / norm)
    return np.asarray(out.astype(x.dtype))


def k_mean_variance_normalization(x, axes):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    mean = np.mean(w, axis=axes, keepdims=True)
    variance = np.mean(np.square(w), axis=axes, keepdims=True) - np.square(mean)
    std = np.sqrt(np.maximum(variance, w.dtype.type(0)))
    return np.asarray(((w - mean) / (std + w.dtype.type(1e-9))).astype(x.dtype))


# --- inference and attributes -----------------------------------------------------------------
def _infer_rms(node, inputs):
    need(node, inputs, 2)
    x, scale = inputs
    want(node, x, ((23, FLOATS),))
    want(node, scale, ((23, FLOATS),), "scale")
    axis_index(node, _rms_attrs(node)["axis"], x.rank)
    if broadcast_all(node, [x.shape, scale.shape]) != tuple(x.shape):
        raise ShapeInferenceError(f"{node.describe()}: scale {scale} must broadcast to X {x} without widening it")
    return [TensorType(scale.dtype, x.shape)]


def _rms_attrs(node):
    stash = int(node.attr("stash_type", 1))
    if stash != 1:
        raise UnsupportedAttributeError(
            f"{node.describe()}: stash_type={stash} is not supported (only 1, float32); "
            "re-export with the default stash_type"
        )
    return {"axis": int(node.attr("axis", -1)), "epsilon": float(node.attr("epsilon", 1e-5))}


def _infer_lp(node, inputs):
    need(node, inputs, 1)
    want(node, inputs[0], ((1, FLOATS),))
    axis_index(node, int(node.attr("axis", -1)), inputs[0].rank)
    _lp_attrs(node)
    return [inputs[0]]


def _lp_attrs(node):
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise UnsupportedAttributeError(f"{node.describe()}: p must be 1 or 2, got {p}")
    return {"axis": int(node.attr("axis", -1)), "p": p}


def _infer_mvn(node, inputs):
    need(node, inputs, 1)
    want(node, inputs[0], ((9, FLOATS),))
    for a in _mvn_attrs(node)["axes"]:
        axis_index(node, a, inputs[0].rank)
    return [inputs[0]]


def _mvn_attrs(node):
    return {"axes": tuple(ints(node, "axes", [0, 2, 3]))}


OPS = (
    OpDef(
        "RMSNormalization",
        (23,),
        infer=_infer_rms,
        fn=k_rms_normalization,
        flops=per_element(4 + TRANSCENDENTAL // 4),
        attrs=_rms_attrs,
        ATTRS={"axis": INT, "epsilon": FLOAT, "stash_type": INT},
    ),
    OpDef(
        "LpNormalization",
        (1, 22),
        infer=_infer_lp,
        fn=k_lp_normalization,
        flops=per_element(4),
        attrs=_lp_attrs,
        ATTRS={"axis": INT, "p": INT},
    ),
    OpDef(
        "MeanVarianceNormalization",
        (9, 13),
        infer=_infer_mvn,
        fn=k_mean_variance_normalization,
        flops=per_element(7),
        attrs=_mvn_attrs,
        ATTRS={"axes": INTS},
        cost_kind="normalization",
    ),
)
