"""Gemm: Y = alpha * A' @ B' + beta * C, with A' = A.T if transA, B' = B.T if transB; and
CuvilFusedGemm, Gemm followed by an activation (made by the fusion pass; internal, never in an
imported model). One table row each (the op contract: ``_contract.py``); a call site specialised
for its attributes keeps only the transposes, scaling and activation it uses."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _activation, _torch
from cuvil_edge.ir.ops._activation import _activate
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe
from cuvil_edge.ir.ops._scratch import gemm_scratch
from cuvil_edge.ir.ops._util import FLOAT, INT, STR, broadcast, need, same_dtype, want_dtype


def k_gemm(a, b, c=None, *, alpha, beta, trans_a, trans_b, activation="none"):
    y = (a.T if trans_a else a) @ (b.T if trans_b else b)  # a new array: scaled and shifted in place
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None:
        y += c if beta == 1.0 else c * c.dtype.type(beta)
    if activation != "none":
        y = _activate(y, activation)
    return y


def _attrs(node):
    return {
        "alpha": float(node.attr("alpha", 1.0)),
        "beta": float(node.attr("beta", 1.0)),
        "trans_a": int(node.attr("transA", 0)),
        "trans_b": int(node.attr("transB", 0)),
        "activation": _activation.activation(node),
    }


def _mkn(node, a, b):
    if a.rank != 2 or b.rank != 2:
        raise ShapeInferenceError(f"{node.describe()} needs 2-D A and B, got {a} and {b}")
    m, k = reversed(a.shape) if node.attr("transA", 0) else a.shape
    k2, n = reversed(b.shape) if node.attr("transB", 0) else b.shape
    if k != k2:
        raise ShapeInferenceError(f"{node.describe()}: inner dims differ ({k} vs {k2}) for A {a} and B {b}")
    return m, k, n


def _infer(node, inputs):
    _attrs(node)
    need(node, inputs, 2, optional=1)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int32", "int64"})
    m, _, n = _mkn(node, inputs[0], inputs[1])
    if len(inputs) > 2 and inputs[2] is not None:
        if broadcast(node, (m, n), inputs[2].shape) != (m, n):
            raise ShapeInferenceError(f"{node.describe()}: C {inputs[2]} does not broadcast to ({m}, {n})")
    return [TensorType(dtype, (m, n))]


def _flops(node, inputs, outputs):
    m, k, n = _mkn(node, inputs[0], inputs[1])
    bias = m * n if len(inputs) > 2 and inputs[2] is not None else 0
    return 2 * m * k * n + bias + _activation.activation_flops(_activation.activation(node), outputs)


def _macs(node, inputs, outputs):
    """Multiply-accumulates of A' @ B' (bias and activation excluded)."""
    k = _mkn(node, inputs[0], inputs[1])[1]
    return outputs[0].numel() * (k if isinstance(k, int) else 1)


_ATTRS = {"alpha": FLOAT, "beta": FLOAT, "transA": INT, "transB": INT}

OPS = (
    OpDef(
        "Gemm",
        (7, 9, 11, 13),
        batch=BatchRule("gemm", data=None),
        infer=_infer,
        fn=k_gemm,
        flops=_flops,
        attrs=_attrs,
        helpers=_activation.HELPERS,
        ATTRS=_ATTRS,
        macs=_macs,
        torch=_torch.gemm,
        torch_check=_torch.check_activation,
        trainable="gemm",
        scratch=gemm_scratch,
        cost_kind="gemm",
        probes=(Probe((16, 64), {"transB": 1}, lambda: (np.eye(64, dtype=np.float32), np.zeros(64, np.float32))),),
    ),
    OpDef(
        "CuvilFusedGemm",
        (1,),
        batch=BatchRule("gemm", data=None),
        infer=_infer,
        fn=k_gemm,
        flops=_flops,
        attrs=_attrs,
        helpers=_activation.HELPERS,
        ATTRS={**_ATTRS, "activation": STR},
        macs=_macs,
        torch=_torch.gemm,
        torch_check=_torch.check_activation,
        trainable="gemm",
        scratch=gemm_scratch,
        cost_kind="gemm",
    ),
)
