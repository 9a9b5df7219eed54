"""Small helpers shared by op modules (attribute access, broadcasting, conv geometry)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dims
from cuvil_edge.ir.graph import Dim, Node, TensorType


def need(node: Node, inputs: Sequence[TensorType | None], count: int, optional: int = 0) -> None:
    """Check the node got ``count`` required inputs (plus up to ``optional`` more)."""
    present = len(inputs)
    if present < count or present > count + optional or any(t is None for t in inputs[:count]):
        want = f"{count}" if not optional else f"{count} to {count + optional}"
        raise ShapeInferenceError(f"{node.describe()} needs {want} inputs, got {present}")


def same_dtype(node: Node, types: Sequence[TensorType | None]) -> str:
    """The common dtype of the given inputs (raises if they differ)."""
    present = [t for t in types if t is not None]
    kinds = {t.dtype for t in present}
    if len(kinds) != 1:
        raise ShapeInferenceError(f"{node.describe()} has inputs of different dtypes {sorted(kinds)}; cast them to one")
    return present[0].dtype


def want_dtype(node: Node, t: TensorType, allowed: frozenset[str] | set[str]) -> None:
    if t.dtype not in allowed:
        raise UnsupportedAttributeError(
            f"{node.describe()} does not support dtype {t.dtype}; supported: {', '.join(sorted(allowed))}"
        )


#: Attribute kinds an op module's ``ATTRS`` table (attribute name -> kind) may name;
#: :func:`check_attrs` checks them before the op's ``infer`` reads any attribute.
INT, INTS, FLOAT, FLOATS, STR, TENSOR = "int", "ints", "float", "floats", "str", "tensor"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: The window attributes of Conv, ConvTranspose and the pooling ops.
WINDOW_ATTRS = {"auto_pad": STR, "dilations": INTS, "kernel_shape": INTS, "pads": INTS, "strides": INTS}


def _is_int(v: Any) -> bool:
    return (
        isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and bool(INT64_MIN <= v <= INT64_MAX)
    )


def _is_float(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _is_list(v: Any, item) -> bool:
    return isinstance(v, (list, tuple)) and all(item(x) for x in v)


_KIND_CHECKS = {
    INT: (_is_int, "an int64"),
    INTS: (lambda v: _is_list(v, _is_int), "a list of int64"),
    FLOAT: (_is_float, "a number"),
    FLOATS: (lambda v: _is_list(v, _is_float), "a list of numbers"),
    STR: (lambda v: isinstance(v, (str, bytes)), "a string"),
    TENSOR: (lambda v: isinstance(v, np.ndarray), "a tensor"),
}


def check_attrs(node: Node, module: Any) -> None:
    """Check every attribute ``node`` holds that ``module.ATTRS`` names has its kind
    (attributes the op does not name are ignored: it never reads them).

    Raises:
        UnsupportedAttributeError: an attribute has a value of the wrong kind (a list
            where an int is needed, a bool, a string for a number, an int outside int64...).
    """
    for key, kind in getattr(module, "ATTRS", {}).items():
        if key in node.attrs:
            fits, what = _KIND_CHECKS[kind]
            if not fits(node.attrs[key]):
                raise UnsupportedAttributeError(
                    f"{node.describe()} attribute {key!r} must be {what}, got {node.attrs[key]!r:.80}"
                )


def required(node: Node, key: str) -> Any:
    """The value of an attribute the schema requires (no ONNX default).

    Raises:
        UnsupportedAttributeError: the node lacks it (the model would fail onnx.checker too).
    """
    if key not in node.attrs:
        raise UnsupportedAttributeError(
            f"{node.describe()} lacks its required attribute {key!r}; re-export the model with it set"
        )
    return node.attrs[key]


def ints(node: Node, key: str, default: Sequence[int] | None = None) -> list[int]:
    value = node.attr(key, default)
    if value is None:
        return []
    if isinstance(value, (int, float, str)) or not all(isinstance(v, int) for v in value):
        raise UnsupportedAttributeError(f"{node.describe()} attribute {key!r} must be a list of ints, got {value!r}")
    return list(value)


def broadcast(node: Node, a: Sequence[Dim], b: Sequence[Dim]) -> tuple[Dim, ...]:
    """Numpy-style multidirectional broadcast of two shapes with symbols."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif dims.same(x, y):  # one size written two ways (see ir.dims.same)
            out.append(dims.simpler(x, y))
        elif (
            isinstance(x, str) and isinstance(y, str) and not dims.provably_different(dims.Expr.of(x), dims.Expr.of(y))
        ):
            # sizes that agree only for some inputs (Swin's even and odd halves agree for even sizes,
            # the only ones its export admits); the run checks them, as onnxruntime does
            out.append(dims.simpler(x, y))
        else:
            raise ShapeInferenceError(
                f"{node.describe()} cannot broadcast shapes {list(a)} and {list(b)} (dim {-i}: {x} vs {y})"
            )
    return tuple(reversed(out))


def pool_out(
    node: Node, size: Dim, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int = 1, ceil_mode: int = 0
) -> Dim:
    """Output length of a conv/pool window along one axis; a symbolic size gives the expression
    (a 16x16 patch convolution with stride 16 over ``H`` is ``(H//16)``)."""
    if kernel < 1:
        raise ShapeInferenceError(f"{node.describe()}: the window (kernel) size {kernel} must be at least 1")
    if isinstance(size, str):
        if ceil_mode:
            raise ShapeInferenceError(f"{node.describe()} with ceil_mode needs a static spatial size, got {size!r}")
        span = dilation * (kernel - 1) + 1
        symbolic = dims.Expr.of(size) + (pad_begin + pad_end - span)
        return (dims.floordiv(symbolic, dims.Expr.const(stride)) + 1).to_dim()
    span = dilation * (kernel - 1) + 1
    padded = size + pad_begin + pad_end
    if padded < span:
        raise ShapeInferenceError(f"{node.describe()}: window {span} is larger than padded input {padded}")
    steps = padded - span
    out = (-(-steps // stride) if ceil_mode else steps // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1  # the last window must start inside the input or left padding
    return out


def spatial_attrs(node: Node, spatial: Sequence[Dim], kernel: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """strides, pads (begin..., end...), dilations with ONNX defaults and auto_pad resolved."""
    n = len(kernel)
    strides = ints(node, "strides") or [1] * n
    dilations = ints(node, "dilations") or [1] * n
    pads = ints(node, "pads") or [0] * (2 * n)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ShapeInferenceError(
            f"{node.describe()} has strides/pads/dilations of the wrong length for {n} spatial dims"
        )
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilations):  # before auto_pad divides by them
        raise ShapeInferenceError(f"{node.describe()} has non-positive strides/dilations")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for i, size in enumerate(spatial):
            if isinstance(size, str):
                raise ShapeInferenceError(f"{node.describe()} auto_pad needs static spatial dims")
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    elif auto_pad != "NOTSET":
        raise UnsupportedAttributeError(f"{node.describe()} auto_pad={auto_pad!r} is not supported")
    if any(p < 0 for p in pads):
        raise ShapeInferenceError(f"{node.describe()} has negative pads")
    return strides, pads, dilations


#: Capability constants every generated module defines (device_targets sets
#: them per target; the AST pruner folds branches on them).  Op templates may
#: read only these names, ``np``, and their own helper functions.
DEFAULT_CAPABILITIES: dict[str, object] = {
    "TARGET_NAME": "reference",
    "TARGET_ARCH": "x86_64",
    "TARGET_SIMD_BITS": 256,
    "TARGET_HAS_GPU": False,
    "TARGET_HAS_FP16": False,
    "TARGET_HAS_INT8": False,
    "TARGET_STATIC_SHAPES": False,
    "TARGET_STATIC_BATCH": 1,
    "TARGET_MEMORY_MB": 16384,
    "TARGET_LARGE_SCRATCH": True,
    # the interpreter (the oracle) runs numpy only; targets with a C compiler turn native kernels on
    "TARGET_NATIVE": False,
    # the int8 inner product of the native kernels: "vnni" (vpdpbusd), "avx2" (vpmaddubsw), "sdot"
    # (ARMv8.2 dot product), "widen" (a widening loop), "none" (no native kernels: numpy)
    "TARGET_INT8_DOT": "none",
    "COMPUTE_FP16": False,
}


def dim_product(node: Node, dims_: Sequence[Dim]) -> Dim:
    """Product of dims: an int, or a symbolic dim (``[batch, 4] -> "4*batch"``, ``[batch, 1] -> batch``)."""
    return dims.product(dims_)


def data_dependent_dim(node: Node, what: str = "count") -> str:
    """The symbol naming a length of ``node``'s first output that only the data decides (NonZero,
    Unique, NonMaxSuppression): ``<output>_count``, the output name made a symbol (other characters
    become ``_``, with a short digest of the name so that two outputs never share a symbol).

    Raises:
        ShapeInferenceError: the node names no first output.
    """
    if not node.outputs or not node.outputs[0]:
        raise ShapeInferenceError(f"{node.describe()} must name its first output; its length depends on the data")
    return dims.symbol_for(node.outputs[0], what)


def axis_index(node: Node, axis: int, rank: int, extra: int = 0) -> int:
    """``axis`` in ``-rank..rank-1+extra`` normalised to ``0..rank-1+extra`` (negative counts from the end)."""
    if not -rank <= axis < rank + extra:
        raise ShapeInferenceError(f"{node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def text(node: Node, key: str, default: str) -> str:
    value = node.attr(key, default)
    return value.decode() if isinstance(value, bytes) else str(value)


def choice(node: Node, key: str, default: str, allowed: Sequence[str]) -> str:
    """String attribute ``key`` (``default`` when absent), one of ``allowed``.

    Raises:
        UnsupportedAttributeError: another value; the message lists the allowed ones at this opset.
    """
    value = text(node, key, default)
    if value not in allowed:
        raise UnsupportedAttributeError(
            f"{node.describe()}: {key} must be one of {', '.join(allowed)} at opset {node.version}, got {value!r}"
        )
    return value
