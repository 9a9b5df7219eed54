"""DeformConv (opsets 19, 22), the op contract's one-row form (``_contract.py``): a 2-D grouped
convolution whose kernel taps are moved by learned per-position offsets (and optionally scaled
by a mask), as torchvision's ``deform_conv2d``. Each tap reads the input bilinearly, zero
outside it; the sampled columns then meet the weights in one matmul per group. float16 is
computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._util import INT, INTS, ints, need, pool_out


def k_deform_conv(x, w, offset, b=None, mask=None, *, strides, pads, dilations, group, offset_group):
    t = np.float32 if x.dtype == np.float16 else x.dtype.type
    n, c, height, width = x.shape
    kh, kw = w.shape[2], w.shape[3]
    oh, ow = offset.shape[2], offset.shape[3]
    per_offset = c // offset_group
    moves = offset.astype(t).reshape(n, offset_group, kh, kw, 2, oh, ow)
    scales = (
        np.ones((n, offset_group, kh, kw, oh, ow), t)
        if mask is None
        else mask.astype(t).reshape(n, offset_group, kh, kw, oh, ow)
    )
    rows = (np.arange(kh) * dilations[0]).reshape(-1, 1, 1, 1) + (np.arange(oh) * strides[0] - pads[0]).reshape(
        1, 1, -1, 1
    )
    cols = (np.arange(kw) * dilations[1]).reshape(1, -1, 1, 1) + (np.arange(ow) * strides[1] - pads[1]).reshape(
        1, 1, 1, -1
    )
    batch = np.arange(n).reshape(-1, 1, 1, 1, 1)
    wide = x.astype(t)
    sampled = np.zeros((n, c, kh, kw, oh, ow), t)
    for g in range(offset_group):
        ph = moves[:, g, :, :, 0] + rows  # (n, kh, kw, oh, ow) sampling positions
        pw = moves[:, g, :, :, 1] + cols
        h0, w0 = np.floor(ph), np.floor(pw)
        fh, fw = ph - h0, pw - w0
        part = wide[:, g * per_offset : (g + 1) * per_offset]
        value = np.zeros(ph.shape + (per_offset,), t)
        for dh, wh in ((0, 1 - fh), (1, fh)):
            for dw, ww in ((0, 1 - fw), (1, fw)):
                hi, wi = h0.astype(np.int64) + dh, w0.astype(np.int64) + dw
                inside = (hi >= 0) & (hi < height) & (wi >= 0) & (wi < width)
                pixels = part[batch, :, np.clip(hi, 0, height - 1), np.clip(wi, 0, width - 1)]
                value = value + np.where(inside, wh * ww, t(0))[..., None] * pixels
        sampled[:, g * per_offset : (g + 1) * per_offset] = np.moveaxis(value * scales[:, g][..., None], -1, 1)
    columns = sampled.reshape(n, group, (c // group) * kh * kw, oh * ow)
    weights = w.astype(t).reshape(group, w.shape[0] // group, -1)
    out = np.einsum("gok,ngkl->ngol", weights, columns).reshape(n, w.shape[0], oh, ow)
    if b is not None:
        out = out + b.astype(t).reshape(1, -1, 1, 1)
    return np.asarray(out.astype(x.dtype))


def _deform_attrs(node):
    return {
        "strides": tuple(ints(node, "strides")) or (1, 1),
        "pads": tuple(ints(node, "pads")) or (0, 0, 0, 0),
        "dilations": tuple(ints(node, "dilations")) or (1, 1),
        "group": int(node.attr("group", 1)),
        "offset_group": int(node.attr("offset_group", 1)),
    }


def _infer_deform_conv(node, inputs):
    need(node, inputs, 3, 2)
    x, w, offset = inputs[:3]
    bias, mask = (list(inputs[3:]) + [None] * 2)[:2]
    want(node, x, ((19, FLOATS),))
    if x.rank != 4 or w.rank != 4 or offset.rank != 4:
        raise ShapeInferenceError(f"{node.describe()}: only 2-D deformable convolution is supported; got X {x}, W {w}")
    attrs = _deform_attrs(node)
    if len(attrs["strides"]) != 2 or len(attrs["pads"]) != 4 or len(attrs["dilations"]) != 2:
        raise ShapeInferenceError(
            f"{node.describe()}: strides and dilations need 2 entries and pads 4 for 2-D "
            f"deformable convolution, got {attrs['strides']}, {attrs['pads']}, {attrs['dilations']}"
        )
    if min(attrs["strides"] + attrs["dilations"]) < 1 or min(attrs["pads"]) < 0:
        raise ShapeInferenceError(f"{node.describe()}: strides and dilations must be positive and pads >= 0")
    kernel = tuple(ints(node, "kernel_shape")) or tuple(w.shape[2:])
    if kernel != tuple(w.shape[2:]) or not all(isinstance(d, int) for d in (*x.shape[1:], *w.shape)):
        raise ShapeInferenceError(
            f"{node.describe()}: channels, spatial sizes and the kernel must be static, and "
            f"kernel_shape {list(kernel)} must be W's {list(w.shape[2:])}"
        )
    group, og = attrs["group"], attrs["offset_group"]
    if group < 1 or og < 1 or x.shape[1] != w.shape[1] * group or w.shape[0] % group or x.shape[1] % og:
        raise ShapeInferenceError(f"{node.describe()}: X {x}, W {w}, group {group} and offset_group {og} do not fit")
    out = [
        pool_out(
            node,
            x.shape[2 + i],
            kernel[i],
            attrs["strides"][i],
            attrs["pads"][i],
            attrs["pads"][i + 2],
            attrs["dilations"][i],
        )
        for i in range(2)
    ]
    taps = og * kernel[0] * kernel[1]
    if offset.shape[1] != 2 * taps or tuple(offset.shape[2:]) != tuple(out):  # offset.rank == 4: checked above
        raise ShapeInferenceError(
            f"{node.describe()}: offset must be [N, {2 * taps}, {out[0]}, {out[1]}], got {offset}"
        )
    if mask is not None and (mask.rank != 4 or mask.shape[1] != taps or tuple(mask.shape[2:]) != tuple(out)):
        raise ShapeInferenceError(f"{node.describe()}: mask must be [N, {taps}, {out[0]}, {out[1]}], got {mask}")
    if bias is not None and (bias.rank != 1 or bias.shape[0] != w.shape[0]):
        raise ShapeInferenceError(f"{node.describe()}: B must be a vector of {w.shape[0]}, got {bias}")
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], *out))]


def _deform_macs(node, inputs, outputs):
    w = inputs[1]
    return outputs[0].numel() * int(np.prod(w.shape[1:]))


def _deform_flops(node, inputs, outputs):
    return 2 * _deform_macs(node, inputs, outputs) + 12 * inputs[2].numel() // 2 * inputs[0].shape[1]


OPS = (
    OpDef(
        "DeformConv",
        (19, 22),
        infer=_infer_deform_conv,
        fn=k_deform_conv,
        flops=_deform_flops,
        attrs=_deform_attrs,
        ATTRS={
            "kernel_shape": INTS,
            "strides": INTS,
            "pads": INTS,
            "dilations": INTS,
            "group": INT,
            "offset_group": INT,
        },
        macs=_deform_macs,
    ),
)
