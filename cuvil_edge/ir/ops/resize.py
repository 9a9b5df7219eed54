"""Resize and its predecessor Upsample, one table row each (the op contract: ``_contract.py``).

Resize is nearest, (multi)linear or (multi)cubic resampling to ``scales`` or ``sizes``. Opset 10
takes (X, scales) with asymmetric coordinates and onnxruntime's "simple" nearest rounding
(nearest and linear only); from 11 (X, roi, scales, sizes) with
coordinate_transformation_mode half_pixel, half_pixel_symmetric (19), pytorch_half_pixel,
align_corners, asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize (roi input,
extrapolation_value), nearest_mode round_prefer_floor/ceil, floor, ceil, mode cubic
(cubic_coeff_a, exclude_outside); from 18 ``axes``, ``keep_aspect_ratio_policy`` and
``antialias`` (linear and cubic: the kernel is widened by 1/scale when downsampling and its
weights renormalised).  Axes are resampled one at a time (the ONNX definition is separable).
Cubic, antialiased and cropped resampling weigh taps in float64 (as ONNX's reference does)
and cast back to X's dtype.

Upsample (opsets 7 and 9; deprecated at 10) scales each axis by a factor >= 1 with asymmetric
coordinates, nearest (floor) or linear; its scales are an attribute at 7 and a constant input at 9.
"""

from __future__ import annotations

import math

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import MAX_DIM, TensorType
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, per_element
from cuvil_edge.ir.ops._elementwise import ALL, want
from cuvil_edge.ir.ops._scratch import resize_scratch, upsample_scratch
from cuvil_edge.ir.ops._shape import axes as norm_axes, floats, vector
from cuvil_edge.ir.ops._util import (
    FLOAT,
    FLOATS as FLOAT_LIST,
    INT,
    INTS,
    STR,
    choice,
    ints,
    need,
    required,
    text,
    want_dtype,
)

_COORDS = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)


# --- kernel and helpers: plain numpy; the same source runs in compiled modules -----------------
def _resize_plan(shape, scales, sizes, axes, policy):
    """Per axis (output size, scale) as onnxruntime computes them (float32 arithmetic)."""
    rank = len(shape)
    along = [int(a) + rank if int(a) < 0 else int(a) for a in axes] or list(range(rank))
    out, scale = list(shape), [np.float32(1)] * rank
    if sizes is not None and len(sizes):
        asked = [int(s) for s in sizes]
        if policy != "stretch":
            ratios = [np.float32(s) / np.float32(shape[a]) for s, a in zip(asked, along, strict=True)]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in along:
                out[a], scale[a] = int(np.floor(common * np.float32(shape[a]) + np.float32(0.5))), np.float32(common)
        else:
            for a, s in zip(along, asked, strict=True):
                out[a], scale[a] = s, np.float32(s) / np.float32(shape[a])
    else:
        for a, s in zip(along, scales, strict=True):
            out[a], scale[a] = int(np.floor(np.float32(s) * np.float32(shape[a]))), np.float32(s)
    return out, scale


def _resize_coords(size_in, size_out, scale, coord):
    x = np.arange(size_out, dtype=np.float32)
    if coord == "half_pixel":
        return (x + np.float32(0.5)) / scale - np.float32(0.5)
    if coord == "half_pixel_symmetric":
        adjust = np.float32(size_out) / (scale * np.float32(size_in))
        offset = np.float32(size_in) / np.float32(2) * (np.float32(1) - adjust)
        return offset + (x + np.float32(0.5)) / scale - np.float32(0.5)
    if coord == "pytorch_half_pixel":
        return (x + np.float32(0.5)) / scale - np.float32(0.5) if size_out > 1 else np.zeros_like(x)
    if coord == "align_corners":
        return x * np.float32(size_in - 1) / np.float32(size_out - 1) if size_out > 1 else np.zeros_like(x)
    if coord == "tf_half_pixel_for_nn":
        return (x + np.float32(0.5)) / scale
    return x / scale


def _resize_nearest(coords, nearest, scale):
    if nearest == "simple":
        index = np.ceil(coords) if scale < 1 else np.trunc(coords)
    elif nearest == "floor":
        index = np.floor(coords)
    elif nearest == "ceil":
        index = np.ceil(coords)
    else:
        frac = coords - np.floor(coords)
        tie = np.floor(coords) if nearest == "round_prefer_floor" else np.ceil(coords)
        index = np.where(frac == np.float32(0.5), tie, np.round(coords))
    return index.astype(np.int64)


def _resize_roi(roi, rank, axes):
    """Per axis (start, end) of tf_crop_and_resize's roi (normalised coordinates)."""
    pairs = [(0.0, 1.0)] * rank
    if roi is None or not np.size(roi):
        return pairs
    box = [float(v) for v in np.asarray(roi).reshape(-1)]
    along = [int(a) + rank if int(a) < 0 else int(a) for a in axes] or list(range(rank))
    n = len(along)
    for i, a in enumerate(along):
        pairs[a] = (box[i], box[n + i])
    return pairs


def _resize_crop_coords(size_in, size_out, pair):
    x = np.arange(size_out, dtype=np.float64)
    start, end = pair
    if size_out > 1:
        coords = start * (size_in - 1) + x * (end - start) * (size_in - 1) / (size_out - 1)
    else:
        coords = np.full(size_out, 0.5 * (start + end) * (size_in - 1))
    return coords, (coords < 0) | (coords > size_in - 1)


def _resize_weights(coords, size_in, mode, scale, a, exclude, antialias):
    """Taps (out, k) and their weights for linear / cubic resampling at ``coords``."""
    s = min(float(scale), 1.0) if antialias else 1.0
    radius = (2.0 if mode == "cubic" else 1.0) / s
    start = int(np.floor(-radius)) + 1
    index = np.floor(coords).astype(np.int64)[:, None] + np.arange(start, 2 - start)[None, :]
    t = np.abs((index - coords[:, None]) * s)
    if mode == "cubic":
        w = np.where(
            t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1, np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0)
        )
    else:
        w = np.maximum(1 - t, 0.0)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    if exclude:
        w = np.where((index < 0) | (index >= size_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, size_in - 1), w


def k_resize(
    x,
    roi=None,
    scales=None,
    sizes=None,
    mode="nearest",
    coord="half_pixel",
    nearest="round_prefer_floor",
    axes=(),
    policy="stretch",
    a=-0.75,
    exclude=0,
    extrapolation=0.0,
    antialias=0,
    legacy=False,
):
    # opset 10 takes (X, scales): its second input arrives as ``roi``
    box, factors, wanted = (None, roi, None) if legacy else (roi, scales, sizes)
    out, scale = _resize_plan(
        x.shape, None if factors is None or not np.size(factors) else factors, wanted, axes, policy
    )
    crop = coord == "tf_crop_and_resize"
    pairs = _resize_roi(box, x.ndim, axes) if crop else None
    weighted = mode == "cubic" or antialias or crop
    y = x.astype(np.float64) if weighted and mode != "nearest" else x
    for axis in range(x.ndim):
        size_in = x.shape[axis]
        if out[axis] == size_in and scale[axis] == 1 and (not crop or pairs[axis] == (0.0, 1.0)):
            continue
        shape = [1] * x.ndim
        shape[axis] = out[axis]
        outside = None
        if crop:
            coords, outside = _resize_crop_coords(size_in, out[axis], pairs[axis])
        else:
            coords = _resize_coords(size_in, out[axis], scale[axis], coord)
        if mode == "nearest":
            index = np.clip(_resize_nearest(coords, nearest, scale[axis]), 0, size_in - 1)
            y = np.take(y, index, axis=axis)
        elif weighted:
            index, w = _resize_weights(coords.astype(np.float64), size_in, mode, scale[axis], a, exclude, antialias)
            acc = None
            for k in range(index.shape[1]):
                term = np.take(y, index[:, k], axis=axis) * w[:, k].reshape(shape)
                acc = term if acc is None else acc + term
            y = acc
        else:
            coords = np.clip(coords, 0, size_in - 1)
            low = np.minimum(np.floor(coords).astype(np.int64), size_in - 1)
            high = np.minimum(low + 1, size_in - 1)
            frac = (coords - low).astype(x.dtype).reshape(shape)
            y = np.take(y, low, axis=axis) * (1 - frac) + np.take(y, high, axis=axis) * frac
        if outside is not None and outside.any():
            y = np.where(outside.reshape(shape), np.asarray(extrapolation).astype(y.dtype), y)
    return np.ascontiguousarray(y.astype(x.dtype, copy=False))


# --- inference and attributes -------------------------------------------------------------------
def options(node) -> tuple:
    """(mode, coordinate mode, nearest mode, axes, keep_aspect_ratio_policy, legacy) after validation."""
    legacy = node.version < 11
    mode = text(node, "mode", "nearest")
    coord = "asymmetric" if legacy else text(node, "coordinate_transformation_mode", "half_pixel")
    nearest = "simple" if legacy else text(node, "nearest_mode", "round_prefer_floor")
    policy = text(node, "keep_aspect_ratio_policy", "stretch") if node.version >= 18 else "stretch"
    coords = _COORDS + (("half_pixel_symmetric",) if node.version >= 19 else ())
    modes = ("nearest", "linear") if legacy else ("nearest", "linear", "cubic")
    problems = []
    if mode not in modes:
        problems.append(f"mode={mode!r} (supported: {', '.join(modes)})")
    if coord not in coords + ("asymmetric",):
        problems.append(f"coordinate_transformation_mode={coord!r} (supported: {', '.join(coords)})")
    if nearest not in ("simple", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        problems.append(f"nearest_mode={nearest!r}")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        problems.append(f"keep_aspect_ratio_policy={policy!r}")
    antialias = int(node.attr("antialias", 0)) if node.version >= 18 else 0
    if antialias and mode == "nearest":
        problems.append("antialias=1 with mode='nearest' (antialias needs linear or cubic)")
    if problems:
        raise UnsupportedAttributeError(f"{node.describe()}: unsupported {'; '.join(problems)}")
    axes = tuple(ints(node, "axes")) if node.version >= 18 else ()
    return mode, coord, nearest, axes, policy, int(legacy)


def extras(node) -> tuple:
    """(cubic_coeff_a, exclude_outside, extrapolation_value, antialias); ONNX's defaults before opset 11."""
    if node.version < 11:
        return -0.75, 0, 0.0, 0
    return (
        float(node.attr("cubic_coeff_a", -0.75)),
        int(node.attr("exclude_outside", 0)),
        float(node.attr("extrapolation_value", 0.0)),
        int(node.attr("antialias", 0)) if node.version >= 18 else 0,
    )


def _inputs(node, consts):
    """(scales, sizes) from the constant inputs; sizes may hold symbols."""
    if node.version < 11:
        return floats(node, consts, 1, "scales"), None
    scales = floats(node, consts, 2, "scales")
    sizes = None
    if len(node.inputs) > 3 and node.inputs[3]:
        sizes = vector(node, consts, 3, "sizes", symbols=True) or None
    if (scales is None) == (sizes is None):
        raise ShapeInferenceError(f"{node.describe()} needs exactly one of scales and sizes (non-empty)")
    return scales, sizes


def _infer(node, inputs, consts=None):
    need(node, inputs, 2 if node.version < 11 else 1, optional=0 if node.version < 11 else 3)
    x = inputs[0]
    want_dtype(
        node, x, dtypes.FLOATS | ({"int8", "uint8", "int32", "int64"} if options(node)[0] == "nearest" else set())
    )
    _, coord, _, axes, policy, _ = options(node)
    scales, sizes = _inputs(node, consts)
    axes = norm_axes(node, list(axes), x.rank) if axes else list(range(x.rank))
    if coord == "tf_crop_and_resize":
        _check_roi(node, inputs[1] if len(inputs) > 1 else None, len(axes))
    given = sizes if sizes is not None else scales
    if len(given) != len(axes):
        raise ShapeInferenceError(f"{node.describe()}: {len(given)} scales/sizes for {len(axes)} axes of {x}")
    symbolic = {a: v for a, v in zip(axes, given, strict=True) if isinstance(x.shape[a], str) or isinstance(v, str)}
    for a, v in symbolic.items():
        if not (v == x.shape[a] or (sizes is None and v == 1.0)) or policy != "stretch":
            raise ShapeInferenceError(
                f"{node.describe()}: axis {a} ({x.shape[a]!r}) is resized to {v!r}, "
                "which depends on a symbol; make that dim static"
            )
    static = [d if isinstance(d, int) else 1 for d in x.shape]
    plain = [1 if isinstance(v, str) else v for v in given] if sizes is not None else None
    _check_request(node, static, scales, plain, axes, policy)
    out, _ = _resize_plan(static, scales, plain, axes, policy)
    shape = tuple(x.shape[a] if a in symbolic or a not in axes else out[a] for a in range(x.rank))
    if any(d == 0 for d in shape if isinstance(d, int)) and x.numel():
        raise ShapeInferenceError(f"{node.describe()}: output shape {list(shape)} has an empty axis")
    return [TensorType(x.dtype, shape)]


def _check_roi(node, roi, count: int) -> None:
    """tf_crop_and_resize's roi: absent, empty, or a float vector of (starts, ends) for the resized axes.

    Raises:
        ShapeInferenceError: another dtype or shape.
    """
    if roi is not None and (roi.dtype not in dtypes.FLOATS or roi.shape not in ((0,), (2 * count,))):
        raise ShapeInferenceError(
            f"{node.describe()}: roi {roi} must be a float vector of {2 * count} entries "
            "(starts and ends of the resized axes)"
        )


def _check_request(node, static, scales, sizes, axes, policy) -> None:
    """Scales finite and positive, sizes not negative (nor positive for an empty axis), output dims
    within MAX_DIM (checked before planning).

    Raises:
        ShapeInferenceError: a scale or size that cannot give a valid output shape.
    """
    if sizes is None:
        for a, s in zip(axes, scales, strict=True):
            if not (math.isfinite(s) and s > 0) or s * static[a] > MAX_DIM:
                raise ShapeInferenceError(
                    f"{node.describe()}: scale {s!r} for axis {a} (size {static[a]}) must be "
                    f"positive, finite and give at most {MAX_DIM} elements"
                )
        return
    if any(s < 0 for s in sizes):
        raise ShapeInferenceError(f"{node.describe()}: sizes {sizes} must not be negative")
    if any(static[a] == 0 and s != 0 for s, a in zip(sizes, axes, strict=True)):
        raise ShapeInferenceError(f"{node.describe()}: cannot resize an empty axis to sizes {sizes}")
    if policy != "stretch" and sizes:
        if any(static[a] == 0 for a in axes):
            raise ShapeInferenceError(f"{node.describe()}: keep_aspect_ratio_policy={policy!r} needs non-empty axes")
        if max(s / static[a] for s, a in zip(sizes, axes, strict=True)) * max(static[a] for a in axes) > MAX_DIM:
            raise ShapeInferenceError(f"{node.describe()}: sizes {sizes} give more than {MAX_DIM} elements on an axis")


def _flops(node, inputs, outputs):
    per = {"linear": 4, "cubic": 8}.get(text(node, "mode", "nearest"), 0)
    return per * outputs[0].numel() * max(1, inputs[0].rank - 2)


def _attrs(node):
    mode, coord, nearest, axes, policy, legacy = options(node)
    a, exclude, extrapolation, antialias = extras(node)
    if not math.isfinite(extrapolation):
        extrapolation = str(extrapolation)  # "nan", "inf": a literal the generated module can hold; numpy parses it
    return {
        "mode": mode,
        "coord": coord,
        "nearest": nearest,
        "axes": axes,
        "policy": policy,
        "a": a,
        "exclude": exclude,
        "extrapolation": extrapolation,
        "antialias": antialias,
        "legacy": bool(legacy),
    }


# --- Upsample: Resize's predecessor (opsets 7 and 9) ---------------------------------------------
def k_upsample(x, scales, linear):
    out = x
    for axis, s in enumerate(np.asarray(scales, dtype=np.float64).reshape(-1)):
        size = x.shape[axis]
        new = int(np.floor(size * float(s)))
        src = np.arange(new, dtype=np.float64) / float(s)  # asymmetric: out index / scale
        if not linear:
            out = np.take(out, np.minimum(np.floor(src).astype(np.int64), size - 1), axis=axis)
            continue
        lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        frac = (src - lo).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
        w = out.astype(np.float64)
        out = np.take(w, lo, axis=axis) * (1 - frac) + np.take(w, hi, axis=axis) * frac
    return np.asarray(out).astype(x.dtype)


def _upsample_mode(node):
    return choice(node, "mode", "nearest", ("nearest", "linear")) == "linear"


def _upsample_scales(node, consts):
    if node.version < 9:
        scales = node.attr("scales")
    else:
        value = (consts or {}).get(1)
        scales = None if value is None else np.asarray(value, dtype=np.float64).reshape(-1).tolist()
    if not scales:
        raise ShapeInferenceError(f"{node.describe()}: scales must be an attribute (opset 7) or a constant input")
    return [float(s) for s in scales]


def _infer_upsample(node, inputs, consts=None):
    need(node, inputs, 1 if node.version < 9 else 2)
    x = inputs[0]
    want(node, x, ((7, ALL),))
    _upsample_mode(node)
    scales = _upsample_scales(node, consts)
    if len(scales) != x.rank or any(s < 1 for s in scales):
        raise ShapeInferenceError(f"{node.describe()}: scales {scales} must give one factor >= 1 per axis of {x}")
    shape = []
    for d, s in zip(x.shape, scales, strict=True):
        if not isinstance(d, int) and s != 1:
            raise ShapeInferenceError(f"{node.describe()}: cannot scale the symbolic dim {d!r}")
        shape.append(int(math.floor(d * s)) if isinstance(d, int) else d)
    return [TensorType(x.dtype, tuple(shape))]


def _upsample_attrs(node):
    out = {"linear": _upsample_mode(node)}
    if node.version < 9:
        out["scales"] = tuple(float(s) for s in required(node, "scales"))
    return out


OPS = (
    OpDef(
        "Resize",
        (10, 11, 13, 18, 19),
        batch=BatchRule("resize", shape=(1, 2, 3)),
        infer=_infer,
        fn=k_resize,
        flops=_flops,
        attrs=_attrs,
        helpers=(_resize_plan, _resize_coords, _resize_nearest, _resize_roi, _resize_crop_coords, _resize_weights),
        ATTRS={
            "antialias": INT,
            "axes": INTS,
            "coordinate_transformation_mode": STR,
            "cubic_coeff_a": FLOAT,
            "exclude_outside": INT,
            "extrapolation_value": FLOAT,
            "keep_aspect_ratio_policy": STR,
            "mode": STR,
            "nearest_mode": STR,
        },
        CONST_INPUTS=(1, 2, 3),
        scratch=resize_scratch,
    ),
    OpDef(
        "Upsample",
        (7, 9),
        infer=_infer_upsample,
        fn=k_upsample,
        flops=per_element(4),
        attrs=_upsample_attrs,
        ATTRS={"mode": STR, "scales": FLOAT_LIST},
        CONST_INPUTS=(1,),
        scratch=upsample_scratch,
    ),
)
