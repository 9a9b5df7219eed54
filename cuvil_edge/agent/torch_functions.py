"""Torch functions for the IR ops that carry no trained weight (used by :mod:`torch_model`).

Each entry of :data:`FUNCTIONS` computes one op like its IR kernel, ``fn(node, *tensors)``, with the
node's attributes read per call; the initializers it reads are constants. Convolution and pooling
geometry (explicit pads, ``auto_pad``) lives here too, shared with the Conv layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from cuvil_edge.errors import UnsupportedAttributeError, UnsupportedOpError
from cuvil_edge.ir import dtypes, ops
from cuvil_edge.ir.graph import Node

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y,
    "relu": F.relu,
    "relu6": lambda y: torch.clamp(y, 0.0, 6.0),
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
    "swish": F.silu,
}


def activation(node: Node) -> Callable[[torch.Tensor], torch.Tensor]:
    name = node.attr("activation", "none")
    if name not in ACTIVATIONS:
        raise UnsupportedAttributeError(f"{node.describe()}: activation {name!r} has no training lowering")
    return ACTIVATIONS[name]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def check(node: Node) -> None:
    """Refuse, when the module is built, what a function could otherwise only refuse mid-training.

    Raises:
        UnsupportedAttributeError: an activation, Pad mode, dilated AveragePool or blocked
            quantization without a lowering.
        UnsupportedOpError: MaxPool's Indices output is used.
    """
    activation(node)
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOpError(f"{node.describe()}: MaxPool's Indices output has no training lowering")
    if node.op_type == "AveragePool" and any(d != 1 for d in node.attr("dilations") or ()):
        raise UnsupportedAttributeError(f"{node.describe()}: dilated AveragePool has no training lowering")
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.attr("block_size", 0):
        raise UnsupportedAttributeError(f"{node.describe()}: blocked quantization has no training lowering")
    if node.op_type == "QuantizeLinear" and node.attr("output_dtype", 0):
        raise UnsupportedAttributeError(
            f"{node.describe()}: QuantizeLinear's output_dtype has no training lowering; "
            "give the zero point in the dtype wanted"
        )
    if node.op_type == "Pad" and node.attr("mode", "constant") not in _PAD_MODES:
        raise UnsupportedAttributeError(f"{node.describe()}: Pad mode {node.attr('mode')!r} has no training lowering")


# --- windows (convolution and pooling geometry) ----------------------------------------------
def window_pads(node: Node, spatial: Any, kernel: Any, strides: Any, dilations: Any) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis, auto_pad resolved for this input size."""
    auto, n = node.attr("auto_pad", "NOTSET"), len(kernel)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            total = max(0, (-(-int(size) // s) - 1) * s + (k - 1) * d + 1 - int(size))
            small = total // 2
            out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
        return out
    pads = [0] * (2 * n) if auto == "VALID" else list(node.attr("pads") or [0] * (2 * n))
    return list(zip(pads[:n], pads[n:], strict=True))


def torch_pads(pads: list[tuple[int, int]]) -> tuple[int, ...]:
    """ONNX (begin, end) per axis -> F.pad's order (last axis first)."""
    return tuple(v for begin, end in reversed(pads) for v in (begin, end))


def _pool(node: Node, x: torch.Tensor) -> torch.Tensor:
    kernel = tuple(node.attr("kernel_shape"))
    n = len(kernel)
    strides, dilations = tuple(node.attr("strides") or (1,) * n), tuple(node.attr("dilations") or (1,) * n)
    ceil = bool(node.attr("ceil_mode", 0))
    pads = window_pads(node, x.shape[2:], kernel, strides, dilations)
    native = all(b == e and b <= k // 2 for (b, e), k in zip(pads, kernel, strict=True))
    padding = tuple(b for b, _ in pads) if native else 0
    if node.op_type == "MaxPool":
        if not native:
            x = F.pad(x, torch_pads(pads), value=float("-inf"))
        return (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1](x, kernel, strides, padding, dilations, ceil)
    avg = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
    include = bool(node.attr("count_include_pad", 0))
    if native:
        return avg(x, kernel, strides, padding, ceil, include)
    padded = F.pad(x, torch_pads(pads))
    if include:
        return avg(padded, kernel, strides, 0, ceil)
    mask = F.pad(torch.ones_like(x[:1, :1]), torch_pads(pads))
    return avg(padded, kernel, strides, 0, ceil) / avg(mask, kernel, strides, 0, ceil)


# --- functions ------------------------------------------------------------------------------
def _flatten(node: Node, x):
    axis = int(node.attr("axis", 1))
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _reshape(node: Node, x, shape):
    target = [int(s) for s in shape.tolist()]
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    if x.numel() == 0 and -1 in target:  # an empty Poisson batch: -1 from the axes that are not empty
        rest = math.prod(d for d in target if d not in (0, -1))
        target = [math.prod(d for d in x.shape if d) // rest if d == -1 else d for d in target]
    return x.reshape(target)


def _axes(node: Node, given, since: int) -> list[int] | None:
    """Axes from the attribute (before opset ``since``) or the optional input."""
    axes = node.attr("axes") if node.version < since else (None if given is None else given.tolist())
    return None if axes is None else [int(a) for a in axes]


def _unsqueeze(node: Node, x, axes=None):
    chosen: list[int] = _axes(node, axes, 13)  # type: ignore[assignment]  # Unsqueeze has axes (infer checks)
    rank = x.dim() + len(chosen)
    for axis in sorted(a % rank for a in chosen):
        x = x.unsqueeze(axis)
    return x


def _squeeze(node: Node, x, axes=None):
    dims = _axes(node, axes, 13)
    return x.squeeze() if not dims else x.squeeze(tuple(a % x.dim() for a in dims))


def _reduce(op: Callable[..., torch.Tensor], since: int) -> Callable[..., torch.Tensor]:
    def fn(node: Node, x, axes=None):
        dims = _axes(node, axes, since)
        if not dims:
            if node.version >= since and node.attr("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.dim()))
        return op(x, tuple(sorted(a % x.dim() for a in dims)), bool(node.attr("keepdims", 1)))

    return fn


def _softmax(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def fn(node: Node, x):
        if node.version < 13:
            axis = int(node.attr("axis", 1)) % x.dim()
            return function(x.reshape(math.prod(x.shape[:axis]), -1), dim=1).reshape(x.shape)
        return function(x, dim=int(node.attr("axis", -1)))

    return fn


def _gemm(node: Node, a, b, c=None):
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    y = node.attr("alpha", 1.0) * (a @ b)
    return activation(node)(y if c is None else y + node.attr("beta", 1.0) * c)


def _conv(node: Node, x, w, b=None):
    n = w.dim() - 2
    strides, dilations = tuple(node.attr("strides") or (1,) * n), tuple(node.attr("dilations") or (1,) * n)
    x = F.pad(x, torch_pads(window_pads(node, x.shape[2:], w.shape[2:], strides, dilations)))
    y = (F.conv1d, F.conv2d, F.conv3d)[n - 1](x, w, b, strides, 0, dilations, int(node.attr("group", 1)))
    return activation(node)(y)


def _norm(node: Node, x, scale, bias=None):
    eps = float(node.attr("epsilon", 1e-5))
    if node.op_type == "LayerNormalization":
        y = F.layer_norm(x, x.shape[int(node.attr("axis", -1)) % x.dim() :], eps=eps) * scale
        return y if bias is None else y + bias
    if node.op_type == "InstanceNormalization":
        return F.group_norm(x, x.shape[1], scale, bias, eps)
    groups = int(node.attr("num_groups"))
    if node.version >= 21:
        return F.group_norm(x, groups, scale, bias, eps)
    grouped = x.reshape(x.shape[0], groups, math.prod(x.shape[1:]) // groups)
    return F.group_norm(grouped, groups, scale, bias, eps).reshape(x.shape)


def _clip(node: Node, x, low=None, high=None):
    if node.version < 11:
        low, high = node.attr("min"), node.attr("max")
    return torch.clamp(x, low, high) if low is not None or high is not None else x


def _slice(node: Node, x, starts=None, ends=None, axes=None, steps=None):
    if node.version < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
    else:
        starts, ends = starts.tolist(), ends.tolist()
        axes, steps = (None if t is None else t.tolist() for t in (axes, steps))
    axes = list(range(len(starts))) if axes is None else axes
    for start, end, axis, step in zip(starts, ends, axes, steps or [1] * len(starts), strict=True):
        axis = int(axis) % x.dim()
        index = range(*slice(int(start), int(end), int(step)).indices(x.shape[axis]))
        x = x.index_select(axis, torch.tensor(list(index), dtype=torch.int64))
    return x


def _gather(node: Node, x, indices):
    axis = int(node.attr("axis", 0)) % x.dim()
    picked = x.index_select(axis, indices.reshape(-1).long() % x.shape[axis])
    return picked.reshape((*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]))


def _shape(node: Node, x):
    dims = list(x.shape)
    start, end = int(node.attr("start", 0)), node.attr("end")
    return torch.tensor(dims[start : None if end is None else int(end)], dtype=torch.int64)


def _cast(node: Node, x):
    return x.to(getattr(torch, dtypes.FROM_ONNX_CODE[int(node.attr("to"))]))


#: Integer range of a QuantizeLinear output, by its zero point's dtype (uint8 when it has none).
_QUANT_RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


def _per_axis(node: Node, param: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-tensor (scalar) or per-axis (1-D along ``axis``) QDQ parameter, shaped to broadcast on ``x``."""
    if param.dim() == 0 or param.numel() == 1:
        return param.reshape(())
    axis = int(node.attr("axis", 1)) % x.dim()
    return param.reshape([-1 if d == axis else 1 for d in range(x.dim())])


def _quantize_linear(node: Node, x, scale, zero=None):
    """Fake quantization for quantization-aware training: the integer values ONNX's QuantizeLinear
    computes (round half to even, saturate), kept as float so that DequantizeLinear can follow, with
    the straight-through estimator: inside the range the gradient passes as if rounding were the
    identity, outside it is zero (the value saturated)."""
    kind = zero.dtype if zero is not None else torch.uint8
    if kind not in _QUANT_RANGES:
        raise UnsupportedAttributeError(
            f"{node.describe()}: quantization to {kind} has no training lowering (int8 and uint8 have)"
        )
    lo, hi = _QUANT_RANGES[kind]
    z = _per_axis(node, zero, x).to(x.dtype) if zero is not None else 0.0
    v = x / _per_axis(node, scale, x).to(x.dtype)
    rounded = v + (torch.round(v) - v).detach()
    return torch.clamp(rounded + z, lo, hi)


def _dequantize_linear(node: Node, q, scale, zero=None):
    s = _per_axis(node, scale, q).to(scale.dtype)
    z = _per_axis(node, zero, q).to(scale.dtype) if zero is not None else 0.0
    return (q.to(scale.dtype) - z) * s


def _div(node: Node, a, b):
    integral = not (a.is_floating_point() or b.is_floating_point())
    return torch.div(a, b, rounding_mode="trunc") if integral else a / b


def _pad(node: Node, x, pads=None, value=None, axes=None):
    if node.version < 11:
        pads, value = node.attr("pads"), node.attr("value", 0.0)
    else:
        pads = pads.tolist()
        value = 0.0 if value is None else value.reshape(-1)[0].item()
    axes = list(range(x.dim())) if axes is None else [int(a) % x.dim() for a in axes.tolist()]
    full = [(0, 0)] * x.dim()
    for i, axis in enumerate(axes):
        full[axis] = (int(pads[i]), int(pads[i + len(axes)]))
    mode = _PAD_MODES[node.attr("mode", "constant")]  # checked by check()
    if mode == "constant":
        return F.pad(x, torch_pads(full), value=value)
    lead = min((i for i, p in enumerate(full) if p != (0, 0)), default=x.dim())
    if lead == x.dim():
        return x
    if lead == 0 or x.dim() - lead > 3:
        raise UnsupportedAttributeError(
            f"{node.describe()}: {mode} padding of the batch axis or of more than "
            "three trailing axes has no training lowering"
        )
    y = F.pad(x.reshape(1, -1, *x.shape[lead:]), torch_pads(full[lead:]), mode=mode)
    return y.reshape(*x.shape[:lead], *y.shape[2:])


def _split(node: Node, x, split=None):
    axis = int(node.attr("axis", 0)) % x.dim()
    sizes = node.attr("split") if node.version < 13 else (None if split is None else split.tolist())
    if not sizes:  # equal parts; from opset 18 the last may be smaller
        parts = int(node.attr("num_outputs", len(node.outputs)))
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return tuple(torch.split(x, [int(s) for s in sizes], dim=axis))


def _constant_of_shape(node: Node, shape):
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return torch.from_numpy(np.full([int(d) for d in shape.tolist()], value[0], value.dtype))


def _lrn(node: Node, x):
    size, channels = int(node.attr("size")), x.shape[1]
    before = (size - 1) // 2  # channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
    padded = F.pad(x * x, torch_pads([(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.dim() - 2)))
    window = sum(padded[:, i : i + channels] for i in range(size))
    scale = node.attr("bias", 1.0) + node.attr("alpha", 1e-4) / size * window
    return x / scale ** node.attr("beta", 0.75)


def _is_inf(node: Node, x):
    positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    return (torch.isposinf(x) & bool(positive)) | (torch.isneginf(x) & bool(negative))


def _variadic(op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda node, *xs: reduce(op, xs)


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(d, keepdim=True)
    return x if keep else x.squeeze(dims) if dims else x


FUNCTIONS: dict[str, Callable] = {
    "Swish": lambda node, x: x * torch.sigmoid(node.attr("alpha", 1.0) * x),
    "PRelu": lambda node, x, slope: torch.where(x < 0, x * slope, x),
    "Identity": lambda node, x: x,
    "IsInf": _is_inf,
    "LRN": _lrn,
    "Clip": _clip,
    "Dropout": lambda node, x, *settings: x,
    "Div": _div,
    "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Sum": _variadic(torch.add),
    "Mean": lambda node, *xs: reduce(torch.add, xs) / len(xs),
    "Mod": lambda node, a, b: torch.fmod(a, b) if node.attr("fmod", 0) else torch.remainder(a, b),
    "MatMul": lambda node, a, b: a @ b,
    "Gemm": _gemm,
    "CuvilFusedGemm": _gemm,
    "CuvilFusedMatMul": lambda node, a, b, c=None: activation(node)(a @ b if c is None else a @ b + c.reshape(-1)),
    "Conv": _conv,
    "CuvilFusedConv": _conv,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": lambda node, x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True),
    "GlobalMaxPool": lambda node, x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True),
    "BatchNormalization": lambda node, x, scale, bias, mean, var: F.batch_norm(
        x, mean, var, scale, bias, False, 0.0, float(node.attr("epsilon", 1e-5))
    ),
    "InstanceNormalization": _norm,
    "GroupNormalization": _norm,
    "LayerNormalization": _norm,
    "Softmax": _softmax(F.softmax),
    "LogSoftmax": _softmax(F.log_softmax),
    "ReduceMean": _reduce(torch.mean, 18),
    "ReduceSum": _reduce(torch.sum, 13),
    "ReduceMax": _reduce(torch.amax, 18),
    "ReduceMin": _reduce(torch.amin, 18),
    "ReduceProd": _reduce(_prod, 18),
    "ReduceL1": _reduce(lambda x, d, k: x.abs().sum(d, keepdim=k), 18),
    "ReduceL2": _reduce(lambda x, d, k: (x * x).sum(d, keepdim=k).sqrt(), 18),
    "ReduceSumSquare": _reduce(lambda x, d, k: (x * x).sum(d, keepdim=k), 18),
    "ReduceLogSumExp": _reduce(torch.logsumexp, 18),
    "ReduceLogSum": _reduce(lambda x, d, k: x.sum(d, keepdim=k).log(), 18),
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Shape": _shape,
    "Cast": _cast,
    "CastLike": lambda node, x, like: x.to(like.dtype),
    "ConstantOfShape": _constant_of_shape,
    "Split": _split,
    "Tile": lambda node, x, repeats: x.repeat(*repeats.tolist()),
    "Range": lambda node, start, limit, delta: torch.arange(
        start.item(), limit.item(), delta.item(), dtype=start.dtype
    ),
    "Transpose": lambda node, x: x.permute(*(node.attr("perm") or range(x.dim() - 1, -1, -1))),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Gather": _gather,
    "Concat": lambda node, *xs: torch.cat(xs, dim=int(node.attr("axis"))),
    "Expand": lambda node, x, shape: x.expand(torch.broadcast_shapes(x.shape, tuple(shape.tolist()))),
    "Pad": _pad,
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "Einsum": lambda node, *xs: torch.einsum(node.attr("equation"), *xs),
}


def lowering(op_type: str) -> Callable | None:
    """``fn(node, *tensors)`` computing ``op_type`` in torch: the torch facet its OpDef declares
    (read at each call, so an op registered later is covered), else its row in :data:`FUNCTIONS`."""
    declared = ops.registry().get(op_type)
    if declared is not None and declared.torch is not None:
        facet = declared.torch
        return lambda node, *xs: facet(torch, node, *xs)
    return FUNCTIONS.get(op_type)


def lowered_ops() -> set[str]:
    """Every op type with a torch lowering (declared on its OpDef or in :data:`FUNCTIONS`)."""
    return set(FUNCTIONS) | {name for name, op in ops.registry().items() if op.torch is not None}
