"""CuvilDwPw: a depthwise 2-D convolution (+ Relu/Clip(0, 6)) whose only reader is a 1x1
convolution (+ Relu/Clip(0, 6)), optionally followed by the residual Add of a same-shaped tensor:
the inverted-residual block's second half, made by ``passes/fuse_dw_pw.py``.

Inputs: x (N, C, H, W), the depthwise weights (C, 1, kh, kw) and bias (C) or absent, the pointwise
weights (M, C, 1, 1) and bias (M) or absent, and the residual (N, M, oh, ow) or absent.

The numpy kernel is the two convolutions and the Add in sequence, exactly as the graph had them
(the interpreter's oracle and every target without the native library). With ``TARGET_NATIVE``,
one C call (native_fused.c) computes the depthwise output a tile of rows at a time into a scratch
that stays in cache and feeds it straight to the pointwise GEMM, so the expanded tensor is never
written out; the pointwise weights are packed once per weight array (as ``_packing`` does for the
GEMM's, by the array's identity, while it lives).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._native import _native_lib
from cuvil_edge.ir.ops._util import (
    DEFAULT_CAPABILITIES,
    INTS,
    STR,
    ints,
    need,
    same_dtype,
)
from cuvil_edge.ir.ops.conv import _CONV_HELPERS, k_conv

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]

#: activations both paths take (the C store clamps): name -> (lo, hi)
CLAMPS = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0)}

_packed: dict[int, tuple[weakref.ref, np.ndarray, int]] = {}
_lock = threading.Lock()


def _forget(key: int) -> None:
    with _lock:
        _packed.pop(key, None)


def packed_pointwise(lib, w: np.ndarray) -> tuple[np.ndarray, int]:
    """``w`` (M, C, 1, 1) in cuvil_dwpw_pack_f32's panels and their address; packed once per
    read-only array (kept while it lives), every call for a writable one."""
    key = id(w)
    hit = _packed.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1], hit[2]
    m, c = w.shape[0], w.shape[1]
    mr = int(lib.cuvil_dwpw_mr())
    panels = np.empty(-(-m // mr) * mr * c, np.float32)
    wc = np.ascontiguousarray(w, dtype=np.float32)
    lib.cuvil_dwpw_pack_f32(wc.ctypes.data, panels.ctypes.data, m, c)
    if not w.flags.writeable:
        with _lock:
            _packed[key] = (weakref.ref(w, lambda _: _forget(key)), panels, panels.ctypes.data)
    return panels, panels.ctypes.data


def _dwpw_native(lib, x, w_dw, b_dw, w_pw, b_pw, residual, strides, pads, dilations, dw_activation, pw_activation):
    # the fused block in one C call (native_fused.c); y (n, m, oh, ow) float32
    from cuvil_edge.ir.ops._packing import shape_vector
    from cuvil_edge.ir.ops.fused_block import CLAMPS, packed_pointwise

    n, c, h, wd = x.shape
    kh, kw = w_dw.shape[2], w_dw.shape[3]
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    m = w_pw.shape[0]
    y = np.empty((n, m, oh, ow), np.float32)
    xc, wdc = np.ascontiguousarray(x), np.ascontiguousarray(w_dw, dtype=np.float32)
    bd = None if b_dw is None else np.ascontiguousarray(b_dw, dtype=np.float32)
    bp = None if b_pw is None else np.ascontiguousarray(b_pw, dtype=np.float32)
    rc = None if residual is None else np.ascontiguousarray(residual, dtype=np.float32)
    _panels, address = packed_pointwise(lib, w_pw)  # _panels: held for the call
    shape = shape_vector(
        (n, c, h, wd, m, kh, kw, dilations[0], dilations[1], pads[0], pads[1], oh, ow, strides[0], strides[1])
    )
    lo1, hi1 = CLAMPS[dw_activation]
    lo2, hi2 = CLAMPS[pw_activation]
    if (
        lib.cuvil_dwpw_f32(
            xc.ctypes.data,
            wdc.ctypes.data,
            None if bd is None else bd.ctypes.data,
            address,
            None if bp is None else bp.ctypes.data,
            None if rc is None else rc.ctypes.data,
            y.ctypes.data,
            shape,
            lo1,
            hi1,
            lo2,
            hi2,
        )
        != 0
    ):
        raise MemoryError("the native fused block could not allocate its scratch tile")
    return y


def k_dw_pw(x, w_dw, b_dw, w_pw, b_pw=None, residual=None, *, strides, pads, dilations, dw_activation, pw_activation):
    if TARGET_NATIVE:
        lib = _native_lib() if x.dtype == np.float32 else None
        if lib is not None:
            return _dwpw_native(
                lib, x, w_dw, b_dw, w_pw, b_pw, residual, strides, pads, dilations, dw_activation, pw_activation
            )
    y = k_conv(
        x,
        w_dw,
        b_dw,
        strides=strides,
        pads=pads,
        dilations=dilations,
        auto_pad="NOTSET",
        group=x.shape[1],
        activation=dw_activation,
    )
    z = k_conv(
        y,
        w_pw,
        b_pw,
        strides=(1, 1),
        pads=(0, 0, 0, 0),
        dilations=(1, 1),
        auto_pad="NOTSET",
        group=1,
        activation=pw_activation,
    )
    if residual is not None:
        z += residual  # z is this call's own array
    return z


def _attrs(node) -> dict:
    return {
        "strides": tuple(ints(node, "strides")),
        "pads": tuple(ints(node, "pads")),
        "dilations": tuple(ints(node, "dilations")),
        "dw_activation": str(node.attr("dw_activation", "none")),
        "pw_activation": str(node.attr("pw_activation", "none")),
    }


def _infer(node, inputs):
    need(node, inputs, 2, optional=4)  # the depthwise bias (input 2) may be absent
    attrs = _attrs(node)
    x, w_dw, b_dw, w_pw = (list(inputs) + [None, None])[:4]
    if w_pw is None:
        raise ShapeInferenceError(f"{node.describe()} needs the pointwise weights (input 3)")
    b_pw, res = (inputs[i] if len(inputs) > i else None for i in (4, 5))
    dtype = same_dtype(node, [t for t in inputs if t is not None])
    st, pads, dil = attrs["strides"], attrs["pads"], attrs["dilations"]
    if (
        len(x.shape) != 4
        or len(pads) != 4
        or len(dil) != 2
        or len(st) != 2
        or min(st) < 1
        or not all(isinstance(d, int) for d in x.shape[1:])
    ):
        raise ShapeInferenceError(
            f"{node.describe()} needs a static (N, C, H, W) input, 2 strides, 4 pads, "
            f"2 dilations; got {x}, strides {st}, pads {pads}, dilations {dil}"
        )
    n, c, h, wd = x.shape
    m = w_pw.shape[0]
    if w_dw.shape[:2] != (c, 1) or len(w_dw.shape) != 4 or w_pw.shape[1:] != (c, 1, 1):
        raise ShapeInferenceError(f"{node.describe()}: weights {w_dw.shape}, {w_pw.shape} do not fit {c} channels")
    for act in (attrs["dw_activation"], attrs["pw_activation"]):
        if act not in CLAMPS:
            raise ShapeInferenceError(f"{node.describe()}: activation {act!r} is not one of {sorted(CLAMPS)}")
    out = (
        n,
        m,
        (h + pads[0] + pads[2] - dil[0] * (w_dw.shape[2] - 1) - 1) // st[0] + 1,
        (wd + pads[1] + pads[3] - dil[1] * (w_dw.shape[3] - 1) - 1) // st[1] + 1,
    )
    if out[2] < 1 or out[3] < 1:
        raise ShapeInferenceError(f"{node.describe()}: empty output {out}")
    for bias, size in ((b_dw, c), (b_pw, m)):
        if bias is not None and bias.shape != (size,):
            raise ShapeInferenceError(f"{node.describe()}: bias {bias} must have shape ({size},)")
    if res is not None and res.shape != out:
        raise ShapeInferenceError(f"{node.describe()}: residual {res} must have the output's shape {out}")
    return [TensorType(dtype, out)]


def _macs(node, inputs, outputs):
    """Multiply-accumulates of both convolutions (biases, activations and the residual excluded)."""
    c, taps, m = inputs[0].shape[1], inputs[1].shape[2] * inputs[1].shape[3], inputs[3].shape[0]
    return outputs[0].numel() // m * c * (taps + m) if m else 0


def _flops(node, inputs, outputs):
    extra = sum(1 for t in inputs[2:] if t is not None)  # bias adds and the residual's, about one per output
    return 2 * _macs(node, inputs, outputs) + extra * outputs[0].numel()


OPS = (
    # internal (never in an imported model): made by passes/fuse_dw_pw.py
    OpDef(
        "CuvilDwPw",
        (1,),
        infer=_infer,
        fn=k_dw_pw,
        flops=_flops,
        attrs=_attrs,
        helpers=_CONV_HELPERS + (k_conv, _dwpw_native),
        ATTRS={"strides": INTS, "pads": INTS, "dilations": INTS, "dw_activation": STR, "pw_activation": STR},
        macs=_macs,
    ),
)
