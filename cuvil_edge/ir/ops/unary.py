"""Elementwise unary ops, one table row each (the op contract: ``_contract.py``): Tanh, Exp, Log,
Sqrt, Erf, Not, Abs, Neg, Reciprocal, Floor, Ceil, Round, Sign, IsNaN, IsInf and Identity; and the
one-tensor ops with optional extras: Cast (``to``), CastLike (to input 1's dtype), Clip (bounds:
attributes before opset 11, optional inputs from it) and Dropout (inference only; the optional
mask output). The activation functions are :mod:`.activation`'s, rows of this file's ``_unary``.

Each kernel is the numpy function compiled modules run; results keep the input's dtype (float16
is computed by numpy's float32 loops, or in float32 by ``_wide``, and rounded once). Attribute
defaults are ONNX's, as float32 values where the schema stores floats. ``VERSIONS`` lists every
opset at which the schema changed; where a later one only adds bfloat16 / float8 / strings (not IR
dtypes) the row does not branch on it.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import OpDef, no_attrs, no_scratch, per_element
from cuvil_edge.ir.ops._elementwise import (
    ALL,
    ERF,
    FLOATS,
    INTS,
    NUMERIC,
    SIGNED,
    TRANSCENDENTAL,
    _erf64,
    infer_unary,
    want,
)
from cuvil_edge.ir.ops._native import _native_lib, _native_map
from cuvil_edge.ir.ops._scratch import clip_scratch, erf_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, FLOAT, INT, need, same_dtype

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------


def k_tanh(x):
    with np.errstate(all="ignore"):
        return np.asarray(np.tanh(x))


def k_exp(x):
    with np.errstate(all="ignore"):  # overflow gives inf, as onnxruntime
        return np.asarray(np.exp(x))


def k_log(x):
    with np.errstate(all="ignore"):  # negative gives NaN, 0 gives -inf, as onnxruntime
        return np.asarray(np.log(x))


def k_sqrt(x):
    with np.errstate(all="ignore"):  # negative gives NaN, as onnxruntime
        return np.asarray(np.sqrt(x))


def k_erf(x):
    if TARGET_NATIVE:
        y = _native_map(x, "cuvil_erf_f32")
        if y is not None:
            return y
    # Cody's approximation in float64 rounded once to x's dtype (integers, opset 9: truncated, as ONNX's reference)
    return np.asarray(_erf64(x).astype(x.dtype))


def k_not(x):
    return np.asarray(np.logical_not(x))


def k_identity(x):
    return x  # the same array: kernels never write into their inputs


def k_cast(x, to):
    # floats to ints truncate toward zero; to bool is != 0 (NaN is True); narrowing rounds to nearest even
    with np.errstate(all="ignore"):
        return np.asarray(x.astype(to))


def k_cast_like(x, like):
    with np.errstate(all="ignore"):
        return np.asarray(x.astype(like.dtype))


def k_clip(x, lo=None, hi=None):
    # lo/hi: the min/max inputs (opset 11+), or the attributes before; None: unbounded. min > max gives max
    y = x
    with np.errstate(all="ignore"):
        if lo is not None:
            y = np.maximum(y, np.asarray(lo).astype(x.dtype).reshape(()))
        if hi is not None:
            y = np.minimum(y, np.asarray(hi).astype(x.dtype).reshape(()))
    return np.asarray(y)


def k_dropout(x, ratio=None, training_mode=None, mask="none"):
    # inference: y = x (infer refuses training unless its ratio is a constant 0, which is the identity too)
    if mask == "none":  # the node has no mask output
        return x
    if mask == "unused":  # declared without a name
        return x, None
    if mask == "zeros":  # opsets 7-9: zeros of x's dtype, as onnxruntime
        return x, np.zeros(x.shape, dtype=x.dtype)
    return x, np.full(x.shape, mask == "true")  # 10-11: all False; 12+: all True


def k_abs(x):
    return np.abs(x)


def k_neg(x):
    return np.negative(x)


def k_reciprocal(x):
    with np.errstate(divide="ignore"):
        return np.asarray(np.reciprocal(x))


def k_floor(x):
    return np.floor(x)


def k_ceil(x):
    return np.ceil(x)


def k_round(x):
    return np.round(x)  # half to even, as ONNX specifies


def k_sign(x):
    return np.sign(x)


def k_isnan(x):
    return np.isnan(x)


def k_isinf(x, detect_negative, detect_positive):
    return np.isinf(x) & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))


# --- the table ------------------------------------------------------------------------------
def _unary(
    op_type, fn, versions, types, cost=1, attrs=no_attrs, kinds=None, out_dtype=None, helpers=(), **facets
) -> OpDef:
    """One elementwise op: output row i is computed from input row i alone (the batch facet)."""

    def infer(node, inputs):
        attrs(node)  # refuses bad attribute values at import, not at run time
        out = infer_unary(node, inputs, types)
        return [TensorType(out_dtype, out[0].shape)] if out_dtype else out

    flops = cost if callable(cost) else per_element(cost)
    return OpDef(
        op_type,
        tuple(versions),
        infer=infer,
        fn=fn,
        flops=flops,
        attrs=attrs,
        helpers=helpers,
        ATTRS=kinds or {},
        batch="same",
        **facets,
    )


def _floats(**defaults):
    """attrs() reading float attributes with their ONNX defaults."""

    def attrs(node):
        return {k: float(node.attr(k, v)) for k, v in defaults.items()}

    return attrs


def _isinf_attrs(node):
    return {
        "detect_negative": int(node.attr("detect_negative", 1)),
        "detect_positive": int(node.attr("detect_positive", 1)),
    }


# --- Cast: ``to`` is an ONNX TensorProto code; 9 string, 13 bfloat16, 19 float8 + saturate, 21 int4/uint4,
# 23 float4, 24 float8e8m0, 25 int2/uint2, 28 float6: none of them IR dtypes, so the semantics never change.
def _cast_attrs(node):
    code = node.attr("to")
    name = dtypes.FROM_ONNX_CODE.get(code) if isinstance(code, int) else None
    if name is None:
        raise UnsupportedAttributeError(
            f"{node.describe()} casts to ONNX type {code!r}, which the IR does not support; supported: "
            + ", ".join(f"{c} ({n})" for c, n in sorted(dtypes.FROM_ONNX_CODE.items()))
        )
    return {"to": name}


def _infer_cast(node, inputs):
    (x,) = infer_unary(node, inputs, ((6, ALL),))
    return [TensorType(_cast_attrs(node)["to"], x.shape)]


def _infer_cast_like(node, inputs):
    need(node, inputs, 2)
    want(node, inputs[0], ((15, ALL),))
    return [TensorType(inputs[1].dtype, inputs[0].shape)]


# --- Clip: bounds are float attributes before opset 11 (defaults: float32 lowest/highest), optional
# scalar inputs from it (absent: unbounded); 12 adds integer dtypes.
FLOAT32_MAX = 3.4028234663852886e38


def _clip_attrs(node):
    if node.version >= 11:
        return {}
    return {"lo": float(node.attr("min", -FLOAT32_MAX)), "hi": float(node.attr("max", FLOAT32_MAX))}


def _infer_clip(node, inputs):
    need(node, inputs, 1, optional=2 if node.version >= 11 else 0)
    same_dtype(node, inputs)
    want(node, inputs[0], ((6, FLOATS), (12, FLOATS | INTS)))
    for bound in inputs[1:]:
        if bound is not None and not (bound.is_static and bound.numel() == 1 and bound.rank <= 1):
            raise ShapeInferenceError(f"{node.describe()}: min and max must be scalars, got {bound}")
    return [inputs[0]]


# --- Dropout in inference: y = x. The optional mask follows onnxruntime: zeros of x's dtype at opsets
# 7-9, all False at 10-11, all True from 12 (where ratio and training_mode became inputs).
# training_mode and ratio must be constants (CONST_INPUTS: the ONNX backend binds them when a model
# feeds them as graph inputs); training with ratio 0 drops nothing and is the identity; training with
# ratio > 0 is random and refused. Opset 6 (is_test attribute) is not supported: onnxruntime has no
# kernel for it either; upgrade the model.
class TrainingModeNotConstantError(ShapeInferenceError, UnsupportedAttributeError):
    """training_mode (or, in training, ratio) is not a constant: unsupported as such, and a
    ShapeInferenceError so that the ONNX backend binds the fed value and imports again."""


def _dropout_attrs(node):
    if len(node.outputs) < 2:
        return {"mask": "none"}
    if not node.outputs[1]:
        return {"mask": "unused"}
    return {"mask": "zeros" if node.version < 10 else "false" if node.version < 12 else "true"}


def _scalar(value):
    return np.asarray(value).reshape(-1)[0]


def _refuse_training(node, training, known, ratio, ratio_known):
    """Raise unless the node is an identity: not training, or training with a constant ratio of 0."""
    if not known:
        raise TrainingModeNotConstantError(
            f"{node.describe()} may run in training mode (training_mode is not a constant); "
            "only inference is supported: export the model in eval mode"
        )
    if training is None or not bool(_scalar(training)):
        return
    if not ratio_known:
        raise TrainingModeNotConstantError(
            f"{node.describe()} runs in training mode with a ratio that is not a constant; "
            "only inference (or training with ratio 0) is supported: export the model in eval mode"
        )
    value = 0.5 if ratio is None else float(_scalar(ratio))
    if value != 0.0:
        raise UnsupportedAttributeError(
            f"{node.describe()} runs in training mode (training_mode True, ratio {value}): random dropout is not "
            "supported, only inference or training with ratio 0: export the model in eval mode"
        )


def _infer_dropout(node, inputs, consts=None):
    need(node, inputs, 1, optional=2 if node.version >= 12 else 0)
    want(node, inputs[0], _F)
    for index, what in ((1, "ratio"), (2, "training_mode")):
        t = inputs[index] if len(inputs) > index else None
        if t is not None and not (t.is_static and t.numel() == 1):
            raise ShapeInferenceError(f"{node.describe()}: {what} must be a scalar, got {t}")
    if len(inputs) > 1 and inputs[1] is not None:
        want(node, inputs[1], _F, "ratio")
    if len(inputs) > 2 and inputs[2] is not None:
        want(node, inputs[2], ((7, frozenset({"bool"})),), "training_mode")
        consts = consts or {}
        has_ratio = len(inputs) > 1 and inputs[1] is not None
        _refuse_training(node, consts.get(2), 2 in consts, consts.get(1), not has_ratio or 1 in consts)
    mask = inputs[0].dtype if node.version < 10 else "bool"
    return [inputs[0], TensorType(mask, inputs[0].shape)]


def _infer_identity(node, inputs):
    need(node, inputs, 1)
    return [inputs[0]]


_F = ((6, FLOATS),)
_T = TRANSCENDENTAL

OPS = (
    # 13 adds bfloat16 only (not an IR dtype)
    _unary(
        "Tanh", k_tanh, (6, 13), _F, _T, torch=lambda t, node, x: t.tanh(x), scratch=no_scratch, transcendental=True
    ),
    _unary("Exp", k_exp, (6, 13), _F, _T, torch=lambda t, node, x: t.exp(x), scratch=no_scratch, transcendental=True),
    _unary("Log", k_log, (6, 13), _F, _T, torch=lambda t, node, x: t.log(x), scratch=no_scratch, transcendental=True),
    _unary(
        "Sqrt", k_sqrt, (6, 13), _F, torch=lambda t, node, x: t.sqrt(x), scratch=no_scratch
    ),  # a hardware square root counts as one operation
    # 9 also allows integer dtypes, 13 floats only
    _unary(
        "Erf",
        k_erf,
        (9, 13),
        ((9, FLOATS | INTS), (13, FLOATS)),
        ERF,
        helpers=(_erf64, _native_lib, _native_map),
        torch=lambda t, node, x: t.erf(x),
        transcendental=True,
        scratch=erf_scratch,
        cost_native="map",
    ),
    _unary(
        "Not", k_not, (1,), ((1, frozenset({"bool"})),), torch=lambda t, node, x: t.logical_not(x), scratch=no_scratch
    ),
    OpDef(
        "Identity",
        (1, 13, 14, 16, 19, 21),
        batch="same",
        infer=_infer_identity,
        fn=k_identity,
        flops=per_element(0),
        torch=_torch.identity,
        view=True,
        scratch=no_scratch,
    ),
    OpDef(
        "Cast",
        (6, 9, 13, 19, 21, 23, 24, 25, 28),
        batch="same",
        infer=_infer_cast,
        fn=k_cast,
        flops=per_element(1),
        attrs=_cast_attrs,
        ATTRS={"to": INT, "saturate": INT},
        torch=_torch.cast,
        scratch=no_scratch,
    ),  # saturate only affects float8, which the IR lacks
    OpDef(
        "CastLike",
        (15, 19, 21, 23, 24, 25),
        infer=_infer_cast_like,
        fn=k_cast_like,
        flops=per_element(1),
        ATTRS={"saturate": INT},
        torch=_torch.cast_like,
        scratch=no_scratch,
    ),
    OpDef(
        "Clip",
        (6, 11, 12, 13),
        batch="broadcast",
        infer=_infer_clip,
        fn=k_clip,
        flops=per_element(1),
        attrs=_clip_attrs,
        ATTRS={"min": FLOAT, "max": FLOAT},
        torch=_torch.clip,
        scratch=clip_scratch,
    ),
    # 13, 22: bfloat16 / float8 only
    OpDef(
        "Dropout",
        (7, 10, 12, 13, 22),
        batch="same",
        infer=_infer_dropout,
        fn=k_dropout,
        flops=per_element(0),
        attrs=_dropout_attrs,
        ATTRS={"ratio": FLOAT, "seed": INT},
        CONST_INPUTS=(1, 2),
        torch=_torch.identity,
        view=True,
        scratch=no_scratch,
    ),
    _unary("Abs", k_abs, (6, 13), ((6, NUMERIC),), torch=lambda t, node, x: t.abs(x), scratch=no_scratch),
    _unary("Neg", k_neg, (6, 13), ((6, FLOATS | SIGNED),), torch=lambda t, node, x: t.neg(x), scratch=no_scratch),
    _unary("Reciprocal", k_reciprocal, (6, 13), _F, torch=lambda t, node, x: t.reciprocal(x), scratch=no_scratch),
    _unary("Floor", k_floor, (6, 13), _F, torch=lambda t, node, x: t.floor(x), scratch=no_scratch),
    _unary("Ceil", k_ceil, (6, 13), _F, torch=lambda t, node, x: t.ceil(x), scratch=no_scratch),
    _unary("Round", k_round, (11, 22), ((11, FLOATS),), torch=lambda t, node, x: t.round(x), scratch=no_scratch),
    _unary("Sign", k_sign, (9, 13), ((9, NUMERIC),), torch=lambda t, node, x: t.sign(x), scratch=no_scratch),
    _unary("IsNaN", k_isnan, (9, 13, 20), ((9, FLOATS),), out_dtype="bool", torch=lambda t, node, x: t.isnan(x)),
    _unary(
        "IsInf",
        k_isinf,
        (10, 20),
        ((10, FLOATS),),
        2,
        _isinf_attrs,
        {"detect_negative": INT, "detect_positive": INT},
        out_dtype="bool",
        torch=_torch.is_inf,
    ),
)
