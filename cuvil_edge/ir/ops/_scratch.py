"""Scratch facets: the transient bytes one kernel call holds beyond its live inputs and its
outputs, given the memory plan's ``Site`` of the call (device_targets/memory_plan.py; read here
duck-typed, as :func:`_contract.no_scratch` does, since the ir layer imports nothing of the device
layer). Each rule is read from its kernel's source in this package and checked against tracemalloc
(tests/device_targets/test_memory_plan.py): when a kernel changes, change its rule. The op rows
declare them (``scratch=conv_scratch``); the geometry helpers are shared by the window kernels'.
"""

from __future__ import annotations

import math
from typing import Any

from cuvil_edge.ir import dtypes
from cuvil_edge.ir.ops._conv_path import conv_path, gemm_scratch_bytes, im2col_block_rows
from cuvil_edge.ir.ops._packing import gemm_panels


def padded_bytes(x: Any, kernel, strides, pads, dilations, out, item: int, planes: bool = True) -> int:
    """Bytes of the padded copy ``_win_padded`` makes of ``x`` (a Site's bound type; the end pad
    grown for ceil_mode; none when nothing is padded); ``planes=False``: one plane, what a C
    kernel allocates (always)."""
    k, size, grown = len(kernel), math.prod(x.shape[:2]) if planes else 1, False
    for i in range(k):
        need = (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - x.shape[2 + i] - pads[i]
        size *= x.shape[2 + i] + pads[i] + max(pads[i + k], need)
        grown |= pads[i] > 0 or max(pads[i + k], need) > 0
    return size * item if grown or not planes else 0


def window_geometry(s: Any, kernel) -> tuple[tuple, tuple, tuple, tuple]:
    """(strides, pads, dilations, out spatial) of a window op; SAME pads split as the kernels do."""
    k, x, out = len(kernel), s.ins[0], tuple(s.outs[0].shape[2:])
    strides, dilations = tuple(s.attrs.get("strides") or (1,) * k), tuple(s.attrs.get("dilations") or (1,) * k)
    pads = tuple(s.attrs.get("pads") or (0,) * (2 * k))
    if s.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        total = [
            max(0, (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - x.shape[2 + i]) for i in range(k)
        ]
        pads = tuple(t // 2 for t in total) + tuple(t - t // 2 for t in total)
    return strides, pads, dilations, out


def activation_bytes(kind: str, out: int, native: bool) -> int:
    """Bytes ``_activate(y, kind)`` holds beside y and its result (_activation.py, activation.py)."""
    if kind in ("none", "relu", "relu6") or (native and kind in ("sigmoid", "gelu", "swish")):
        return 0
    # numpy sigmoid: e, the mask (1 byte/element), 1/(1+e), e/(1+e), np.where's result before astype;
    # numpy GELU: float64 copies and _erf64's temporaries (data-dependent: 74-115 B/element measured)
    # numpy swish: alpha x, e, the mask, the two quotients, np.where's result, the product
    return {"hardswish": out, "sigmoid": 13 * out // 4, "swish": 21 * out // 4}.get(kind, 20 * out)


def conv_scratch(s: Any) -> int:
    """k_conv, by :func:`conv_path`: native depthwise (C: one padded plane and an accumulator);
    native GEMM (C: one packed block of im2col columns); 1x1 as one matmul; im2col, in cache-sized
    blocks of output rows when the whole would pass 2 MiB or the target has little memory (2-D, one
    group); numpy depthwise per tap; else one matmul per tap (low memory). Then the bias added in
    place (numpy's broadcast buffer) and the activation, a new array."""
    x, w = s.ins[0], s.ins[1]
    kernel, group, kind = tuple(w.shape[2:]), int(s.attrs.get("group", 1)), str(s.attrs.get("activation", "none"))
    strides, pads, dilations, out_sp = window_geometry(s, kernel)
    wide = 4 if x.dtype == "float16" else dtypes.itemsize(x.dtype)  # float16 is computed in float32
    n, c, m, p, taps = x.shape[0], x.shape[1], w.shape[0], math.prod(out_sp), math.prod(kernel)
    y, block = n * m * p * wide, s.buffer(n * m * p * wide, wide)
    path = conv_path(
        len(kernel),
        c,
        m,
        group,
        max(kernel, default=1) == 1,
        any(pads),
        s.native and x.dtype == "float32",
        s.large_scratch,
        c * taps * p * wide,
    )
    if path == "native depthwise":
        plane = padded_bytes(x, kernel, strides, pads, dilations, out_sp, 4, planes=False)
        tail = (kernel[1] - 1) * dilations[1] * 4
        flat = all(st == 1 for st in strides)  # the accumulator spans the padded width
        acc = (out_sp[0] * plane // (4 * (out_sp[0] + dilations[0] * (kernel[0] - 1))) if flat else out_sp[1]) * 4
        return plane + tail + acc + (y + activation_bytes(kind, y, True) if kind == "hardswish" else 0)
    if path == "native gemm":  # the packed weights are held for the module's life: runtime weights
        return max(
            gemm_scratch_bytes(c, x.shape[2:], kernel, strides, pads, dilations, out_sp, gemm_panels()[1]),
            y + activation_bytes(kind, y, True) if kind == "hardswish" else 0,
        )  # the block is freed first
    held = (x.numel() + w.numel()) * wide if wide != dtypes.itemsize(x.dtype) else 0  # float32 copies
    if path == "1x1 matmul":
        main = y + (n * c * p * wide if any(st != 1 for st in strides) else 0)  # reshape copies a strided x
    elif path != "per-tap gemm":
        held += padded_bytes(x, kernel, strides, pads, dilations, out_sp, wide) if any(pads) else 0
        if path == "depthwise taps":
            main = 2 * y + block  # y and one broadcast-scaled window per tap
        elif path == "im2col blocks":  # one block of output rows' columns, about 1 MiB
            rows = im2col_block_rows(out_sp[0], c * taps * out_sp[1] * wide)
            held += c * taps * rows * out_sp[1] * wide
            main = y
        else:
            held += n * c * taps * p * wide  # the im2col copy, bound to a local
            main = y
    else:
        held += padded_bytes(x, kernel, strides, pads, dilations, out_sp, wide)  # the last tap's view keeps it
        main = 2 * y + n * c * p * wide  # y, one tap's window copied by reshape, its matmul product
    if s.native and wide == 4 and x.dtype in ("float32", "float16") and kind != "hardswish" and y >= 4 << 15:
        tail = y  # bias and activation in one native pass, in place
    else:
        tail = y + block if s.input(2) is not None else y  # the bias added in place
        if kind != "none":  # Relu and relu6 in place; the others a new array
            tail = max(tail, (y if kind in ("relu", "relu6") else 2 * y) + activation_bytes(kind, y, s.native))
    if wide != dtypes.itemsize(x.dtype):
        tail = max(tail, y + s.out)  # the final astype to float16
    return held + max(main, tail) - s.out


def gemm_scratch(s: Any) -> int:
    """k_gemm: a@b, scaled by alpha and shifted by c*beta in place (c broadcast through numpy's
    buffer), then the activation (Relu and relu6 in place, the others a new array)."""
    c, y, kind = s.input(2), s.out, str(s.attrs.get("activation", "none"))
    phases = [y]
    if c is not None:
        scaled = s.nbytes(c) if s.attrs.get("beta", 1.0) != 1.0 else 0
        phases.append(y + scaled + (s.buffer(y) if c.numel() not in (1, s.outs[0].numel()) else 0))
    if kind != "none":
        phases.append((y if kind in ("relu", "relu6") else 2 * y) + activation_bytes(kind, y, s.native))
    return max(phases) - y


def fused_mat_mul_scratch(s: Any) -> int:
    """k_fused_mat_mul: one product, then the bias (broadcast through numpy's buffer) and the
    activation in place, or both in one native pass from 32k float32 outputs."""
    y, kind, bias = s.out, str(s.attrs.get("activation", "none")), s.input(2)
    if (
        s.native
        and s.outs[0].dtype == "float32"
        and kind != "hardswish"
        and (bias is not None or kind != "none")
        and s.outs[0].numel() >= 1 << 15
    ):
        return 0
    phases = [y, y + s.buffer(y)] if bias is not None else [y]
    if kind != "none":
        phases.append((y if kind in ("relu", "relu6") else 2 * y) + activation_bytes(kind, y, s.native))
    return max(phases) - y


def pool_scratch(s: Any, average: bool) -> int:
    """MaxPool: native, one padded plane; numpy, the padded input (the last tap's view keeps it)
    and a block buffered for the strided taps. AveragePool: also the total before the division."""
    kernel, x = tuple(s.attrs["kernel_shape"]), s.ins[0]
    strides, pads, dilations, out_sp = window_geometry(s, kernel)
    if s.attrs.get("indices"):
        return 6 * s.out  # np.where per tap: y, index and their replacements
    if s.native and not average and len(kernel) == 2 and x.dtype == "float32":
        return padded_bytes(x, kernel, strides, pads, dilations, out_sp, 4, planes=False)
    padded = padded_bytes(x, kernel, strides, pads, dilations, out_sp, dtypes.itemsize(x.dtype))
    return padded + s.buffer(s.out) + (s.out if average else 0)  # np.maximum(y, tap, out=y) buffers too


def conv_transpose_scratch(s: Any) -> int:
    """k_conv_transpose: y over the taps' full span, one product per tap (every tap at once with
    large scratch), then the bias add or the copy of a cropped span."""
    x, w, y, k = s.ins[0], s.ins[1], s.outs[0], s.ins[0].rank - 2
    kernel, item, pads = tuple(w.shape[2:]), dtypes.itemsize(x.dtype), tuple(s.attrs.get("pads") or (0,) * 2 * k)
    st, di = tuple(s.attrs.get("strides") or (1,) * k), tuple(s.attrs.get("dilations") or (1,) * k)
    span = (
        y.shape[0]
        * y.shape[1]
        * item
        * math.prod(
            max(pads[i] + y.shape[2 + i], (x.shape[2 + i] - 1) * st[i] + di[i] * (kernel[i] - 1) + 1) for i in range(k)
        )
    )
    per_tap = x.shape[0] * int(s.attrs.get("group", 1)) * w.shape[1] * math.prod(x.shape[2:]) * item
    cols, bias = per_tap * math.prod(kernel) if s.large_scratch else 0, s.input(2) is not None
    copied = bias or span != s.out
    last = span + cols + (s.out + (s.buffer(s.out) if bias else 0) if copied else 0)
    return max(span + (cols or per_tap), last) - (s.out if copied else span)


def resize_scratch(s: Any, every_axis: bool = False) -> int:
    """k_resize (nearest): one np.take per resized axis, each result alive while the next is made;
    ``every_axis``: k_upsample, which takes along every axis, then copies with astype (linear: in
    float64, each axis holding its input, its float64 copy, three products and a broadcast block)."""
    x, y = s.ins[0], s.outs[0]
    shape, sizes, linear = list(x.shape), [], bool(s.attrs.get("linear"))
    for axis in range(x.rank):
        if every_axis or y.shape[axis] != x.shape[axis]:
            shape[axis] = y.shape[axis]
            sizes.append(math.prod(shape) * (8 if linear else dtypes.itemsize(y.dtype)))
    if linear:
        sources = [x.numel() * 8] + sizes[:-1]  # out.astype(float64) copies its input at every axis
        return max(
            [p + (p if i else 0) + 3 * e + s.buffer(e, 8) for i, (p, e) in enumerate(zip(sources, sizes, strict=True))]
            + [sizes[-1]]
        )  # the last float64 result beside the output's astype copy
    phases = [a + b for a, b in zip(sizes, sizes[1:], strict=False)] or sizes or [s.out]
    return max(phases + [sizes[-1] + s.out] * every_axis) - s.out


def native_softmax(s: Any) -> bool:
    """k_softmax's C path: float32, normalising the trailing dims (legacy, or the last axis)."""
    rank, axis = len(s.ins[0].shape), int(s.attrs.get("axis", -1))
    return s.native and s.ins[0].dtype == "float32" and (bool(s.attrs.get("legacy")) or axis % rank == rank - 1)


def native_layer_norm(s: Any) -> bool:
    """k_layer_normalization's C path: float32, one output, scale (and bias) of the normalised size."""
    x, rank = s.ins[0], len(s.ins[0].shape)
    size = math.prod(x.shape[int(s.attrs.get("axis", -1)) % rank :]) if rank else 1
    bias = s.input(2)
    return (
        s.native
        and x.dtype == "float32"
        and len(s.outs) == 1
        and s.attrs.get("stash") != "float64"
        and s.ins[1].numel() == size
        and (bias is None or bias.numel() == size)
    )


def max_pool_scratch(s: Any) -> int:
    return pool_scratch(s, False)


def average_pool_scratch(s: Any) -> int:
    return pool_scratch(s, True)


def upsample_scratch(s: Any) -> int:
    return resize_scratch(s, every_axis=True)


def softmax_scratch(s: Any) -> int:
    # x - max (broadcast) lives while exp makes e; then e / sum (broadcast)
    return 0 if native_softmax(s) else s.inp + s.buffer()  # e, then divided in place


def log_softmax_scratch(s: Any) -> int:
    return 2 * s.inp + s.buffer()


def layer_norm_scratch(s: Any) -> int:
    # x.astype(stash) copies (float32 to float32 too), centred; then centred*inv, its astype copy,
    # *scale, +bias: four input-sized arrays at once, plus a broadcast block
    return 0 if native_layer_norm(s) else 3 * s.inp + s.buffer()


def batch_norm_scratch(s: Any) -> int:
    return s.out + s.buffer()


def instance_norm_scratch(s: Any) -> int:
    # w - mean, its square; w - mean, / std, * scale, + bias, astype: two input-sized arrays at once
    return s.inp + s.buffer()


def lrn_scratch(s: Any) -> int:
    # np.pad(x**2) over channels, the running window sum and its products before the astype copy
    return s.inp * (s.ins[0].shape[1] + int(s.attrs.get("size", 1)) - 1) // s.ins[0].shape[1] + 2 * s.inp


def clip_scratch(s: Any) -> int:
    # np.maximum then np.minimum: the first result lives while the second is made
    return s.out if s.input(1) is not None and s.input(2) is not None else 0


def reduce_mean_scratch(s: Any) -> int:
    # x.mean(...), then .astype(x.dtype) copies the (small) result
    return s.out


def gather_scratch(s: Any) -> int:
    # np.where over the int64 indices before np.take
    return 24 * (s.ins[1].numel() if s.input(1) is not None else 0)


# float32 in C: the output only; numpy _erf64: float64 copies and per-range temporaries,
# data-dependent (63-103 B/element measured on N(0, 0.1..10)), GELU adds its float64 products
def erf_scratch(s: Any) -> int:
    return 0 if s.native and s.ins[0].dtype == "float32" else 70 * s.ins[0].numel()


def gelu_scratch(s: Any) -> int:
    return 0 if s.native and s.ins[0].dtype == "float32" else 80 * s.ins[0].numel()


def sigmoid_scratch(s: Any) -> int:
    return activation_bytes("sigmoid", s.out, s.native and s.ins[0].dtype == "float32")


def hard_swish_scratch(s: Any) -> int:
    return activation_bytes("hardswish", s.out, s.native)


def swish_scratch(s: Any) -> int:
    return activation_bytes("swish", s.out, s.native and s.ins[0].dtype == "float32")


def constant_scratch(s: Any) -> int:
    # bytes.fromhex makes the data once more before np.frombuffer(...).copy()
    return s.out
