"""Torch lowerings of the ops that declare one (their ``torch`` facet), and the torch-side
geometry they share with the trained layers (:mod:`cuvil_edge.agent.torch_model`).

Every function takes torch as its first parameter ``t`` and this module imports nothing of it: the
ir layer is below the agent and the base install has no torch. The agent passes torch in when it
calls a facet (``torch_functions.lowering``), and ``t.nn.functional`` is torch's ``F``. The
lowerings live in one module rather than beside each kernel because they share the window and
activation helpers below, which the agent's Conv and Linear layers read too; a row names its
lowering (``torch=_torch.gemm``), so an op still has one place that says how it trains.

A lowering computes its op like the IR kernel, ``fn(t, node, *tensors)``, with the node's
attributes read per call. A ``torch_check`` facet, ``check(node)``, refuses at build time what a
lowering could otherwise only refuse mid-training.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError, UnsupportedOpError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import Node

#: The fused ``activation`` attribute's values that have a torch form (``activation(t, node)``).
ACTIVATIONS = ("none", "relu", "relu6", "sigmoid", "hardswish", "gelu", "swish")


def check_activation(node: Node) -> None:
    """Refuse a fused activation without a torch form (any op with an ``activation`` attribute)."""
    name = node.attr("activation", "none")
    if name not in ACTIVATIONS:
        raise UnsupportedAttributeError(f"{node.describe()}: activation {name!r} has no training lowering")


def activation(t: Any, node: Node) -> Callable[[Any], Any]:
    """The torch function of the node's fused ``activation`` attribute."""
    check_activation(node)
    F = t.nn.functional
    return {
        "none": lambda y: y,
        "relu": F.relu,
        "relu6": lambda y: t.clamp(y, 0.0, 6.0),
        "sigmoid": t.sigmoid,
        "hardswish": F.hardswish,
        "gelu": F.gelu,
        "swish": F.silu,
    }[node.attr("activation", "none")]


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


def check_max_pool(node: Node) -> None:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOpError(f"{node.describe()}: MaxPool's Indices output has no training lowering")


def check_average_pool(node: Node) -> None:
    if any(d != 1 for d in node.attr("dilations") or ()):
        raise UnsupportedAttributeError(f"{node.describe()}: dilated AveragePool has no training lowering")


def pool(t: Any, node: Node, x: Any) -> Any:
    F = t.nn.functional
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
    mask = F.pad(t.ones_like(x[:1, :1]), torch_pads(pads))
    return avg(padded, kernel, strides, 0, ceil) / avg(mask, kernel, strides, 0, ceil)


def global_average_pool(t: Any, node: Node, x: Any) -> Any:
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


def global_max_pool(t: Any, node: Node, x: Any) -> Any:
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


def conv(t: Any, node: Node, x: Any, w: Any, b: Any = None) -> Any:
    F = t.nn.functional
    n = w.dim() - 2
    strides, dilations = tuple(node.attr("strides") or (1,) * n), tuple(node.attr("dilations") or (1,) * n)
    x = F.pad(x, torch_pads(window_pads(node, x.shape[2:], w.shape[2:], strides, dilations)))
    y = (F.conv1d, F.conv2d, F.conv3d)[n - 1](x, w, b, strides, 0, dilations, int(node.attr("group", 1)))
    return activation(t, node)(y)


# --- contractions ---------------------------------------------------------------------------
def gemm(t: Any, node: Node, a: Any, b: Any, c: Any = None) -> Any:
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    y = node.attr("alpha", 1.0) * (a @ b)
    return activation(t, node)(y if c is None else y + node.attr("beta", 1.0) * c)


def matmul(t: Any, node: Node, a: Any, b: Any) -> Any:
    return a @ b


def fused_matmul(t: Any, node: Node, a: Any, b: Any, c: Any = None) -> Any:
    return activation(t, node)(a @ b if c is None else a @ b + c.reshape(-1))


def einsum(t: Any, node: Node, *xs: Any) -> Any:
    return t.einsum(node.attr("equation"), *xs)


# --- normalization --------------------------------------------------------------------------
def batch_norm(t: Any, node: Node, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    eps = float(node.attr("epsilon", 1e-5))
    return t.nn.functional.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)


def norm(t: Any, node: Node, x: Any, scale: Any, bias: Any = None) -> Any:
    """Instance, Group and LayerNormalization (the node's op type says which)."""
    F = t.nn.functional
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


def lrn(t: Any, node: Node, x: Any) -> Any:
    size, channels = int(node.attr("size")), x.shape[1]
    before = (size - 1) // 2  # channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
    padded = t.nn.functional.pad(x * x, torch_pads([(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.dim() - 2)))
    window = sum(padded[:, i : i + channels] for i in range(size))
    scale = node.attr("bias", 1.0) + node.attr("alpha", 1e-4) / size * window
    return x / scale ** node.attr("beta", 0.75)


def softmax(t: Any, node: Node, x: Any) -> Any:
    """Softmax and LogSoftmax (the node's op type says which)."""
    F = t.nn.functional
    function = F.log_softmax if node.op_type == "LogSoftmax" else F.softmax
    if node.version < 13:
        axis = int(node.attr("axis", 1)) % x.dim()
        return function(x.reshape(math.prod(x.shape[:axis]), -1), dim=1).reshape(x.shape)
    return function(x, dim=int(node.attr("axis", -1)))


# --- reductions -----------------------------------------------------------------------------
def _axes(node: Node, given: Any, since: int) -> list[int] | None:
    """Axes from the attribute (before opset ``since``) or the optional input."""
    axes = node.attr("axes") if node.version < since else (None if given is None else given.tolist())
    return None if axes is None else [int(a) for a in axes]


def _prod(x: Any, dims: Any, keep: bool) -> Any:
    for d in sorted(dims, reverse=True):
        x = x.prod(d, keepdim=True)
    return x if keep else x.squeeze(dims) if dims else x


#: ``(t, x, dims, keepdim) -> tensor`` per reduction.
_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "ReduceMean": lambda t, x, d, k: t.mean(x, d, k),
    "ReduceSum": lambda t, x, d, k: t.sum(x, d, k),
    "ReduceMax": lambda t, x, d, k: t.amax(x, d, k),
    "ReduceMin": lambda t, x, d, k: t.amin(x, d, k),
    "ReduceProd": lambda t, x, d, k: _prod(x, d, k),
    "ReduceL1": lambda t, x, d, k: x.abs().sum(d, keepdim=k),
    "ReduceL2": lambda t, x, d, k: (x * x).sum(d, keepdim=k).sqrt(),
    "ReduceSumSquare": lambda t, x, d, k: (x * x).sum(d, keepdim=k),
    "ReduceLogSumExp": lambda t, x, d, k: t.logsumexp(x, d, k),
    "ReduceLogSum": lambda t, x, d, k: x.sum(d, keepdim=k).log(),
}


def reduction(since: int) -> Callable[..., Any]:
    """The lowering of a Reduce* op whose axes became an input at opset ``since``."""

    def lowered(t: Any, node: Node, x: Any, axes: Any = None) -> Any:
        dims = _axes(node, axes, since)
        if not dims:
            if node.version >= since and node.attr("noop_with_empty_axes", 0):
                return x
            dims = list(range(x.dim()))
        op = _REDUCTIONS[node.op_type]
        return op(t, x, tuple(sorted(a % x.dim() for a in dims)), bool(node.attr("keepdims", 1)))

    return lowered


# --- shape and movement ---------------------------------------------------------------------
def identity(t: Any, node: Node, x: Any, *settings: Any) -> Any:
    """Identity, and Dropout at inference (its ratio and training_mode inputs ignored)."""
    return x


def flatten(t: Any, node: Node, x: Any) -> Any:
    axis = int(node.attr("axis", 1))
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def reshape(t: Any, node: Node, x: Any, shape: Any) -> Any:
    target = [int(s) for s in shape.tolist()]
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    if x.numel() == 0 and -1 in target:  # an empty Poisson batch: -1 from the axes that are not empty
        rest = math.prod(d for d in target if d not in (0, -1))
        target = [math.prod(d for d in x.shape if d) // rest if d == -1 else d for d in target]
    return x.reshape(target)


def unsqueeze(t: Any, node: Node, x: Any, axes: Any = None) -> Any:
    chosen: list[int] = _axes(node, axes, 13)  # type: ignore[assignment]  # Unsqueeze has axes (infer checks)
    rank = x.dim() + len(chosen)
    for axis in sorted(a % rank for a in chosen):
        x = x.unsqueeze(axis)
    return x


def squeeze(t: Any, node: Node, x: Any, axes: Any = None) -> Any:
    dims = _axes(node, axes, 13)
    return x.squeeze() if not dims else x.squeeze(tuple(a % x.dim() for a in dims))


def transpose(t: Any, node: Node, x: Any) -> Any:
    return x.permute(*(node.attr("perm") or range(x.dim() - 1, -1, -1)))


def expand(t: Any, node: Node, x: Any, shape: Any) -> Any:
    return x.expand(t.broadcast_shapes(x.shape, tuple(shape.tolist())))


def shape(t: Any, node: Node, x: Any) -> Any:
    dims = list(x.shape)
    start, end = int(node.attr("start", 0)), node.attr("end")
    return t.tensor(dims[start : None if end is None else int(end)], dtype=t.int64)


def tile(t: Any, node: Node, x: Any, repeats: Any) -> Any:
    return x.repeat(*repeats.tolist())


def range_(t: Any, node: Node, start: Any, limit: Any, delta: Any) -> Any:
    return t.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


def constant_of_shape(t: Any, node: Node, shape: Any) -> Any:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return t.from_numpy(np.full([int(d) for d in shape.tolist()], value[0], value.dtype))


def cast(t: Any, node: Node, x: Any) -> Any:
    return x.to(getattr(t, dtypes.FROM_ONNX_CODE[int(node.attr("to"))]))


def cast_like(t: Any, node: Node, x: Any, like: Any) -> Any:
    return x.to(like.dtype)


# --- slicing --------------------------------------------------------------------------------
def slice_(
    t: Any, node: Node, x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None
) -> Any:
    if node.version < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
    else:
        starts, ends = starts.tolist(), ends.tolist()
        axes, steps = (None if v is None else v.tolist() for v in (axes, steps))
    axes = list(range(len(starts))) if axes is None else axes
    for start, end, axis, step in zip(starts, ends, axes, steps or [1] * len(starts), strict=True):
        axis = int(axis) % x.dim()
        index = range(*slice(int(start), int(end), int(step)).indices(x.shape[axis]))
        x = x.index_select(axis, t.tensor(list(index), dtype=t.int64))
    return x


def gather(t: Any, node: Node, x: Any, indices: Any) -> Any:
    axis = int(node.attr("axis", 0)) % x.dim()
    picked = x.index_select(axis, indices.reshape(-1).long() % x.shape[axis])
    return picked.reshape((*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]))


def concat(t: Any, node: Node, *xs: Any) -> Any:
    return t.cat(xs, dim=int(node.attr("axis")))


def split(t: Any, node: Node, x: Any, split: Any = None) -> Any:
    axis = int(node.attr("axis", 0)) % x.dim()
    sizes = node.attr("split") if node.version < 13 else (None if split is None else split.tolist())
    if not sizes:  # equal parts; from opset 18 the last may be smaller
        parts = int(node.attr("num_outputs", len(node.outputs)))
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return tuple(t.split(x, [int(s) for s in sizes], dim=axis))


#: ONNX Pad modes -> F.pad's names.
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def check_pad(node: Node) -> None:
    if node.attr("mode", "constant") not in _PAD_MODES:
        raise UnsupportedAttributeError(f"{node.describe()}: Pad mode {node.attr('mode')!r} has no training lowering")


def pad(t: Any, node: Node, x: Any, pads: Any = None, value: Any = None, axes: Any = None) -> Any:
    F = t.nn.functional
    if node.version < 11:
        pads, value = node.attr("pads"), node.attr("value", 0.0)
    else:
        pads = pads.tolist()
        value = 0.0 if value is None else value.reshape(-1)[0].item()
    axes = list(range(x.dim())) if axes is None else [int(a) % x.dim() for a in axes.tolist()]
    full = [(0, 0)] * x.dim()
    for i, axis in enumerate(axes):
        full[axis] = (int(pads[i]), int(pads[i + len(axes)]))
    mode = _PAD_MODES[node.attr("mode", "constant")]  # checked by check_pad
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


# --- quantization ---------------------------------------------------------------------------
def check_quantize(node: Node) -> None:
    check_dequantize(node)
    if node.attr("output_dtype", 0):
        raise UnsupportedAttributeError(
            f"{node.describe()}: QuantizeLinear's output_dtype has no training lowering; "
            "give the zero point in the dtype wanted"
        )


def check_dequantize(node: Node) -> None:
    if node.attr("block_size", 0):
        raise UnsupportedAttributeError(f"{node.describe()}: blocked quantization has no training lowering")


def _per_axis(node: Node, param: Any, x: Any) -> Any:
    """A per-tensor (scalar) or per-axis (1-D along ``axis``) QDQ parameter, shaped to broadcast on ``x``."""
    if param.dim() == 0 or param.numel() == 1:
        return param.reshape(())
    axis = int(node.attr("axis", 1)) % x.dim()
    return param.reshape([-1 if d == axis else 1 for d in range(x.dim())])


#: Integer range of a QuantizeLinear output, by its zero point's dtype name (uint8 when it has none).
_QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def quantize_linear(t: Any, node: Node, x: Any, scale: Any, zero: Any = None) -> Any:
    """Fake quantization for quantization-aware training: the integer values ONNX's QuantizeLinear
    computes (round half to even, saturate), kept as float so that DequantizeLinear can follow, with
    the straight-through estimator: inside the range the gradient passes as if rounding were the
    identity, outside it is zero (the value saturated)."""
    kind = zero.dtype if zero is not None else t.uint8
    ranges = {getattr(t, name): bounds for name, bounds in _QUANT_RANGES.items()}
    if kind not in ranges:
        raise UnsupportedAttributeError(
            f"{node.describe()}: quantization to {kind} has no training lowering (int8 and uint8 have)"
        )
    lo, hi = ranges[kind]
    z = _per_axis(node, zero, x).to(x.dtype) if zero is not None else 0.0
    v = x / _per_axis(node, scale, x).to(x.dtype)
    rounded = v + (t.round(v) - v).detach()
    return t.clamp(rounded + z, lo, hi)


def dequantize_linear(t: Any, node: Node, q: Any, scale: Any, zero: Any = None) -> Any:
    s = _per_axis(node, scale, q).to(scale.dtype)
    z = _per_axis(node, zero, q).to(scale.dtype) if zero is not None else 0.0
    return (q.to(scale.dtype) - z) * s


# --- elementwise ----------------------------------------------------------------------------
def swish(t: Any, node: Node, x: Any) -> Any:
    return x * t.sigmoid(node.attr("alpha", 1.0) * x)


def prelu(t: Any, node: Node, x: Any, slope: Any) -> Any:
    return t.where(x < 0, x * slope, x)


def is_inf(t: Any, node: Node, x: Any) -> Any:
    positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    return (t.isposinf(x) & bool(positive)) | (t.isneginf(x) & bool(negative))


def clip(t: Any, node: Node, x: Any, low: Any = None, high: Any = None) -> Any:
    if node.version < 11:
        low, high = node.attr("min"), node.attr("max")
    return t.clamp(x, low, high) if low is not None or high is not None else x


def div(t: Any, node: Node, a: Any, b: Any) -> Any:
    integral = not (a.is_floating_point() or b.is_floating_point())
    return t.div(a, b, rounding_mode="trunc") if integral else a / b


def mod(t: Any, node: Node, a: Any, b: Any) -> Any:
    return t.fmod(a, b) if node.attr("fmod", 0) else t.remainder(a, b)


def variadic(name: str) -> Callable[..., Any]:
    """Max, Min or Sum of any number of inputs: torch's ``name`` (a binary function) folded over them."""

    def lowered(t: Any, node: Node, *xs: Any) -> Any:
        return reduce(getattr(t, name), xs)

    return lowered


def mean(t: Any, node: Node, *xs: Any) -> Any:
    return reduce(t.add, xs) / len(xs)
