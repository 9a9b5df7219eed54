"""Sliding-window ops outside the pooling family, one table row each (the op contract:
``_contract.py``): LpPool (the p-norm of each window), Col2Im (sum sliding blocks back into an
image) and MaxUnpool (scatter pooled maxima back to the positions MaxPool's indices name).

MaxUnpool follows onnxruntime and torch: the indices address the flattened output
(``output_shape`` when given), as MaxPool's indices address its flattened input.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import INT, INTS, WINDOW_ATTRS, ints, need, pool_out, spatial_attrs, text


def _lp_geometry(spatial, kernel, strides, pads, dilations, auto_pad, ceil_mode):
    """Begin and end pads (end grown to cover ceil_mode windows) and output sizes per axis."""
    n = len(kernel)
    begin, end, out = [], [], []
    for i in range(n):
        size, k, s, d = spatial[i], kernel[i], strides[i], dilations[i]
        span = d * (k - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            count = -(-size // s)
            total = max(0, (count - 1) * s + span - size)
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            b, e = 0, 0
            count = (size - span) // s + 1
        else:
            b, e = pads[i], pads[i + n]
            steps = size + b + e - span
            count = (-(-steps // s) if ceil_mode else steps // s) + 1
            if ceil_mode and (count - 1) * s >= size + b:
                count -= 1
        begin.append(b)
        end.append(max(e, (count - 1) * s + span - size - b))
        out.append(count)
    return begin, end, out


def k_lp_pool(x, kernel, strides, pads, dilations, auto_pad, ceil_mode, p):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    n = len(kernel)
    begin, end, out = _lp_geometry(x.shape[2:], kernel, strides, pads, dilations, auto_pad, ceil_mode)
    powered = np.abs(w) if p == 1 else np.abs(w) ** w.dtype.type(p)
    padded = np.pad(powered, [(0, 0), (0, 0)] + list(zip(begin, end, strict=True)))
    total = np.zeros(x.shape[:2] + tuple(out), dtype=w.dtype)
    for tap in np.ndindex(*kernel):
        total = (
            total
            + padded[
                (slice(None), slice(None))
                + tuple(
                    slice(tap[i] * dilations[i], tap[i] * dilations[i] + (out[i] - 1) * strides[i] + 1, strides[i])
                    for i in range(n)
                )
            ]
        )
    result = total if p == 1 else total ** w.dtype.type(1.0 / p)
    return np.asarray(result.astype(x.dtype))


def k_col2im(x, image_shape, block_shape, strides, pads, dilations):
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    n = len(image)
    stride = strides or (1,) * n
    dilation = dilations or (1,) * n
    pad = pads or (0,) * (2 * n)
    counts = [(image[i] + pad[i] + pad[i + n] - dilation[i] * (block[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    channels = x.shape[1] // int(np.prod(block))
    columns = x.reshape((x.shape[0], channels, *block, *counts))
    padded = np.zeros((x.shape[0], channels, *[image[i] + pad[i] + pad[i + n] for i in range(n)]), dtype=x.dtype)
    for tap in np.ndindex(*block):
        where = (slice(None), slice(None)) + tuple(
            slice(tap[i] * dilation[i], tap[i] * dilation[i] + (counts[i] - 1) * stride[i] + 1, stride[i])
            for i in range(n)
        )
        padded[where] += columns[(slice(None), slice(None)) + tap]
    return padded[(slice(None), slice(None)) + tuple(slice(pad[i], pad[i] + image[i]) for i in range(n))]


def k_max_unpool(x, indices, output_shape=None, *, kernel, strides, pads):
    n = len(kernel)
    if output_shape is not None:
        shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    else:
        stride = strides or (1,) * n
        pad = pads or (0,) * (2 * n)
        shape = x.shape[:2] + tuple(
            (x.shape[2 + i] - 1) * stride[i] - pad[i] - pad[i + n] + kernel[i] for i in range(n)
        )
    out = np.zeros(int(np.prod(shape)), dtype=x.dtype)
    out[indices.reshape(-1)] = x.reshape(-1)
    return out.reshape(shape)


# --- inference and attributes -----------------------------------------------------------------
def _kernel(node, spatial):
    kernel = ints(node, "kernel_shape")
    if len(kernel) != spatial or any(k < 1 for k in kernel):
        raise ShapeInferenceError(
            f"{node.describe()}: kernel_shape {kernel} must give one size >= 1 per spatial axis ({spatial})"
        )
    return kernel


def _infer_lp_pool(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    want(node, x, ((2, FLOATS),))
    if x.rank < 3:
        raise ShapeInferenceError(f"{node.describe()} needs an input [N, C, spatial...], got {x}")
    kernel = _kernel(node, x.rank - 2)
    strides, pads, dilations = (
        spatial_attrs(node, x.shape[2:], kernel)
        if node.version >= 18
        else spatial_attrs(_without(node, "dilations"), x.shape[2:], kernel)
    )
    ceil_mode = int(node.attr("ceil_mode", 0)) if node.version >= 18 else 0
    out = [
        pool_out(node, x.shape[2 + i], kernel[i], strides[i], pads[i], pads[i + len(kernel)], dilations[i], ceil_mode)
        for i in range(len(kernel))
    ]
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], *out))]


def _without(node, key):
    from dataclasses import replace

    return replace(node, attrs={k: v for k, v in node.attrs.items() if k != key})


def _lp_attrs(node):
    kernel = tuple(ints(node, "kernel_shape"))
    n = len(kernel)
    modern = node.version >= 18
    return {
        "kernel": kernel,
        "strides": tuple(ints(node, "strides")) or (1,) * n,
        "pads": tuple(ints(node, "pads")) or (0,) * (2 * n),
        "dilations": (tuple(ints(node, "dilations")) if modern else ()) or (1,) * n,
        "auto_pad": text(node, "auto_pad", "NOTSET"),
        "ceil_mode": int(node.attr("ceil_mode", 0)) if modern else 0,
        "p": int(node.attr("p", 2)),
    }


def _lp_flops(node, inputs, outputs):
    window = int(np.prod(ints(node, "kernel_shape") or [1]))
    return (window + 2 * TRANSCENDENTAL) * outputs[0].numel()


def _infer_col2im(node, inputs, consts=None):
    need(node, inputs, 3)
    x = inputs[0]
    want(node, x, ((18, ALL - {"bool"}),))
    image, block = vector(node, consts, 1, "image_shape"), vector(node, consts, 2, "block_shape")
    n = len(image)
    attrs = _col2im_attrs(node)
    stride, pad, dilation = (
        attrs["strides"] or (1,) * n,
        attrs["pads"] or (0,) * (2 * n),
        attrs["dilations"] or (1,) * n,
    )
    if len(block) != n or len(stride) != n or len(dilation) != n or len(pad) != 2 * n or x.rank != 3:
        raise ShapeInferenceError(
            f"{node.describe()}: input [N, C*prod(block), L], image_shape, block_shape and the "
            "strides/pads/dilations must agree in length"
        )
    counts = [(image[i] + pad[i] + pad[i + n] - dilation[i] * (block[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    per_block = int(np.prod(block))
    if (
        any(c < 1 for c in counts)
        or (isinstance(x.shape[2], int) and x.shape[2] != int(np.prod(counts)))
        or (isinstance(x.shape[1], int) and x.shape[1] % per_block)
    ):
        raise ShapeInferenceError(f"{node.describe()}: input {x} does not hold {counts} blocks of {block}")
    channels = x.shape[1] // per_block if isinstance(x.shape[1], int) else x.shape[1]
    if isinstance(channels, str) and per_block != 1:
        raise ShapeInferenceError(f"{node.describe()}: the input's axis 1 must be static")
    return [TensorType(x.dtype, (x.shape[0], channels, *image))]


def _col2im_attrs(node):
    return {key: tuple(ints(node, key)) for key in ("strides", "pads", "dilations")}


def _infer_max_unpool(node, inputs, consts=None):
    need(node, inputs, 2, 1)
    x, indices = inputs[:2]
    want(node, x, ((9, FLOATS),))
    if indices.dtype != "int64" or x.rank < 3:
        raise ShapeInferenceError(
            f"{node.describe()}: X must be [N, C, spatial...] and I int64 indices, got {x}, {indices}"
        )
    attrs = _unpool_attrs(node)
    kernel, n = attrs["kernel"], x.rank - 2
    _kernel(node, n)
    if len(inputs) > 2 and inputs[2] is not None:
        return [TensorType(x.dtype, tuple(vector(node, consts, 2, "output_shape")))]
    stride, pad = attrs["strides"] or (1,) * n, attrs["pads"] or (0,) * (2 * n)
    if len(stride) != n or len(pad) != 2 * n or min(stride) < 1 or min(pad) < 0:
        raise ShapeInferenceError(
            f"{node.describe()}: strides {list(stride)} and pads {list(pad)} must give {n} "
            f"positive strides and {2 * n} pads >= 0"
        )
    spatial = []
    for i in range(n):
        if not isinstance(x.shape[2 + i], int):
            raise ShapeInferenceError(f"{node.describe()}: the spatial axes of X must be static")
        spatial.append((x.shape[2 + i] - 1) * stride[i] - pad[i] - pad[i + n] + kernel[i])
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], *spatial))]


def _unpool_attrs(node):
    return {
        "kernel": tuple(ints(node, "kernel_shape")),
        "strides": tuple(ints(node, "strides")),
        "pads": tuple(ints(node, "pads")),
    }


OPS = (
    OpDef(
        "LpPool",
        (2, 11, 18, 22),
        infer=_infer_lp_pool,
        fn=k_lp_pool,
        flops=_lp_flops,
        attrs=_lp_attrs,
        helpers=(_lp_geometry,),
        ATTRS={**WINDOW_ATTRS, "ceil_mode": INT, "p": INT},
    ),
    OpDef(
        "Col2Im",
        (18,),
        infer=_infer_col2im,
        fn=k_col2im,
        flops=lambda node, inputs, outputs: inputs[0].numel(),
        attrs=_col2im_attrs,
        ATTRS={"strides": INTS, "pads": INTS, "dilations": INTS},
        CONST_INPUTS=(1, 2),
    ),
    OpDef(
        "MaxUnpool",
        (9, 11, 22),
        infer=_infer_max_unpool,
        fn=k_max_unpool,
        flops=lambda node, inputs, outputs: inputs[0].numel(),
        attrs=_unpool_attrs,
        ATTRS={"kernel_shape": INTS, "strides": INTS, "pads": INTS},
        CONST_INPUTS=(2,),
    ),
)
