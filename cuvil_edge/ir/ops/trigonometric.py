"""Trigonometric and hyperbolic functions and their inverses, one table row each (the op contract:
``_contract.py``; the table's builder and conventions are :mod:`.unary`'s). Out-of-domain inputs
give NaN (or an infinity at a pole) as ONNX's reference does, without numpy's warnings.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._contract import no_scratch
from cuvil_edge.ir.ops._elementwise import FLOATS
from cuvil_edge.ir.ops.unary import _T, _unary


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
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


# --- the table ------------------------------------------------------------------------------
OPS = (
    _unary("Sin", k_sin, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.sin(x), scratch=no_scratch),
    _unary("Cos", k_cos, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.cos(x), scratch=no_scratch),
    _unary("Tan", k_tan, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.tan(x)),
    _unary("Asin", k_asin, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.asin(x)),
    _unary("Acos", k_acos, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.acos(x)),
    _unary("Atan", k_atan, (7, 22), ((7, FLOATS),), _T, torch=lambda t, node, x: t.atan(x)),
    _unary("Sinh", k_sinh, (9, 22), ((9, FLOATS),), _T, torch=lambda t, node, x: t.sinh(x)),
    _unary("Cosh", k_cosh, (9, 22), ((9, FLOATS),), _T, torch=lambda t, node, x: t.cosh(x)),
    _unary("Asinh", k_asinh, (9, 22), ((9, FLOATS),), _T, torch=lambda t, node, x: t.asinh(x)),
    _unary("Acosh", k_acosh, (9, 22), ((9, FLOATS),), _T, torch=lambda t, node, x: t.acosh(x)),
    _unary("Atanh", k_atanh, (9, 22), ((9, FLOATS),), _T, torch=lambda t, node, x: t.atanh(x)),
)
