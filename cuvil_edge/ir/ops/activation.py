"""Activation functions, one table row each (the op contract: ``_contract.py``; the table's
builder and conventions are :mod:`.unary`'s): Relu, LeakyRelu, ThresholdedRelu, Elu, Selu, Celu,
Sigmoid, HardSigmoid, HardSwish, Gelu, Mish, Softplus, Softsign and Shrink.

Each is elementwise and keeps the input's dtype (float16 is computed by numpy's float32 loops, or
in float32 by ``_wide``, and rounded once); Sigmoid and Gelu run the native kernels where the
target has them. Attribute defaults are ONNX's, as float32 values where the schema stores floats
(LeakyRelu's and HardSigmoid's are the Python floats older modules used: the same float32 after
numpy's weak-scalar rule). Fusion applies Sigmoid's, HardSwish's and Gelu's kernels, and Relu's
ufunc, to the result of Conv and Gemm (``_activation.py``).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._contract import no_scratch
from cuvil_edge.ir.ops._elementwise import ERF, FLOATS, NUMERIC, SIGNED, TRANSCENDENTAL, _erf64, _wide
from cuvil_edge.ir.ops._native import _native_lib, _native_map
from cuvil_edge.ir.ops._scratch import gelu_scratch, hard_swish_scratch, sigmoid_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, FLOAT, STR, choice
from cuvil_edge.ir.ops.unary import _F, _T, _floats, _unary

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_relu(x):
    return np.maximum(x, x.dtype.type(0))


def k_sigmoid(x):
    if TARGET_NATIVE:
        y = _native_map(x, "cuvil_sigmoid_f32")
        if y is not None:
            return y
    w = _wide(x)
    e = np.exp(-np.abs(w))  # exp(-|x|): nothing overflows
    return np.asarray(np.where(w >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype))


def k_hard_swish(x):
    w = _wide(x)
    return np.asarray((w * np.minimum(np.maximum(w * (1 / 6) + 0.5, 0), 1)).astype(x.dtype))


def k_gelu(x, tanh):
    if TARGET_NATIVE:
        y = None if tanh else _native_map(x, "cuvil_gelu_f32")
        if y is not None:
            return y
    w = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if tanh:
            y = 0.5 * w * (1.0 + np.tanh(0.7978845608028654 * (w + 0.044715 * w * w * w)))
        else:
            y = 0.5 * w * (1.0 + _erf64(w * 0.7071067811865476))
        return np.asarray(y.astype(x.dtype))


def k_leaky_relu(x, alpha):
    w = _wide(x)
    return np.asarray(np.where(w >= 0, w, w * alpha).astype(x.dtype))


def k_hard_sigmoid(x, alpha, beta):
    w = _wide(x)
    return np.asarray(np.minimum(np.maximum(w * alpha + beta, 0), 1).astype(x.dtype))


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


# --- attributes and costs ----------------------------------------------------------------------
def _gelu_attrs(node):
    return {"tanh": int(choice(node, "approximate", "none", ("none", "tanh")) == "tanh")}


def _gelu_flops(node, inputs, outputs):
    per = TRANSCENDENTAL + 7 if _gelu_attrs(node)["tanh"] else ERF + 4  # plus the multiplies and adds around it
    return per * outputs[0].numel()


#: ONNX's Selu defaults, as the float32 values the schema stores.
SELU_ALPHA, SELU_GAMMA = float(np.float32(1.67326319217681884765625)), float(np.float32(1.05070102214813232421875))

OPS = (
    # 16 / 22 add bfloat16 only
    _unary(
        "LeakyRelu",
        k_leaky_relu,
        (6, 16),
        _F,
        1,
        _floats(alpha=0.01),
        {"alpha": FLOAT},
        helpers=(_wide,),
        torch=lambda t, node, x: t.nn.functional.leaky_relu(x, node.attr("alpha", 0.01)),
    ),
    _unary(
        "HardSigmoid",
        k_hard_sigmoid,
        (6, 22),
        _F,
        3,
        _floats(alpha=0.2, beta=0.5),  # multiply-add (2), clamp (1)
        {"alpha": FLOAT, "beta": FLOAT},
        helpers=(_wide,),
        torch=lambda t, node, x: t.clamp(node.attr("alpha", 0.2) * x + node.attr("beta", 0.5), 0.0, 1.0),
    ),
    # 13 adds bfloat16 (not an IR dtype); 14 adds int8/16/32/64
    _unary(
        "Relu",
        k_relu,
        (6, 13, 14),
        ((6, FLOATS), (14, FLOATS | SIGNED)),
        torch=lambda t, node, x: t.relu(x),
        scratch=no_scratch,
    ),
    _unary(
        "Sigmoid",
        k_sigmoid,
        (6, 13),
        _F,
        _T + 3,
        helpers=(_wide, _native_lib, _native_map),
        torch=lambda t, node, x: t.sigmoid(x),
        transcendental=True,
        scratch=sigmoid_scratch,
        cost_native="map",
    ),  # exp, abs, add, divide
    _unary(
        "HardSwish",
        k_hard_swish,
        (14, 22),
        ((14, FLOATS),),
        4,
        helpers=(_wide,),
        torch=lambda t, node, x: t.nn.functional.hardswish(x),
        scratch=hard_swish_scratch,
    ),  # mul-add, clamp, multiply
    _unary(
        "Gelu",
        k_gelu,
        (20,),
        ((20, FLOATS),),
        _gelu_flops,
        _gelu_attrs,
        {"approximate": STR},
        helpers=(_erf64, _native_lib, _native_map),
        torch=lambda t, node, x: t.nn.functional.gelu(x, approximate=node.attr("approximate", "none")),
        transcendental=True,
        scratch=gelu_scratch,
        cost_native="map",
    ),
    _unary(
        "Softplus",
        k_softplus,
        (1, 22),
        ((1, FLOATS),),
        2 * _T + 1,
        torch=lambda t, node, x: t.log1p(t.exp(x)),
        transcendental=True,
    ),
    _unary("Softsign", k_softsign, (1, 22), ((1, FLOATS),), 3, torch=lambda t, node, x: t.nn.functional.softsign(x)),
    _unary(
        "Elu",
        k_elu,
        (6, 22),
        _F,
        _T + 2,
        _floats(alpha=1.0),
        {"alpha": FLOAT},
        torch=lambda t, node, x: t.nn.functional.elu(x, node.attr("alpha", 1.0)),
        transcendental=True,
    ),
    _unary(
        "Selu",
        k_selu,
        (6, 22),
        _F,
        _T + 3,
        _floats(alpha=SELU_ALPHA, gamma=SELU_GAMMA),
        {"alpha": FLOAT, "gamma": FLOAT},
        torch=lambda t, node, x: (
            node.attr("gamma", SELU_GAMMA) * t.where(x > 0, x, node.attr("alpha", SELU_ALPHA) * t.expm1(x))
        ),
        transcendental=True,
    ),
    _unary(
        "Celu",
        k_celu,
        (12,),
        ((12, FLOATS),),
        _T + 4,
        _floats(alpha=1.0),
        {"alpha": FLOAT},
        torch=lambda t, node, x: t.nn.functional.celu(x, node.attr("alpha", 1.0)),
    ),
    _unary(
        "ThresholdedRelu",
        k_thresholded_relu,
        (10, 22),
        ((10, FLOATS),),
        1,
        _floats(alpha=1.0),
        {"alpha": FLOAT},
        torch=lambda t, node, x: t.where(x > node.attr("alpha", 1.0), x, t.zeros_like(x)),
    ),
    _unary(
        "Shrink",
        k_shrink,
        (9,),
        ((9, NUMERIC),),
        3,
        _floats(bias=0.0, lambd=0.5),
        {"bias": FLOAT, "lambd": FLOAT},
        torch=lambda t, node, x: t.where(
            x < -node.attr("lambd", 0.5),
            x + node.attr("bias", 0.0),
            t.where(x > node.attr("lambd", 0.5), x - node.attr("bias", 0.0), t.zeros_like(x)),
        ),
    ),
    _unary(
        "Mish",
        k_mish,
        (18, 22),
        ((18, FLOATS),),
        3 * _T + 2,
        torch=lambda t, node, x: t.nn.functional.mish(x),
        transcendental=True,
    ),
)
