"""RoiAlign (opsets 10, 16, 22), the op contract's one-row form (``_contract.py``): each region
of interest is cut into ``output_height`` x ``output_width`` bins, each bin is sampled on a
regular grid (``sampling_ratio`` points per axis, or ceil(bin size) when 0) by bilinear
interpolation, and the samples are averaged or maxed, as the ONNX reference and onnxruntime do
(opset 16 adds ``half_pixel`` coordinates, its default). Regions loop in Python (their grids
differ); each region is vectorised over channels, bins and samples, in float64.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._util import FLOAT, INT, STR, choice, need


def _roi_axis(start, size, bins, grid, limit):
    """Sample positions along one axis, (bins, grid): low and high indices, their weights, validity."""
    step = size / bins
    pos = start + np.arange(bins).reshape(-1, 1) * step + (np.arange(grid) + 0.5) * step / max(grid, 1)
    valid = (pos >= -1.0) & (pos <= limit)
    pos = np.maximum(pos, 0.0)
    low = np.trunc(pos).astype(np.int64)
    edge = low >= limit - 1
    low = np.where(edge, limit - 1, low)
    high = np.where(edge, limit - 1, low + 1)
    frac = np.where(edge, 0.0, pos - low)
    return low, high, 1.0 - frac, frac, valid


def k_roi_align(x, rois, batch_indices, *, height, width, ratio, scale, half_pixel, average):
    out = np.zeros((rois.shape[0], x.shape[1], height, width), dtype=np.float64)
    shift = 0.5 if half_pixel else 0.0
    for n in range(rois.shape[0]):
        x0, y0, x1, y1 = (float(v) * scale - shift for v in rois[n])
        roi_w, roi_h = (x1 - x0, y1 - y0) if half_pixel else (max(x1 - x0, 1.0), max(y1 - y0, 1.0))
        grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / height))
        grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / width))
        yl, yh, wyl, wyh, vy = _roi_axis(y0, roi_h, height, max(grid_h, 0), x.shape[2])
        xl, xh, wxl, wxh, vx = _roi_axis(x0, roi_w, width, max(grid_w, 0), x.shape[3])
        data = x[int(batch_indices[n])].astype(np.float64)  # (C, H, W)
        shape = (height, max(grid_h, 0), 1, 1), (1, 1, width, max(grid_w, 0))
        ok = vy.reshape(shape[0]) & vx.reshape(shape[1])
        taps = []
        for yi, wy in ((yl, wyl), (yh, wyh)):
            for xi, wx in ((xl, wxl), (xh, wxh)):
                weight = np.where(ok, wy.reshape(shape[0]) * wx.reshape(shape[1]), 0.0)
                taps.append(weight * data[:, yi.reshape(shape[0]), xi.reshape(shape[1])])
        if average:
            out[n] = sum(taps).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        elif grid_h > 0 and grid_w > 0:
            out[n] = np.max(np.maximum(np.maximum(taps[0], taps[1]), np.maximum(taps[2], taps[3])), axis=(2, 4))
    return out.astype(x.dtype)


def _roi_attrs(node):
    half = (
        node.version >= 16
        and choice(node, "coordinate_transformation_mode", "half_pixel", ("half_pixel", "output_half_pixel"))
        == "half_pixel"
    )
    return {
        "height": int(node.attr("output_height", 1)),
        "width": int(node.attr("output_width", 1)),
        "ratio": int(node.attr("sampling_ratio", 0)),
        "scale": float(node.attr("spatial_scale", 1.0)),
        "half_pixel": half,
        "average": choice(node, "mode", "avg", ("avg", "max")) == "avg",
    }


def _infer_roi_align(node, inputs):
    need(node, inputs, 3)
    x, rois, indices = inputs
    want(node, x, ((10, FLOATS),))
    attrs = _roi_attrs(node)
    if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or rois.dtype != x.dtype:
        raise ShapeInferenceError(
            f"{node.describe()}: X must be [N, C, H, W] and rois [R, 4] of its dtype, got {x}, {rois}"
        )
    if not all(isinstance(d, int) for d in x.shape[2:]):
        raise ShapeInferenceError(f"{node.describe()}: the spatial axes of X must be static, got {x}")
    if indices.dtype != "int64" or indices.rank != 1:
        raise ShapeInferenceError(f"{node.describe()}: batch_indices must be an int64 vector, got {indices}")
    if attrs["height"] < 1 or attrs["width"] < 1 or attrs["ratio"] < 0:
        raise ShapeInferenceError(f"{node.describe()}: output sizes must be positive and sampling_ratio >= 0")
    return [TensorType(x.dtype, (rois.shape[0], x.shape[1], attrs["height"], attrs["width"]))]


def _roi_flops(node, inputs, outputs):
    ratio = _roi_attrs(node)["ratio"] or 2
    return 12 * ratio * ratio * outputs[0].numel()


OPS = (
    OpDef(
        "RoiAlign",
        (10, 16, 22),
        infer=_infer_roi_align,
        fn=k_roi_align,
        flops=_roi_flops,
        attrs=_roi_attrs,
        helpers=(_roi_axis,),
        ATTRS={
            "coordinate_transformation_mode": STR,
            "mode": STR,
            "output_height": INT,
            "output_width": INT,
            "sampling_ratio": INT,
            "spatial_scale": FLOAT,
        },
    ),
)
