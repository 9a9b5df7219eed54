"""Conv: N-D convolution with groups, strides, pads, dilations and auto_pad (no bias broadcast tricks)."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import INT, WINDOW_ATTRS, WINDOW_TEMPLATE, ints, need, pool_out, same_dtype, spatial_attrs, want_dtype, window_args

OP_TYPE = "Conv"
VERSIONS = (1, 11, 22)
ATTRS = {**WINDOW_ATTRS, "group": INT}


def _geometry(node, x_shape, w_shape):
    """(group, strides, pads, dilations, out spatial) after checking channels and kernel."""
    group = node.attr("group", 1)
    kernel = list(w_shape[2:])
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ShapeInferenceError(f"{node.describe()} needs X (N, C, *spatial) and W of the same rank, got {x_shape} and {w_shape}")
    if not all(isinstance(d, int) for d in [x_shape[1], *w_shape]):
        raise ShapeInferenceError(f"{node.describe()} needs static channels and weights, got X {x_shape}, W {w_shape}")
    if group < 1 or x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise ShapeInferenceError(f"{node.describe()}: X channels {x_shape[1]}, W {w_shape} do not fit group={group}")
    if ints(node, "kernel_shape") not in ([], kernel):
        raise ShapeInferenceError(f"{node.describe()}: kernel_shape {ints(node, 'kernel_shape')} differs from W {w_shape}")
    strides, pads, dilations = spatial_attrs(node, x_shape[2:], kernel)
    k = len(kernel)
    out = [pool_out(node, x_shape[2 + i], kernel[i], strides[i], pads[i], pads[i + k], dilations[i]) for i in range(k)]
    return group, strides, pads, dilations, out


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    dtype = same_dtype(node, inputs)
    want_dtype(node, inputs[0], dtypes.FLOATS)
    x, w = inputs[0].shape, inputs[1].shape
    *_, out = _geometry(node, x, w)
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (w[0],):
        raise ShapeInferenceError(f"{node.describe()}: bias {inputs[2]} must have shape ({w[0]},)")
    return [TensorType(dtype, (x[0], w[0], *out))]


def kernel(node, x, w, b=None):
    """Reference: sum over kernel taps of a strided window times that tap's weights."""
    group, strides, pads, dilations, out = _geometry(node, x.shape, w.shape)
    k, (n, c), m = w.ndim - 2, x.shape[:2], w.shape[0]
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + k]) for i in range(k)])
    xg = padded.reshape((n, group, c // group) + padded.shape[2:])
    wg = w.reshape((group, m // group) + w.shape[1:])
    y = np.zeros((n, group, m // group, *out), dtype=x.dtype)
    for tap in np.ndindex(*w.shape[2:]):
        window = xg[(Ellipsis,) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                                        for t, d, o, s in zip(tap, dilations, out, strides))]
        y += np.einsum("ngc...,gmc->ngm...", window, wg[(Ellipsis,) + tap])
    y = y.reshape((n, m, *out))
    return [y if b is None else y + b.reshape((1, m) + (1,) * k)]


def flops(node, inputs, outputs):
    w = inputs[1].shape
    per_output = 2 * int(np.prod(w[1:]))
    bias = outputs[0].numel() if len(inputs) > 2 and inputs[2] is not None else 0
    return outputs[0].numel() * per_output + bias


TEMPLATE = WINDOW_TEMPLATE + '''

def k_conv(x, w, b, strides, pads, dilations, auto_pad, group):
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], w.shape[2:]
    strides, pads, dilations, out = _win_geometry(x.shape[2:], kernel, strides, pads, dilations, auto_pad, 0)
    cg, mg, p = c // group, m // group, 1
    for size in out:
        p *= size
    taps = _win_taps(x, kernel, strides, pads, dilations, out, 0)
    wg = w.reshape(group, mg, cg, -1)
    if TARGET_LARGE_SCRATCH:
        # im2col: every tap's window side by side, then one batched matmul.
        cols = np.stack([v.reshape(n, group, cg, p) for _, v in taps], axis=3)
        y = np.matmul(wg.reshape(group, mg, -1), cols.reshape(n, group, -1, p))
    else:
        # low memory: accumulate one (M/G x C/G) matmul per kernel tap.
        y = np.zeros((n, group, mg, p), dtype=x.dtype)
        for index, (_, v) in enumerate(taps):
            y += np.matmul(wg[:, :, :, index], v.reshape(n, group, cg, p))
    y = y.reshape((n, m) + out)
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * len(out))
    return y
'''


def emit(node, args, outs):
    b = args[2] if len(args) > 2 and args[2] else "None"
    return f"{outs[0]} = k_conv({args[0]}, {args[1]}, {b}, {window_args(node)}, {int(node.attr('group', 1))})"
