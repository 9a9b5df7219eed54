"""CuvilConvAdd: a convolution whose output is added to a same-shaped tensor and then, optionally,
clamped by Relu or Clip(0, 6): the residual block's last convolution, ``act(conv(x, W) + B + R)``,
made by ``passes/fuse_conv_add.py``.

Inputs: x (N, C, *spatial), W, B (M) or absent, and the residual R (the output's shape and dtype).

Where the native GEMM runs the convolution (float32, 2-D, one group: :func:`conv_path`), the bias,
the residual and the clamp are applied in its store, so the convolution's output is written once
and never read back. Every other path is the unfused sequence: the convolution, the Add in place
on its own output, then the activation (the interpreter's oracle and every target without the
native library).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.ops._activation import _activate
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._conv_path import conv_path
from cuvil_edge.ir.ops._native import _native_lib
from cuvil_edge.ir.ops._packing import _native_conv_gemm
from cuvil_edge.ir.ops._scratch import conv_scratch
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES, INT, STR, WINDOW_ATTRS
from cuvil_edge.ir.ops._window import _win_out, _win_same_pads
from cuvil_edge.ir.ops.conv import (
    _CONV_HELPERS,
    _conv_attrs,
    _conv_flops,
    _conv_macs,
    _infer_conv,
    k_conv,
)

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]
TARGET_LARGE_SCRATCH = DEFAULT_CAPABILITIES["TARGET_LARGE_SCRATCH"]

#: the activations the pass fuses after the Add: name -> the store's clamp (lo, hi)
CLAMPS = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0)}


def k_conv_add(x, w, b, r, *, strides, pads, dilations, auto_pad, group, activation="none"):
    if TARGET_NATIVE and x.dtype == np.float32 and r.dtype == np.float32 and x.ndim == 4 and group == 1:
        lib = _native_lib()
        if lib is not None:
            kernel = w.shape[2:]
            st, di = strides or (1, 1), dilations or (1, 1)
            if auto_pad == "NOTSET":
                pd = pads or (0, 0, 0, 0)
            else:
                pd = _win_same_pads(x.shape[2:], kernel, st, di, auto_pad == "SAME_UPPER")
            out = _win_out(x.shape[2:], kernel, st, pd, di, 0)
            path = conv_path(2, x.shape[1], w.shape[0], 1, max(kernel) == 1, any(pd), True, TARGET_LARGE_SCRATCH, 0)
            if path == "native gemm" and (activation == "none" or activation == "relu" or activation == "relu6"):
                # bias, residual and clamp in the GEMM's store: y is written once
                lo, hi = 0.0 if activation != "none" else -np.inf, 6.0 if activation == "relu6" else np.inf
                return _native_conv_gemm(lib, x, w, b, st, pd, di, out, lo, hi, r)
    y = k_conv(x, w, b, strides=strides, pads=pads, dilations=dilations, auto_pad=auto_pad, group=group)
    y += r.astype(y.dtype, copy=False)  # y is k_conv's own array
    if activation != "none":
        y = _activate(y, activation)
    return y


def _infer(node, inputs):
    if len(inputs) != 4 or inputs[3] is None:
        raise ShapeInferenceError(f"{node.describe()} needs X, W, B (or absent) and the residual R, got {inputs}")
    out = _infer_conv(node, list(inputs[:3]))[0]
    r = inputs[3]
    if r.shape != out.shape or r.dtype != out.dtype:
        raise ShapeInferenceError(f"{node.describe()}: residual {r} must have the output's type {out}")
    return [out]


def _flops(node, inputs, outputs):
    return _conv_flops(node, inputs[:3], outputs) + outputs[0].numel()  # the residual's add


OPS = (
    # internal (never in an imported model): made by passes/fuse_conv_add.py
    OpDef(
        "CuvilConvAdd",
        (1,),
        infer=_infer,
        fn=k_conv_add,
        flops=_flops,
        attrs=_conv_attrs,
        helpers=_CONV_HELPERS + (k_conv,),
        ATTRS={**WINDOW_ATTRS, "group": INT, "activation": STR},
        macs=_conv_macs,
        scratch=conv_scratch,
        cost_kind="conv",
    ),
)
