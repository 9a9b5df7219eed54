"""Elementwise unary ops, one table row each (the op contract: ``_contract.py``).

Each kernel is the numpy function compiled modules run; results keep the input's dtype (float16
is computed by numpy's float32 loops and rounded once). Attribute defaults are ONNX's, as float32
values where the schema stores floats. ``VERSIONS`` lists every opset at which the schema changed;
here the later ones (13, 22) only add bfloat16, which the IR does not have, so no row branches on
the version.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, no_attrs, per_element
from cuvil_edge.ir.ops._elementwise import ERF, FLOATS, INTS, SIGNED, TRANSCENDENTAL, _erf64, _wide, infer_unary
from cuvil_edge.ir.ops._util import FLOAT, INT, STR, choice

NUMERIC = FLOATS | INTS


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_relu(x):
    return np.maximum(x, x.dtype.type(0))


def k_sigmoid(x):
    w = _wide(x)
    e = np.exp(-np.abs(w))  # exp(-|x|): nothing overflows
    return np.asarray(np.where(w >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype))


def k_hard_swish(x):
    w = _wide(x)
    return np.asarray((w * np.minimum(np.maximum(w * (1 / 6) + 0.5, 0), 1)).astype(x.dtype))


def k_gelu(x, tanh):
    w = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if tanh:
            y = 0.5 * w * (1.0 + np.tanh(0.7978845608028654 * (w + 0.044715 * w * w * w)))
        else:
            y = 0.5 * w * (1.0 + _erf64(w * 0.7071067811865476))
        return np.asarray(y.astype(x.dtype))


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


def k_sin(x):
    return np.sin(x)


def k_cos(x):
    return np.cos(x)


def k_tan(x):
    return np.tan(x)


def k_asin(x):
    with np.errstate(invalid="ignore"):
        return np.arcsin(x)


def k_acos(x):
    with np.errstate(invalid="ignore"):
        return np.arccos(x)


def k_atan(x):
    return np.arctan(x)


def k_sinh(x):
    with np.errstate(over="ignore"):
        return np.sinh(x)


def k_cosh(x):
    with np.errstate(over="ignore"):
        return np.cosh(x)


def k_asinh(x):
    return np.arcsinh(x)


def k_acosh(x):
    with np.errstate(invalid="ignore"):
        return np.arccosh(x)


def k_atanh(x):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.arctanh(x)


def k_softplus(x):
    return np.logaddexp(x.dtype.type(0), x)  # log(1 + e^x) without overflow


def k_softsign(x):
    return x / (x.dtype.type(1) + np.abs(x))


def k_elu(x, alpha):
    return np.where(x > 0, x, x.dtype.type(alpha) * np.expm1(np.minimum(x, 0)))


def k_selu(x, alpha, gamma):
    a, g = x.dtype.type(alpha), x.dtype.type(gamma)
    return np.where(x > 0, g * x, g * a * np.expm1(np.minimum(x, 0)))


def k_celu(x, alpha):
    a = x.dtype.type(alpha)
    return np.maximum(x, 0) + np.minimum(a * np.expm1(np.minimum(x, 0) / a), 0)


def k_thresholded_relu(x, alpha):
    return np.where(x > x.dtype.type(alpha), x, x.dtype.type(0))


def k_shrink(x, bias, lambd):
    b, lam = np.asarray(bias).astype(x.dtype), np.asarray(lambd).astype(x.dtype)
    return np.where(x < -lam, x + b, np.where(x > lam, x - b, x.dtype.type(0))).astype(x.dtype)


def k_mish(x):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    return (w * np.tanh(np.logaddexp(w.dtype.type(0), w))).astype(x.dtype)


def k_isnan(x):
    return np.isnan(x)


def k_isinf(x, detect_negative, detect_positive):
    return np.isinf(x) & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))


# --- the table ------------------------------------------------------------------------------
def _unary(op_type, fn, versions, types, cost=1, attrs=no_attrs, kinds=None, out_dtype=None, helpers=()) -> OpDef:
    def infer(node, inputs):
        attrs(node)  # refuses bad attribute values at import, not at run time
        out = infer_unary(node, inputs, types)
        return [TensorType(out_dtype, out[0].shape)] if out_dtype else out

    flops = cost if callable(cost) else per_element(cost)
    return OpDef(op_type, tuple(versions), infer, fn, flops, attrs, helpers=helpers, ATTRS=kinds or {})


def _floats(**defaults):
    """attrs() reading float attributes with their ONNX defaults."""
    def attrs(node):
        return {k: float(node.attr(k, v)) for k, v in defaults.items()}
    return attrs


def _gelu_attrs(node):
    return {"tanh": int(choice(node, "approximate", "none", ("none", "tanh")) == "tanh")}


def _gelu_flops(node, inputs, outputs):
    per = TRANSCENDENTAL + 7 if _gelu_attrs(node)["tanh"] else ERF + 4  # plus the multiplies and adds around it
    return per * outputs[0].numel()


def _isinf_attrs(node):
    return {"detect_negative": int(node.attr("detect_negative", 1)),
            "detect_positive": int(node.attr("detect_positive", 1))}


_F = ((6, FLOATS),)
_T = TRANSCENDENTAL
#: ONNX's Selu defaults, as the float32 values the schema stores.
SELU_ALPHA, SELU_GAMMA = float(np.float32(1.67326319217681884765625)), float(np.float32(1.05070102214813232421875))

OPS = (
    # 13 adds bfloat16 (not an IR dtype); 14 adds int8/16/32/64
    _unary("Relu", k_relu, (6, 13, 14), ((6, FLOATS), (14, FLOATS | SIGNED))),
    _unary("Sigmoid", k_sigmoid, (6, 13), _F, _T + 3, helpers=(_wide,)),  # exp, abs, add, divide
    _unary("HardSwish", k_hard_swish, (14, 22), ((14, FLOATS),), 4, helpers=(_wide,)),  # mul-add, clamp, multiply
    _unary("Gelu", k_gelu, (20,), ((20, FLOATS),), _gelu_flops, _gelu_attrs, {"approximate": STR}, helpers=(_erf64,)),
    _unary("Abs", k_abs, (6, 13), ((6, NUMERIC),)),
    _unary("Neg", k_neg, (6, 13), ((6, FLOATS | SIGNED),)),
    _unary("Reciprocal", k_reciprocal, (6, 13), _F),
    _unary("Floor", k_floor, (6, 13), _F),
    _unary("Ceil", k_ceil, (6, 13), _F),
    _unary("Round", k_round, (11, 22), ((11, FLOATS),)),
    _unary("Sign", k_sign, (9, 13), ((9, NUMERIC),)),
    _unary("Sin", k_sin, (7, 22), ((7, FLOATS),), _T),
    _unary("Cos", k_cos, (7, 22), ((7, FLOATS),), _T),
    _unary("Tan", k_tan, (7, 22), ((7, FLOATS),), _T),
    _unary("Asin", k_asin, (7, 22), ((7, FLOATS),), _T),
    _unary("Acos", k_acos, (7, 22), ((7, FLOATS),), _T),
    _unary("Atan", k_atan, (7, 22), ((7, FLOATS),), _T),
    _unary("Sinh", k_sinh, (9, 22), ((9, FLOATS),), _T),
    _unary("Cosh", k_cosh, (9, 22), ((9, FLOATS),), _T),
    _unary("Asinh", k_asinh, (9, 22), ((9, FLOATS),), _T),
    _unary("Acosh", k_acosh, (9, 22), ((9, FLOATS),), _T),
    _unary("Atanh", k_atanh, (9, 22), ((9, FLOATS),), _T),
    _unary("Softplus", k_softplus, (1, 22), ((1, FLOATS),), 2 * _T + 1),
    _unary("Softsign", k_softsign, (1, 22), ((1, FLOATS),), 3),
    _unary("Elu", k_elu, (6, 22), _F, _T + 2, _floats(alpha=1.0), {"alpha": FLOAT}),
    _unary("Selu", k_selu, (6, 22), _F, _T + 3, _floats(alpha=SELU_ALPHA, gamma=SELU_GAMMA),
           {"alpha": FLOAT, "gamma": FLOAT}),
    _unary("Celu", k_celu, (12,), ((12, FLOATS),), _T + 4, _floats(alpha=1.0), {"alpha": FLOAT}),
    _unary("ThresholdedRelu", k_thresholded_relu, (10, 22), ((10, FLOATS),), 1, _floats(alpha=1.0), {"alpha": FLOAT}),
    _unary("Shrink", k_shrink, (9,), ((9, NUMERIC),), 3, _floats(bias=0.0, lambd=0.5),
           {"bias": FLOAT, "lambd": FLOAT}),
    _unary("Mish", k_mish, (18, 22), ((18, FLOATS),), 3 * _T + 2),
    _unary("IsNaN", k_isnan, (9, 13, 20), ((9, FLOATS),), out_dtype="bool"),
    _unary("IsInf", k_isinf, (10, 20), ((10, FLOATS),), 2, _isinf_attrs,
           {"detect_negative": INT, "detect_positive": INT}, out_dtype="bool"),
)

