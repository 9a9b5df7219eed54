"""ConvTranspose: the gradient of Conv. W is (C, M/group, *kernel); each output axis is
stride*(in-1) + output_padding + dilation*(k-1) + 1 - pads, or ``output_shape`` / in*stride
(auto_pad SAME_*) with the padding derived as the spec and onnxruntime do (odd totals: SAME_UPPER
pads more at the end, otherwise at the start)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import MAX_DIM, MAX_ELEMENTS, TensorType
from cuvil_edge.ir.ops._contract import BatchRule, OpDef
from cuvil_edge.ir.ops._scratch import conv_transpose_scratch
from cuvil_edge.ir.ops._util import (
    DEFAULT_CAPABILITIES,
    INT,
    INTS,
    WINDOW_ATTRS,
    ints,
    need,
    same_dtype,
    text,
    want_dtype,
)

#: The interpreter's capability (targets substitute their own in compiled modules).
TARGET_LARGE_SCRATCH = DEFAULT_CAPABILITIES["TARGET_LARGE_SCRATCH"]


def static_attrs(node, k: int):
    """(strides, pads, dilations, output_padding, output_shape, auto_pad, group) with defaults."""
    strides = ints(node, "strides") or [1] * k
    dilations = ints(node, "dilations") or [1] * k
    pads = ints(node, "pads") or [0] * (2 * k)
    out_pad = ints(node, "output_padding") or [0] * k
    out_shape = ints(node, "output_shape")[-k:] if ints(node, "output_shape") else []
    auto_pad, group = text(node, "auto_pad", "NOTSET"), int(node.attr("group", 1))
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise UnsupportedAttributeError(f"{node.describe()} auto_pad={auto_pad!r} is not supported")
    if len(strides) != k or len(dilations) != k or len(pads) != 2 * k or len(out_pad) != k:
        raise ShapeInferenceError(
            f"{node.describe()}: strides/pads/dilations/output_padding do not fit {k} spatial dims"
        )
    if out_shape and len(out_shape) != k:
        raise ShapeInferenceError(
            f"{node.describe()}: output_shape {ints(node, 'output_shape')} needs {k} spatial dims"
        )
    if min(strides + dilations) <= 0 or min(pads + out_pad) < 0 or group < 1:
        raise ShapeInferenceError(f"{node.describe()}: non-positive strides/dilations/group or negative pads")
    return strides, pads, dilations, out_pad, out_shape, auto_pad, group


def _convt_geometry(spatial, kernel, strides, pads, dilations, out_pad, out_shape, auto_pad):
    """(pads at the start, output size) per spatial axis."""
    n = len(kernel)
    begin, end, out = [], [], []
    for i in range(n):
        full = strides[i] * (spatial[i] - 1) + out_pad[i] + dilations[i] * (kernel[i] - 1) + 1
        if out_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = out_shape[i] if out_shape else spatial[i] * strides[i]
            total = max(0, full - size)
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        else:
            b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + n])
            size = full - b - e
        begin.append(b)
        end.append(e)
        out.append(size)
    return tuple(begin), tuple(out)


def k_conv_transpose(x, w, b=None, *, strides, pads, dilations, output_padding, output_shape, auto_pad, group):
    n, kernel = x.shape[0], w.shape[2:]
    k, mg, cg = len(kernel), w.shape[1], x.shape[1] // group
    st = strides or (1,) * k
    di = dilations or (1,) * k
    begin, out = _convt_geometry(
        x.shape[2:],
        kernel,
        st,
        pads or (0,) * (2 * k),
        di,
        output_padding or (0,) * k,
        output_shape[-k:] if output_shape else (),
        auto_pad,
    )
    spatial, p = x.shape[2:], 1
    for size in spatial:
        p *= size
    # scratch long enough for every tap and for the requested output window
    span = [max(begin[i] + out[i], (spatial[i] - 1) * st[i] + di[i] * (kernel[i] - 1) + 1) for i in range(k)]
    y = np.zeros((n, group, mg) + tuple(span), dtype=x.dtype)
    xg = x.reshape(n, group, cg, p)
    wg = w.reshape(group, cg, mg, -1)
    if TARGET_LARGE_SCRATCH:
        # one batched matmul for every tap at once, then scatter-add each tap's slab
        cols = np.matmul(wg.transpose(0, 3, 2, 1).reshape(group, -1, cg), xg)
        cols = cols.reshape((n, group, wg.shape[3], mg) + tuple(spatial))
    for index, tap in enumerate(np.ndindex(*kernel)):
        if TARGET_LARGE_SCRATCH:
            part = cols[:, :, index]
        else:
            part = np.matmul(wg[:, :, :, index].transpose(0, 2, 1), xg).reshape((n, group, mg) + tuple(spatial))
        window = tuple(
            slice(t * d, t * d + (s_in - 1) * s + 1, s) for t, d, s_in, s in zip(tap, di, spatial, st, strict=True)
        )
        y[(slice(None), slice(None), slice(None)) + window] += part
    y = y[(slice(None), slice(None), slice(None)) + tuple(slice(bg, bg + o) for bg, o in zip(begin, out, strict=True))]
    y = y.reshape((n, group * mg) + tuple(out))
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * k)
    return np.ascontiguousarray(y)


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    x, w = inputs[0].shape, inputs[1].shape
    if len(x) < 3 or len(w) != len(x) or not all(isinstance(d, int) for d in (x[1], *w)):
        raise ShapeInferenceError(
            f"{node.describe()} needs X (N, C, *spatial) and a static W of the same rank, got {x}, {w}"
        )
    k = len(x) - 2
    strides, pads, dilations, out_pad, out_shape, auto_pad, group = static_attrs(node, k)
    if x[1] != w[0] or w[0] % group:
        raise ShapeInferenceError(f"{node.describe()}: X channels {x[1]} and W {w} do not fit group={group}")
    if ints(node, "kernel_shape") not in ([], list(w[2:])):
        raise ShapeInferenceError(f"{node.describe()}: kernel_shape differs from W {w}")
    if any(isinstance(d, str) for d in x[2:]):
        raise ShapeInferenceError(f"{node.describe()} needs static spatial dims, got {x}")
    if min(w[1:]) < 1:
        raise ShapeInferenceError(f"{node.describe()}: W {w} has an empty output-channel or kernel axis")
    begin, out = _convt_geometry(x[2:], w[2:], strides, pads, dilations, out_pad, out_shape, auto_pad)
    _check_scratch(node, x, w, strides, dilations, group, begin, out)
    if min(out) <= 0:
        raise ShapeInferenceError(f"{node.describe()}: output spatial size {list(out)} is not positive")
    m = w[1] * group
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (m,):
        raise ShapeInferenceError(f"{node.describe()}: bias {inputs[2]} must have shape ({m},)")
    return [TensorType(dtype, (x[0], m, *out))]


def _check_scratch(node, x, w, strides, dilations, group, begin, out) -> None:
    """The kernel accumulates into a buffer that holds every tap and the output window on each axis
    (``k_conv_transpose``'s ``span``); with ``output_shape`` or ``output_padding`` that can be far
    longer than the output: bound it like a tensor.

    Raises:
        ShapeInferenceError: the buffer holds more than MAX_DIM on an axis or MAX_ELEMENTS in all.
    """
    full = [
        max(b + o, s * (size - 1) + d * (k - 1) + 1)
        for b, o, s, size, d, k in zip(begin, out, strides, x[2:], dilations, w[2:], strict=True)
    ]
    total = (x[0] if isinstance(x[0], int) else 1) * w[1] * group
    for f in full:
        total *= f
    if max(full) > MAX_DIM or total > MAX_ELEMENTS:
        raise ShapeInferenceError(
            f"{node.describe()}: strides {strides} on {x} need a {full} accumulator per "
            f"channel, over the IR's limits ({MAX_DIM} per axis, {MAX_ELEMENTS} elements)"
        )


def flops(node, inputs, outputs):
    x, w = inputs[0], inputs[1].shape
    taps = 1
    for d in w[1:]:
        taps *= d
    bias = outputs[0].numel() if len(inputs) > 2 and inputs[2] is not None else 0
    return 2 * x.numel() * taps + bias


def _attrs(node):
    """The attributes as given (empty tuples when absent; the kernel fills defaults)."""
    raw = {
        key: tuple(ints(node, name))
        for key, name in (
            ("strides", "strides"),
            ("pads", "pads"),
            ("dilations", "dilations"),
            ("output_padding", "output_padding"),
            ("output_shape", "output_shape"),
        )
    }
    return {**raw, "auto_pad": text(node, "auto_pad", "NOTSET"), "group": int(node.attr("group", 1))}


def _macs(node, inputs, outputs):
    """Every input element meets every tap of its group's filters: N*C*spatial_in * (M/group * prod(kernel))."""
    w = inputs[1]
    return inputs[0].numel() * (w.numel() // w.shape[0]) if w.shape and w.shape[0] else 0


OPS = (
    OpDef(
        "ConvTranspose",
        (1, 11, 22),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=infer,
        fn=k_conv_transpose,
        flops=flops,
        attrs=_attrs,
        helpers=(_convt_geometry,),
        ATTRS={**WINDOW_ATTRS, "group": INT, "output_padding": INTS, "output_shape": INTS},
        macs=_macs,
        scratch=conv_transpose_scratch,
        cost_kind="conv transpose",
    ),
)
