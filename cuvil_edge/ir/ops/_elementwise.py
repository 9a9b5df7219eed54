"""Helpers shared by the elementwise op modules: per-version dtype tables,
n-way broadcasting, unary/binary inference, costs, and the kernels' helpers ``_erf64`` and ``_wide``.

A *dtype table* is a tuple of ``(since_version, dtypes)`` pairs in ascending
order, copied from the ONNX schemas' type constraints (restricted to the dtypes
the IR has); a node uses the newest entry not above its opset.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import Dim, Node, TensorType
from cuvil_edge.ir.ops._util import broadcast, need, same_dtype

FLOATS = dtypes.FLOATS
SIGNED = frozenset({"int8", "int16", "int32", "int64"})
INTS = SIGNED | {"uint8", "uint16", "uint32", "uint64"}
#: Every numeric IR dtype (floats and integers; not bool).
NUMERIC = FLOATS | INTS
#: Add/Sub/Mul/Div before opset 14 (int32/int64/uint32/uint64 and floats).
ARITH_OLD = FLOATS | {"int32", "int64", "uint32", "uint64"}
ARITH_14 = FLOATS | INTS
ALL = dtypes.SUPPORTED

#: Cost model, in floating-point-operation equivalents per output element.
#: Simple arithmetic, comparisons, selects and casts count 1.  A transcendental
#: (exp, log, tanh, sqrt counted alike) costs TRANSCENDENTAL: roughly the
#: polynomial evaluation a vector math library runs.  Erf is a rational
#: approximation plus an exp: ERF.
TRANSCENDENTAL = 8
ERF = 20


def allowed(node: Node, table: Sequence[tuple[int, frozenset[str]]]) -> frozenset[str]:
    """The dtypes ``table`` allows at ``node.version``."""
    chosen = table[0][1]
    for since, kinds in table:
        if since <= node.version:
            chosen = kinds
    return chosen


def want(node: Node, t: TensorType, table: Sequence[tuple[int, frozenset[str]]], what: str = "input") -> None:
    """Raise :class:`UnsupportedAttributeError` naming the node when ``t.dtype`` is not allowed at its opset."""
    kinds = allowed(node, table)
    if t.dtype not in kinds:
        raise UnsupportedAttributeError(
            f"{node.describe()} does not support {what} dtype {t.dtype} at opset {node.version}; "
            f"supported: {', '.join(sorted(kinds))}"
        )


def broadcast_all(node: Node, shapes: Sequence[Sequence[Dim]]) -> tuple[Dim, ...]:
    """Multidirectional broadcast of any number of shapes."""
    out: tuple[Dim, ...] = tuple(shapes[0])
    for shape in shapes[1:]:
        out = broadcast(node, out, shape)
    return out


def infer_unary(node: Node, inputs, table) -> list[TensorType]:
    need(node, inputs, 1)
    want(node, inputs[0], table)
    return [inputs[0]]


def infer_binary(node: Node, inputs, table, out_dtype: str | None = None) -> list[TensorType]:
    """Two same-dtype inputs, broadcast; output dtype ``out_dtype`` or the inputs'."""
    need(node, inputs, 2)
    dtype = same_dtype(node, inputs)
    want(node, inputs[0], table)
    return [TensorType(out_dtype or dtype, broadcast(node, inputs[0].shape, inputs[1].shape))]


#: ``_erf64`` and ``_wide`` are real functions; the op contract's kernels list them as helpers.
#: W. J. Cody's rational Chebyshev approximations (SPECFUN CALERF, 1969/1990),
#: evaluated in float64: relative error below 1e-15 on the whole real line, so
#: float32/float16 results are correctly rounded except at ties.
def _erf64(x):
    # each element is evaluated only by the approximation of its range (|x| <= 0.46875, <= 4, beyond)
    x = np.asarray(x, dtype=np.float64)
    y = np.abs(x)
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        near = y <= 0.46875
        xs = x[near]
        z = xs * xs
        num, den = 1.85777706184603153e-1 * z, z
        for a, b in (
            (3.16112374387056560, 2.36012909523441209e1),
            (1.13864154151050156e2, 2.44024637934444173e2),
            (3.77485237685302021e2, 1.28261652607737228e3),
        ):
            num, den = (num + a) * z, (den + b) * z
        out[near] = xs * (num + 3.20937758913846947e3) / (den + 2.84423683343917062e3)
        far = ~near
        xf = x[far]
        t = np.minimum(np.abs(xf), 30.0)
        erfc = np.empty_like(t)
        mid = t <= 4.0
        tm = t[mid]
        num, den = 2.15311535474403846e-8 * tm, tm
        for c, d in (
            (5.64188496988670089e-1, 1.57449261107098347e1),
            (8.88314979438837594, 1.17693950891312499e2),
            (6.61191906371416295e1, 5.37181101862009858e2),
            (2.98635138197400131e2, 1.62138957456669019e3),
            (8.81952221241769090e2, 3.29079923573345963e3),
            (1.71204761263407058e3, 4.36261909014324716e3),
            (2.05107837782607147e3, 3.43936767414372164e3),
        ):
            num, den = (num + c) * tm, (den + d) * tm
        erfc[mid] = (num + 1.23033935479799725e3) / (den + 1.23033935480374942e3)
        tb = t[~mid]
        w = 1.0 / (tb * tb)
        num, den = 1.63153871373020978e-2 * w, w
        for p, q in (
            (3.05326634961232344e-1, 2.56852019228982242),
            (3.60344899949804439e-1, 1.87295284992346725),
            (1.25781726111229246e-1, 5.27905102951428412e-1),
            (1.60837851487422766e-2, 6.05183413124413191e-2),
        ):
            num, den = (num + p) * w, (den + q) * w
        erfc[~mid] = (
            5.6418958354775628695e-1 - w * (num + 6.58749161529837803e-4) / (den + 2.33520497626869185e-3)
        ) / tb
        u = np.trunc(t * 16.0) / 16.0
        erfc = np.exp(-u * u) * np.exp(-(t - u) * (t + u)) * erfc
        large = (0.5 - erfc) + 0.5
        out[far] = np.where(xf < 0, -large, large)
    return out


#: float16 is computed in float32 and rounded once at the end (as onnxruntime's
#: CPU kernels do), so fp16 results stay within one rounding of the exact value.
def _wide(x):
    return x.astype(np.float32) if x.dtype == np.float16 else x
