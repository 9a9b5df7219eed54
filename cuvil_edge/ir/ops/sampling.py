"""Sampling at computed coordinates, one table row each (the op contract: ``_contract.py``):
GridSample (2-D at opset 16, N-D from 20; nearest, linear, cubic; zeros, border, reflection
padding) and AffineGrid (the sampling grid of an affine transform, 2-D and 3-D).

GridSample is vectorised over every output position: per spatial axis, the taps of the
interpolation (1 nearest, 2 linear, 4 cubic) become index arrays and weights, and the output
sums the gathered pixels times the products of the weights. Coordinates follow the ONNX
reference step by step (denormalise, bring out-of-range coordinates back for border/reflection,
then read each tap with the padding rule); cubic taps are clamped or reflected one by one, as in
onnxruntime and torch. float16 is computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import ALL, FLOATS, want
from cuvil_edge.ir.ops._shape import vector
from cuvil_edge.ir.ops._util import INT, STR, choice, need

MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}


def _grid_reflect(v, lo, hi):
    """Reflect ``v`` at the borders ``lo`` and ``hi`` until it lies between them."""
    span = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        under, over = lo - v, v - hi
        n_under, n_over = np.trunc(under / span), np.trunc(over / span)
        r_under, r_over = under - n_under * span, over - n_over * span
    low = np.where(n_under % 2 == 0, lo + r_under, hi - r_under)
    high = np.where(n_over % 2 == 0, hi - r_over, lo + r_over)
    return np.where(v < lo, low, np.where(v > hi, high, v))


def _grid_tap(i, size, lo, hi, padding):
    """The index read for tap ``i`` of an axis of ``size`` and whether it lies inside (zeros padding)."""
    j = np.trunc(_grid_reflect(i.astype(np.float64), lo, hi)).astype(np.int64) if padding == "reflection" else i
    inside = (j >= 0) & (j < size) if padding == "zeros" else np.ones(j.shape, dtype=bool)
    return np.clip(j, 0, size - 1), inside


def _grid_cubic(t):
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75
    return (
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    )


def k_grid_sample(x, grid, mode, padding, align_corners):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    t = w.dtype if w.dtype.kind == "f" else np.dtype(np.float32)
    spatial = x.shape[2:]
    nd = len(spatial)
    g = grid.astype(t)
    axes = []  # per spatial axis: [(index array, weight array, inside mask), ...]
    for i, size in enumerate(spatial):
        c = g[..., nd - 1 - i]  # the grid holds (x, y, z): the last spatial axis first
        pos = (c + 1) / 2 * (size - 1) if align_corners else ((c + 1) * size - 1) / 2
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if mode == "nearest":
            pos = np.rint(pos)
        if mode == "cubic":
            pass  # as onnxruntime and torch: each of the four taps is clamped or reflected on its own
        elif padding == "border":
            pos = np.where((pos < lo) | (pos > hi), np.clip(pos, 0, size - 1), pos)
        elif padding == "reflection":
            pos = _grid_reflect(pos, t.type(lo), t.type(hi)).astype(t)
        if mode == "nearest":
            taps = [(pos.astype(np.int64), np.ones(pos.shape, t))]
        else:
            base = np.floor(pos)
            frac = pos - base
            weights = (1 - frac, frac) if mode == "linear" else _grid_cubic(frac)
            first = 0 if mode == "linear" else -1
            taps = [(base.astype(np.int64) + first + k, weight) for k, weight in enumerate(weights)]
        axes.append([(*_grid_tap(index, size, lo, hi, padding), weight) for index, weight in taps])
    channels_last = np.moveaxis(w, 1, -1)  # (N, *spatial, C)
    batch = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
    out = np.zeros(grid.shape[:-1] + (x.shape[1],), dtype=t)
    corners = [[]]
    for taps in axes:  # every combination of one tap per axis
        corners = [corner + [tap] for corner in corners for tap in taps]
    for corner in corners:
        weight = np.ones(grid.shape[:-1], dtype=t)
        inside = np.ones(grid.shape[:-1], dtype=bool)
        for _, ok, tap_weight in corner:
            weight = weight * tap_weight
            inside = inside & ok
        pixels = channels_last[(batch, *[index for index, _, _ in corner])]
        out = out + np.where(inside, weight, t.type(0))[..., None] * pixels
    result = np.moveaxis(out, -1, 1)
    if x.dtype.kind in "iu":
        result = np.rint(result)
    return np.asarray(result.astype(x.dtype))


def k_affine_grid(theta, size, align_corners):
    t = np.float32 if theta.dtype == np.float16 else theta.dtype.type
    dims = [int(d) for d in np.asarray(size).reshape(-1)[2:]]
    axes = []
    for n in dims:  # normalised positions of the pixel centres (or corners) along each axis
        if align_corners:
            axes.append(np.linspace(-1, 1, n) if n > 1 else np.array([-1.0]))
        else:
            axes.append((np.arange(n) * 2 + 1) / n - 1)
    mesh = np.meshgrid(*axes, indexing="ij")
    points = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(mesh[0].size)], axis=0)  # (x, y[, z], 1)
    grid = np.matmul(theta.astype(t), points.astype(t))  # (N, nd, points)
    return np.asarray(np.swapaxes(grid, 1, 2).reshape((theta.shape[0], *dims, len(dims))).astype(theta.dtype))


# --- inference and attributes -----------------------------------------------------------------
def _grid_attrs(node):
    names = ("bilinear", "nearest", "bicubic") if node.version < 20 else ("linear", "nearest", "cubic")
    padding = choice(node, "padding_mode", "zeros", ("zeros", "border", "reflection"))
    return {
        "mode": MODES[choice(node, "mode", names[0], names)],
        "padding": padding,
        "align_corners": int(node.attr("align_corners", 0)),
    }


def _infer_grid_sample(node, inputs):
    need(node, inputs, 2)
    x, grid = inputs
    want(node, x, ((16, FLOATS), (20, ALL - {"bool"})))
    want(node, grid, ((16, FLOATS),), "grid")
    _grid_attrs(node)
    nd = x.rank - 2
    if nd < 1 or (node.version < 20 and nd != 2):
        raise ShapeInferenceError(
            f"{node.describe()}: X must be [N, C, H, W]{' or N-D' if node.version >= 20 else ''}, got {x}"
        )
    if (
        grid.rank != x.rank
        or grid.shape[-1] != nd
        or grid.shape[0] != x.shape[0]
        and not (isinstance(grid.shape[0], str) or isinstance(x.shape[0], str))
    ):
        raise ShapeInferenceError(f"{node.describe()}: grid must be [N, *output, {nd}] for X {x}, got {grid}")
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], *grid.shape[1:-1]))]


def _grid_flops(node, inputs, outputs):
    nd = inputs[1].shape[-1] if isinstance(inputs[1].shape[-1], int) else 2
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[_grid_attrs(node)["mode"]] ** nd
    return 3 * taps * outputs[0].numel()


def _infer_affine_grid(node, inputs, consts=None):
    need(node, inputs, 2)
    theta = inputs[0]
    want(node, theta, ((20, FLOATS),), "theta")
    size = vector(node, consts, 1, "size")
    nd = len(size) - 2
    if nd not in (2, 3) or theta.rank != 3 or tuple(theta.shape[1:]) != (nd, nd + 1):
        raise ShapeInferenceError(f"{node.describe()}: theta must be [N, {nd}, {nd + 1}] for size {size}, got {theta}")
    if any(d < 1 for d in size[2:]):
        raise ShapeInferenceError(f"{node.describe()}: size {size} has an empty spatial axis")
    return [TensorType(theta.dtype, (theta.shape[0], *size[2:], nd))]


OPS = (
    OpDef(
        "GridSample",
        (16, 20, 22),
        infer=_infer_grid_sample,
        fn=k_grid_sample,
        flops=_grid_flops,
        attrs=_grid_attrs,
        helpers=(_grid_reflect, _grid_tap, _grid_cubic),
        ATTRS={"mode": STR, "padding_mode": STR, "align_corners": INT},
    ),
    OpDef(
        "AffineGrid",
        (20,),
        infer=_infer_affine_grid,
        fn=k_affine_grid,
        flops=lambda node, inputs, outputs: 2 * outputs[0].numel() * (outputs[0].shape[-1] + 1),
        attrs=lambda node: {"align_corners": int(node.attr("align_corners", 0))},
        ATTRS={"align_corners": INT},
        CONST_INPUTS=(1,),
    ),
)
