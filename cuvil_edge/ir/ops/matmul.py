"""Matrix products with numpy matmul semantics (1-D operands promoted, batch dims broadcast), one
table row each (the op contract: ``_contract.py``):

* MatMul: float and 32/64-bit integer operands of one dtype.
* MatMulInteger: int32 Y = (A - a_zero_point) @ (B - b_zero_point) for int8/uint8 A and B
  (a 1-D a_zero_point is per row, a 1-D b_zero_point per column).
* QLinearMatMul: y = saturate(rint((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp);
  21 adds float8 inputs and float16/bfloat16 scales (float8 is rejected).
* CuvilFusedMatMul (made by ``passes/fuse_bias.py``, internal): a Linear on a batch of sequences,
  MatMul(A, B) + C then an activation, B 2-D and C of B's columns; one product over A's collapsed
  leading dims, the bias and activation in place (natively in one pass where the target has it).

FLOPs count a multiply-add as 2 (QLinearMatMul adds 3 per output to requantize); MACs are the
multiply-adds of the product.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _activation, _torch
from cuvil_edge.ir.ops._activation import _activate
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe, no_scratch
from cuvil_edge.ir.ops._int8 import _i8_ops
from cuvil_edge.ir.ops._native import _native_epilogue
from cuvil_edge.ir.ops._quant import (
    _q_centered_a,
    _q_centered_b,
    _q_requantize,
    _q_saturate,
    quant_dtype,
    same_pair,
    scale_dtype,
)
from cuvil_edge.ir.ops._scratch import fused_mat_mul_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, STR, broadcast, need, same_dtype, want_dtype

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]
TARGET_INT8_DOT = DEFAULT_CAPABILITIES["TARGET_INT8_DOT"]


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_mat_mul(a, b):
    if a.ndim > 2 and b.ndim == 2:
        # one (rows x k) @ (k x n) product: numpy would make one BLAS call per leading index
        rows = 1
        for size in a.shape[:-1]:
            rows *= size
        return np.matmul(a.reshape(rows, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[1],))
    return np.asarray(np.matmul(a, b))


def k_fused_mat_mul(a, b, c=None, *, activation="none"):
    rows = 1
    for size in a.shape[:-1]:
        rows *= size
    y = np.matmul(a.reshape(rows, a.shape[-1]), b)  # this call's own (rows x N) array
    if TARGET_NATIVE:
        # the bias along each row and the activation in one pass over y (from 32k outputs)
        fits = y.dtype == np.float32 and (c is not None or activation != "none") and y.size >= 1 << 15
        if fits and _native_epilogue(y, None if c is None else c.reshape(-1), rows, 1, y.shape[1], 1, activation):
            return y.reshape(a.shape[:-1] + (b.shape[1],))
    if c is not None:
        y += c.reshape(-1)
    if activation != "none":
        y = _activate(y, activation)
    return y.reshape(a.shape[:-1] + (b.shape[1],))


def k_mat_mul_integer(a, b, a_zero_point=None, b_zero_point=None):
    if TARGET_INT8_DOT != "none":
        # int8 products with int32 sums in C (native_int8.c): a 2-D B, a per-tensor a_zero_point
        i8 = _i8_ops() if b.ndim == 2 and a.ndim >= 2 else None
        y = None if i8 is None else i8.matmul(a, a_zero_point, b, b_zero_point, None, None, np.int32)
        if y is not None:
            return y
    return np.asarray(np.matmul(_q_centered_a(a, a_zero_point), _q_centered_b(b, b_zero_point)), dtype=np.int32)


def k_q_linear_mat_mul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    row_scale = a_scale.astype(np.float32)
    if a_scale.ndim == 1 and a_scale.size > 1 and a.ndim >= 2:
        row_scale = row_scale.reshape(-1, 1)
    multiplier = row_scale * b_scale.astype(np.float32) / y_scale.astype(np.float32)
    if TARGET_INT8_DOT != "none":
        # the same sums in C, requantized in the store; a per-row a_scale stays on the numpy path
        i8 = _i8_ops() if b.ndim == 2 and a.ndim >= 2 and row_scale.size == 1 else None
        y = None if i8 is None else i8.matmul(a, a_zp, b, b_zp, multiplier, y_zp, y_zp.dtype)
        if y is not None:
            return y
    acc = np.matmul(_q_centered_a(a, a_zp), _q_centered_b(b, b_zp))
    return _q_requantize(acc, multiplier, y_zp, y_zp.dtype)


# --- inference and costs ----------------------------------------------------------------------
def split_dims(node, a, b):
    """(batch dims, m, k, n) of ``a @ b``, with None for the m/n of a promoted 1-D operand.

    Raises:
        ShapeInferenceError: a scalar operand, or inner dims that differ.
    """
    if a.rank == 0 or b.rank == 0:
        raise ShapeInferenceError(f"{node.describe()} needs operands of rank >= 1, got {a} and {b}")
    a_shape = (1, *a.shape) if a.rank == 1 else a.shape
    b_shape = (*b.shape, 1) if b.rank == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ShapeInferenceError(
            f"{node.describe()}: inner dims differ ({a_shape[-1]} vs {b_shape[-2]}) for {a} @ {b}"
        )
    batch = broadcast(node, a_shape[:-2], b_shape[:-2])
    return batch, None if a.rank == 1 else a_shape[-2], a_shape[-1], None if b.rank == 1 else b_shape[-1]


def _product(node, a, b, dtype):
    batch, m, _, n = split_dims(node, a, b)
    return TensorType(dtype, (*batch, *(d for d in (m, n) if d is not None)))


def _infer_mat_mul(node, inputs):
    need(node, inputs, 2)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS | {"int32", "int64", "uint32", "uint64"})
    return [_product(node, *inputs, dtype)]


def _infer_fused_mat_mul(node, inputs):
    need(node, inputs, 2, optional=1)
    _activation.activation(node)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    a, b, c = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    if a.rank < 2 or b.rank != 2:
        raise ShapeInferenceError(f"{node.describe()} needs A of rank >= 2 and a 2-D B, got {a} and {b}")
    if c is not None and (not isinstance(b.shape[1], int) or c.numel() != b.shape[1]):
        raise ShapeInferenceError(f"{node.describe()}: the bias {c} must hold one value per column of B {b}")
    return [_product(node, a, b, dtype)]


def _fused_flops(node, inputs, outputs):
    bias = outputs[0].numel() if len(inputs) > 2 and inputs[2] is not None else 0
    return 2 * _AB(node, inputs, outputs) + bias + _activation.activation_flops(_activation.activation(node), outputs)


def _infer_mat_mul_integer(node, inputs):
    need(node, inputs, 2, optional=2)
    a, b = inputs[0], inputs[1]
    quant_dtype(node, a, "A")
    quant_dtype(node, b, "B")
    same_pair(node, a, inputs[2] if len(inputs) > 2 else None, "A and a_zero_point")
    same_pair(node, b, inputs[3] if len(inputs) > 3 else None, "B and b_zero_point")
    return [_product(node, a, b, "int32")]


def _infer_q_linear_mat_mul(node, inputs):
    need(node, inputs, 8)
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
    for t, what in ((a, "a"), (b, "b"), (y_zp, "y_zero_point")):
        quant_dtype(node, t, what)
    same_pair(node, a, a_zp, "a and a_zero_point")
    same_pair(node, b, b_zp, "b and b_zero_point")
    scale_dtype(node, [a_scale, b_scale, y_scale])
    if y_scale.numel() != 1:
        raise ShapeInferenceError(f"{node.describe()}: y_scale must be a scalar, got {y_scale}")
    return [_product(node, a, b, y_zp.dtype)]


def _macs_of(node, a, b):
    batch, m, k, n = split_dims(node, a, b)
    sizes = [d if isinstance(d, int) else 1 for d in (*batch, m or 1, k, n or 1)]
    return int(np.prod(sizes, dtype=np.int64))


def _operands(first, second):
    """flops/macs over the operands at input positions ``first`` and ``second``."""

    def macs(node, inputs, outputs):
        return _macs_of(node, inputs[first], inputs[second])

    return macs


def _twice(macs, extra_per_output=0):
    def flops(node, inputs, outputs):
        return 2 * macs(node, inputs, outputs) + extra_per_output * outputs[0].numel()

    return flops


_AB, _QAB = _operands(0, 1), _operands(0, 3)

OPS = (
    OpDef(
        "MatMul",
        (1, 9, 13),
        batch=BatchRule("matmul", data=(0, 1), slots=(0, 1)),
        infer=_infer_mat_mul,
        fn=k_mat_mul,
        flops=_twice(_AB),
        macs=_AB,
        torch=_torch.matmul,
        trainable="matmul",
        scratch=no_scratch,
        cost_kind="matmul",
        probes=(
            Probe((16, 64), consts=lambda: (np.eye(64, dtype=np.float32),)),
            Probe((1, 16, 64), consts=lambda: (np.eye(64, dtype=np.float32),)),
        ),
    ),
    OpDef(
        "CuvilFusedMatMul",
        (1,),
        # B and C are the Linear's weight and bias: a sample on B's columns would meet C's entries by
        # its position in the batch, so only A carries samples
        batch=BatchRule("matmul", data=(0,), slots=(0, 1)),
        infer=_infer_fused_mat_mul,
        fn=k_fused_mat_mul,
        flops=_fused_flops,
        attrs=lambda node: {"activation": _activation.activation(node)},
        helpers=_activation.HELPERS + (_native_epilogue,),
        ATTRS={"activation": STR},
        macs=_AB,
        torch=_torch.fused_matmul,
        torch_check=_torch.check_activation,
        trainable="matmul",
        scratch=fused_mat_mul_scratch,
        cost_kind="fused matmul",
    ),
    OpDef(
        "MatMulInteger",
        (10,),
        batch=BatchRule("matmul", data=(0, 1), slots=(0, 1), quant=((2,), (3,))),
        infer=_infer_mat_mul_integer,
        fn=k_mat_mul_integer,
        flops=_twice(_AB),
        helpers=(_q_centered_a, _q_centered_b, _i8_ops),
        macs=_AB,
        cost_kind="int8 matmul",
    ),
    OpDef(
        "QLinearMatMul",
        (10, 21),
        batch=BatchRule("matmul", data=(0, 3), slots=(0, 3), quant=((1, 2, 6, 7), (4, 5, 6, 7))),
        infer=_infer_q_linear_mat_mul,
        fn=k_q_linear_mat_mul,
        flops=_twice(_QAB, 3),
        helpers=(_q_centered_a, _q_centered_b, _q_saturate, _q_requantize, _i8_ops),
        macs=_QAB,
        cost_kind="int8 matmul",
    ),
)
