"""Convolutions, one table row each (the op contract: ``_contract.py``): Conv, CuvilFusedConv
(Conv + an activation, made by the fusion pass), and the quantized ConvInteger and QLinearConv.
The window helpers (``_win_*``, ``_window_attrs``) they share with pooling are in ``_window.py``.

``attrs(node)`` resolves the window attributes once: defaults filled where the rank is known from
``kernel_shape``, ``auto_pad="VALID"`` turned into zero pads. Only ``SAME_UPPER``/``SAME_LOWER``
pads depend on the input size, so the kernels compute them in a branch that a call site with
explicit pads loses when the code generator specialises it.

Conv's kernel is also the interpreter's: :data:`TARGET_LARGE_SCRATCH` is the reference
capability (im2col); compiled modules take each target's value.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _activation, _torch
from cuvil_edge.ir.ops._activation import _activate
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe
from cuvil_edge.ir.ops._conv_path import conv_path, im2col_block_rows
from cuvil_edge.ir.ops._int8 import _i8_ops
from cuvil_edge.ir.ops._native import _native_epilogue, _native_lib
from cuvil_edge.ir.ops._packing import _native_conv_gemm
from cuvil_edge.ir.ops._quant import _q_along, _q_requantize, _q_saturate, quant_dtype, same_pair, scale_dtype
from cuvil_edge.ir.ops._scratch import conv_scratch
from cuvil_edge.ir.ops._util import (
    DEFAULT_CAPABILITIES,
    INT,
    STR,
    WINDOW_ATTRS,
    ints,
    need,
    pool_out,
    same_dtype,
    spatial_attrs,
    want_dtype,
)
from cuvil_edge.ir.ops._window import _WINDOW, _win_out, _win_same_pads, _win_taps, _win_view, _window_attrs

#: The interpreter's capability (targets substitute their own in compiled modules).
TARGET_LARGE_SCRATCH = DEFAULT_CAPABILITIES["TARGET_LARGE_SCRATCH"]
TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]
TARGET_INT8_DOT = DEFAULT_CAPABILITIES["TARGET_INT8_DOT"]


# --- kernels ----------------------------------------------------------------------------------
def k_conv(x, w, b=None, *, strides, pads, dilations, auto_pad, group, activation="none"):
    t = np.float32 if x.dtype == np.float16 else x.dtype  # float16: computed in float32, rounded once
    xt, wt = x.astype(t, copy=False), w.astype(t, copy=False)
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], w.shape[2:]
    k = len(kernel)
    st = strides or (1,) * k
    di = dilations or (1,) * k
    if auto_pad == "NOTSET":
        pd = pads or (0,) * (2 * k)
    else:
        pd = _win_same_pads(x.shape[2:], kernel, st, di, auto_pad == "SAME_UPPER")
    out = _win_out(x.shape[2:], kernel, st, pd, di, 0)
    cg, mg, p = c // group, m // group, 1
    for size in out:
        p *= size
    native = False  # the C kernels load here (a target without them never asks)
    if TARGET_NATIVE:
        lib = _native_lib() if x.dtype == np.float32 and k == 2 else None
        native = lib is not None
    path = conv_path(
        k,
        c,
        m,
        group,
        max(kernel, default=1) == 1,
        any(pd),
        native,
        TARGET_LARGE_SCRATCH,
        w.size // max(m, 1) * p * xt.itemsize,
    )
    if TARGET_NATIVE:
        clamp = activation == "relu" or activation == "relu6"
        lo, hi = 0.0 if clamp else -np.inf, 6.0 if activation == "relu6" else np.inf
        if path == "native depthwise":
            # depthwise 2-D in C: one padded plane at a time, bias and a fused Relu/Clip(0, 6) applied there
            y = np.empty((n, m) + out, dtype=np.float32)
            xc, wc = np.ascontiguousarray(x), np.ascontiguousarray(w)
            bc = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
            if (
                lib.cuvil_depthwise_conv2d_f32(
                    xc.ctypes.data,
                    wc.ctypes.data,
                    None if bc is None else bc.ctypes.data,
                    y.ctypes.data,
                    n,
                    c,
                    x.shape[2],
                    x.shape[3],
                    kernel[0],
                    kernel[1],
                    st[0],
                    st[1],
                    di[0],
                    di[1],
                    pd[0],
                    pd[1],
                    out[0],
                    out[1],
                    (out[0] - 1) * st[0] + di[0] * (kernel[0] - 1) + 1,
                    (out[1] - 1) * st[1] + di[1] * (kernel[1] - 1) + 1,
                    lo,
                    hi,
                )
                != 0
            ):
                raise MemoryError("the native depthwise convolution could not allocate its padded plane")
        if path == "native gemm":
            # dense 2-D in C: a register-tiled GEMM over the im2col'd input, bias and Relu/Clip(0, 6) in its store
            y = _native_conv_gemm(lib, x, w, b, st, pd, di, out, lo, hi)
        if path == "native depthwise" or path == "native gemm":
            if activation == "sigmoid" or activation == "swish" or activation == "gelu":
                _native_epilogue(y, None, n * m, m, p, 0, activation)
            elif activation == "hardswish":
                y = _activate(y, activation)
            return y
    if path == "1x1 matmul":
        # 1x1: a plain matmul over the (strided) input, no copy at stride 1
        xs = xt[(slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, st, strict=True))]
        y = np.matmul(wt.reshape(group, mg, cg), xs.reshape(n, group, cg, p))
    elif path != "per-tap gemm":
        win = _win_view(xt, kernel, st, pd, di, out, 0)  # every window, a strided view of the padded input
        if path == "depthwise taps":
            # depthwise: accumulate one scaled window per kernel tap (no im2col copy)
            y = np.zeros((n, c) + out, dtype=t)
            per_tap = wt.reshape(c, -1)
            for index, tap in enumerate(np.ndindex(*kernel)):
                y += win[(Ellipsis,) + tap] * per_tap[:, index].reshape((1, c) + (1,) * k)
        elif path == "im2col blocks":  # fallback: an im2col past 2 MiB, or a target with little scratch
            # im2col in blocks of output rows whose columns stay in cache (~1 MiB; the whole im2col
            # would be over 2 MiB, or the target has little memory), one matmul per block into y
            rows = im2col_block_rows(out[0], w.size // m * out[1] * xt.itemsize)
            block = np.empty((c,) + kernel + (rows, out[1]), dtype=t)
            wm = wt.reshape(m, -1)
            y = np.empty((n, m, p), dtype=t)
            for i in range(n):
                for top in range(0, out[0], rows):
                    used = block[:, :, :, : min(rows, out[0] - top)]
                    np.copyto(used, win[i, :, top : top + rows].transpose(0, 3, 4, 1, 2))
                    np.matmul(
                        wm, used.reshape(w.size // m, -1), out=y[i, :, top * out[1] : top * out[1] + used[0, 0, 0].size]
                    )
        else:
            # im2col: the windows copied once, as (n, group, C/G * taps, out), then one batched matmul
            order = (0, 1) + tuple(range(2 + k, 2 + 2 * k)) + tuple(range(2, 2 + k))
            cols = win.transpose(order).reshape(n, group, cg * (w.size // (m * cg)), p)
            y = np.matmul(wt.reshape(group, mg, -1), cols)
    else:
        # low memory: accumulate one (M/G x C/G) matmul per kernel tap
        wg = wt.reshape(group, mg, cg, -1)
        y = np.zeros((n, group, mg, p), dtype=t)
        for index, (_, v) in enumerate(_win_taps(xt, kernel, st, pd, di, out, 0)):
            y += np.matmul(wg[:, :, :, index], v.reshape(n, group, cg, p))
    y = y.reshape((n, m) + out)
    if TARGET_NATIVE:
        # bias and activation in one pass over y instead of two (under ~32k elements numpy's two
        # in-place passes cost less than the foreign call)
        fits = t == np.float32 and (b is not None or activation != "none") and y.size >= 1 << 15
        if fits and _native_epilogue(y, b, n * m, m, p, 0, activation):  # fallback: outputs of 32k elements or more
            return y.astype(x.dtype, copy=False)
    if b is not None:  # y is this call's own array: add in place
        y += b.astype(t, copy=False).reshape((1, m) + (1,) * len(out))
    if activation != "none":
        y = _activate(y, activation)
    return y.astype(x.dtype, copy=False)


def _i8_geometry(x, w, strides, pads, dilations, auto_pad):
    """(strides, pads, dilations, out) of a quantized convolution, as k_conv resolves them."""
    kernel = w.shape[2:]
    k = len(kernel)
    st = strides or (1,) * k
    di = dilations or (1,) * k
    if auto_pad == "NOTSET":
        pd = pads or (0,) * (2 * k)
    else:
        pd = _win_same_pads(x.shape[2:], kernel, st, di, auto_pad == "SAME_UPPER")
    return st, pd, di, _win_out(x.shape[2:], kernel, st, pd, di, 0)


def k_conv_integer(x, w, x_zp=None, w_zp=None, *, strides, pads, dilations, auto_pad, group):
    """int32 Conv of (x - x_zero_point) with (w - w_zero_point); w's zero point may be per output channel."""
    if TARGET_INT8_DOT != "none":
        # int8 products with int32 sums in C (native_int8.c); None: a call it does not take
        i8 = _i8_ops() if x.ndim == 4 else None
        if i8 is not None:
            st, pd, di, out = _i8_geometry(x, w, strides, pads, dilations, auto_pad)
            y = i8.conv(x, x_zp, w, w_zp, None, None, None, np.int32, st, pd, di, out, group)
            if y is not None:
                return y
    xi = x.astype(np.int32) if x_zp is None else x.astype(np.int32) - x_zp.astype(np.int32).reshape(())
    wi = w.astype(np.int32) if w_zp is None else w.astype(np.int32) - _q_along(w_zp.astype(np.int32), w.ndim, 0)
    return k_conv(xi, wi, None, strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad, group=group)


def k_q_linear_conv(
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None, *, strides, pads, dilations, auto_pad, group
):
    """ConvInteger (+ int32 bias), requantized with the per-output-channel multiplier
    x_scale * w_scale / y_scale (float32), rint, plus y's zero point, saturated."""
    w_scale_c = w_scale.astype(np.float32)
    multiplier = x_scale.astype(np.float32).reshape(()) * w_scale_c / y_scale.astype(np.float32).reshape(())
    if TARGET_INT8_DOT != "none":
        # the same sums in C, requantized in the store (round half to even, zero point, saturate)
        i8 = _i8_ops() if x.ndim == 4 else None
        if i8 is not None:
            st, pd, di, out = _i8_geometry(x, w, strides, pads, dilations, auto_pad)
            y = i8.conv(x, x_zp, w, w_zp, bias, multiplier, y_zp, y_zp.dtype, st, pd, di, out, group)
            if y is not None:
                return y
    acc = k_conv_integer(
        x, w, x_zp, w_zp, strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad, group=group
    )
    if bias is not None:
        acc = acc + bias.reshape((1, -1) + (1,) * (acc.ndim - 2))
    return _q_requantize(acc, _q_along(multiplier, acc.ndim, 1), y_zp.reshape(()), y_zp.dtype)


# --- attributes -------------------------------------------------------------------------------


def _conv_attrs(node) -> dict:
    rank = len(ints(node, "kernel_shape")) or None
    return {
        **_window_attrs(node, rank),
        "group": int(node.attr("group", 1)),
        "activation": _activation.activation(node),
    }


def _quant_conv_attrs(node) -> dict:
    rank = len(ints(node, "kernel_shape")) or None
    return {**_window_attrs(node, rank), "group": int(node.attr("group", 1))}


# --- inference --------------------------------------------------------------------------------
def _conv_geometry(node, x_shape, w_shape):
    """Output spatial size after checking channels and kernel."""
    group = node.attr("group", 1)
    kernel = list(w_shape[2:])
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ShapeInferenceError(
            f"{node.describe()} needs X (N, C, *spatial) and W of the same rank, got {x_shape} and {w_shape}"
        )
    if not all(isinstance(d, int) for d in [x_shape[1], *w_shape]):
        raise ShapeInferenceError(f"{node.describe()} needs static channels and weights, got X {x_shape}, W {w_shape}")
    if group < 1 or x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise ShapeInferenceError(f"{node.describe()}: X channels {x_shape[1]}, W {w_shape} do not fit group={group}")
    if ints(node, "kernel_shape") not in ([], kernel):
        raise ShapeInferenceError(
            f"{node.describe()}: kernel_shape {ints(node, 'kernel_shape')} differs from W {w_shape}"
        )
    strides, pads, dilations = spatial_attrs(node, x_shape[2:], kernel)
    k = len(kernel)
    return [pool_out(node, x_shape[2 + i], kernel[i], strides[i], pads[i], pads[i + k], dilations[i]) for i in range(k)]


def _infer_conv(node, inputs):
    _conv_attrs(node)
    need(node, inputs, 2, optional=1)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    x, w = inputs[0].shape, inputs[1].shape
    out = _conv_geometry(node, x, w)
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (w[0],):
        raise ShapeInferenceError(f"{node.describe()}: bias {inputs[2]} must have shape ({w[0]},)")
    return [TensorType(dtype, (x[0], w[0], *out))]


def _check_zero_points(node, x_zp, w_zp, m):
    """x's zero point is per tensor; w's per tensor or per output channel."""
    if x_zp is not None and x_zp.numel() != 1:
        raise ShapeInferenceError(f"{node.describe()}: x_zero_point must be a scalar, got {x_zp}")
    if w_zp is not None and w_zp.numel() not in (1, m):
        raise ShapeInferenceError(f"{node.describe()}: w_zero_point {w_zp} must be a scalar or have {m} elements")


def _infer_conv_integer(node, inputs):
    _quant_conv_attrs(node)
    need(node, inputs, 2, optional=2)
    x, w = inputs[0], inputs[1]
    x_zp, w_zp = (inputs[i] if len(inputs) > i else None for i in (2, 3))
    quant_dtype(node, x, "x")
    quant_dtype(node, w, "w")
    same_pair(node, x, x_zp, "x and x_zero_point")
    same_pair(node, w, w_zp, "w and w_zero_point")
    out = _conv_geometry(node, x.shape, w.shape)
    _check_zero_points(node, x_zp, w_zp, w.shape[0])
    return [TensorType("int32", (x.shape[0], w.shape[0], *out))]


def _infer_q_linear_conv(node, inputs):
    _quant_conv_attrs(node)
    need(node, inputs, 8, optional=1)
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    for t, what in ((x, "x"), (w, "w"), (y_zp, "y_zero_point")):
        quant_dtype(node, t, what)
    same_pair(node, x, x_zp, "x and x_zero_point")
    same_pair(node, w, w_zp, "w and w_zero_point")
    scale_dtype(node, [x_scale, w_scale, y_scale])
    out = _conv_geometry(node, x.shape, w.shape)
    m = w.shape[0]
    _check_zero_points(node, x_zp, w_zp, m)
    if x_scale.numel() != 1 or y_scale.numel() != 1 or y_zp.numel() != 1 or w_scale.numel() not in (1, m):
        raise ShapeInferenceError(
            f"{node.describe()}: x/y scales and y_zero_point must be scalars and w_scale a scalar or have {m} elements"
        )
    if bias is not None and (bias.dtype != "int32" or bias.shape != (m,)):
        raise ShapeInferenceError(f"{node.describe()}: B must be int32 of shape ({m},), got {bias}")
    return [TensorType(y_zp.dtype, (x.shape[0], m, *out))]


def _conv_flops(node, inputs, outputs):
    per_output = 2 * int(np.prod(inputs[1].shape[1:]))
    bias = outputs[0].numel() if len(inputs) > 2 and inputs[2] is not None else 0
    act = _activation.activation_flops(_activation.activation(node), outputs)
    return outputs[0].numel() * per_output + bias + act


def _conv_integer_flops(node, inputs, outputs):
    return _conv_flops(node, inputs[:2], outputs)


def _q_linear_conv_flops(node, inputs, outputs):
    return _conv_flops(node, [inputs[0], inputs[3], *inputs[8:]], outputs) + 3 * outputs[0].numel()


def _conv_macs(node, inputs, outputs):
    """Multiply-accumulates of the convolution (bias and activation excluded)."""
    w = inputs[1]
    return outputs[0].numel() * (w.numel() // w.shape[0]) if w.shape and w.shape[0] else 0


_CONV_HELPERS = _WINDOW + _activation.HELPERS + (_native_epilogue, conv_path, im2col_block_rows, _native_conv_gemm)
_QUANT_CONV_HELPERS = _CONV_HELPERS + (k_conv, _q_along, _q_saturate, _q_requantize, _i8_ops, _i8_geometry)

OPS = (
    OpDef(
        "Conv",
        (1, 11, 22),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_conv,
        fn=k_conv,
        flops=_conv_flops,
        attrs=_conv_attrs,
        helpers=_CONV_HELPERS,
        ATTRS={**WINDOW_ATTRS, "group": INT},
        macs=_conv_macs,
        torch=_torch.conv,
        torch_check=_torch.check_activation,
        trainable="conv",
        scratch=conv_scratch,
        cost_kind="conv",
        probes=(
            Probe((1, 4, 8, 8), {"pads": [1, 1, 1, 1]}, lambda: (np.full((4, 4, 3, 3), 0.02, np.float32),)),
            Probe((1, 4, 8, 8), {}, lambda: (np.full((4, 4, 1, 1), 0.05, np.float32),)),
            Probe((1, 4, 8, 8), {"pads": [1, 1, 1, 1], "group": 4}, lambda: (np.full((4, 1, 3, 3), 0.1, np.float32),)),
        ),
    ),
    # internal (never in an imported model): Conv + activation, made by passes/fuse_activation.py
    OpDef(
        "CuvilFusedConv",
        (1,),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_conv,
        fn=k_conv,
        flops=_conv_flops,
        attrs=_conv_attrs,
        helpers=_CONV_HELPERS,
        ATTRS={**WINDOW_ATTRS, "group": INT, "activation": STR},
        macs=_conv_macs,
        torch=_torch.conv,
        torch_check=_torch.check_activation,
        trainable="conv",
        scratch=conv_scratch,
        cost_kind="conv",
    ),
    OpDef(
        "ConvInteger",
        (10,),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_conv_integer,
        fn=k_conv_integer,
        flops=_conv_integer_flops,
        attrs=_quant_conv_attrs,
        helpers=_QUANT_CONV_HELPERS,
        ATTRS={**WINDOW_ATTRS, "group": INT},
        cost_kind="int8 conv",
    ),
    OpDef(
        "QLinearConv",
        (10,),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_q_linear_conv,
        fn=k_q_linear_conv,
        flops=_q_linear_conv_flops,
        attrs=_quant_conv_attrs,
        helpers=_QUANT_CONV_HELPERS + (k_conv_integer,),
        ATTRS={**WINDOW_ATTRS, "group": INT},
        cost_kind="int8 conv",
    ),
)
