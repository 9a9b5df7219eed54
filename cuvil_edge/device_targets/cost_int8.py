"""What the cost model knows about the int8 kernels (``ir/ops/native_int8.c``).

The ops of cost kind "int8 conv" and "int8 matmul" (QLinearConv, ConvInteger, QLinearMatMul,
MatMulInteger) run one int8 GEMM with int32 sums (im2col'd per image for a convolution) where the
target has native kernels (``TARGET_INT8_DOT`` is not "none"); its products are costed at the int8
rate of the target's dot-product instruction, not as float: ``kernel_ns["int8_mac"]`` (ns per
multiply-accumulate, measured) where the spec has it, else ``native_gflops`` (the one-thread rate
of the auto-vectorised float C kernels) times the instruction's factor in :data:`INT8_FACTORS`.
Calls the C kernel does not take (grouped convolutions, per-row zero points) fall back to numpy's
int32 products, at the numpy rate.
"""

from __future__ import annotations

import math

from cuvil_edge.device_targets.cost_work import Work
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node, TensorType

#: the cost kinds (OpDef facet) of the ops the int8 kernel runs
INT8_KINDS = ("int8 conv", "int8 matmul")
INT8_KIND = "native int8 gemm"
#: int8 ops (2 per MAC) per second relative to native_gflops, per TARGET_INT8_DOT. Measured on a
#: 2-core AVX2 EPYC: the int8 GEMM reaches ~110 GOP/s on ResNet-18's 3x3 convolutions; vpdpbusd and
#: sdot fuse the widening and the add (about twice vpmaddubsw's rate); the widening loop about the
#: float kernels' own rate.
INT8_FACTORS = {"vnni": 8.0, "avx2": 4.0, "sdot": 6.0, "widen": 1.0}


def _size(shape: tuple[int | str, ...]) -> int:
    """Elements of a static shape (a symbolic dim raises instead of multiplying as a string)."""
    return math.prod(int(d) for d in shape)


def int8_products(node: Node, ins: tuple[TensorType | None, ...], outs) -> tuple[tuple[int, int, int, int], ...]:
    """The (m, k, n, count) products the int8 kernel makes for ``node``; () where it does not take
    the call (a grouped convolution, a non-2-D one, a batched weight)."""
    # QLinear* ops take (x, x_scale, x_zero_point, w, ...); *Integer ops (x, w, ...)
    w_index = 3 if node.op_type.startswith("QLinear") else 1
    if ops.get(node.op_type, node.describe()).cost_kind == "int8 conv":
        w = ins[w_index]
        if w is None or len(w.shape) != 4 or int(node.attr("group", 1)) != 1:
            return ()
        y = outs[0]
        return ((int(w.shape[0]), _size(w.shape[1:]), _size(y.shape[2:]), int(y.shape[0])),)
    b = ins[w_index]
    a = ins[0]
    if b is None or a is None or len(b.shape) != 2 or len(a.shape) < 2:
        return ()
    return ((int(b.shape[1]), int(b.shape[0]), _size(a.shape[:-1]), 1),)


def int8_work(node: Node, ins, outs, caps: dict):
    """cost_model's work record of an int8 node whose products run in the C kernel on a target with
    it (capabilities ``caps``), else None (the node is costed as any other)."""
    if (
        ops.get(node.op_type, node.describe()).cost_kind not in INT8_KINDS
        or caps.get("TARGET_INT8_DOT", "none") == "none"
    ):
        return None
    products = int8_products(node, ins, outs)
    if not products:
        return None
    return Work(INT8_KIND, gemm=products, native=True)


def int8_seconds(spec, products: tuple[tuple[int, int, int, int], ...]) -> float:
    """Seconds of the int8 kernel's products on ``spec``."""
    macs = sum(m * k * n * count for m, k, n, count in products)
    if "int8_mac" in spec.kernel_ns:
        return macs * spec.kernel_ns["int8_mac"] * 1e-9
    rate = (spec.native_gflops or spec.peak_gflops.get("float32", 1.0) / 8) * INT8_FACTORS.get(spec.int8_dot, 1.0)
    return 2.0 * macs / (rate * 1e9)


__all__ = ["INT8_KINDS", "INT8_KIND", "INT8_FACTORS", "int8_products", "int8_work", "int8_seconds"]
