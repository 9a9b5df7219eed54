"""Ops that rearrange a tensor or read its shape without computing on it, one table row each (the
op contract: ``_contract.py``): Reshape, Flatten, Squeeze, Unsqueeze, Transpose, DepthToSpace,
SpaceToDepth, Expand, Tile, Shape, Size.

Parameters that are attributes at old opsets and inputs at newer ones (Squeeze/Unsqueeze axes
from opset 13) reach the kernel as keywords (from ``attrs``) or as arguments (the input's value);
the kernel is one function either way. Constant inputs the output shape depends on are listed in
``CONST_INPUTS``; they may be symbolic shape vectors (``dtype=object`` arrays such as
``["batch", -1]``, see ``_shape.py``). Symbols move with their axis.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dims
from cuvil_edge.ir.dims import Expr
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe, no_scratch
from cuvil_edge.ir.ops._shape import attr_or_input, axes as norm_axes, vector
from cuvil_edge.ir.ops._util import INT, INTS, STR, axis_index, broadcast, choice, dim_product, ints, need


# --- kernels: plain numpy; the same source runs in compiled modules ---------------------------
def k_reshape(x, shape, allowzero):
    dims = [int(s) for s in shape]
    if not allowzero:  # 0 copies the input dim
        dims = [x.shape[i] if s == 0 else s for i, s in enumerate(dims)]
    return x.reshape(dims)


def k_flatten(x, axis):
    a = axis + x.ndim if axis < 0 else axis
    left, right = 1, 1  # Python products: np.prod of a tuple costs more than the reshape
    for size in x.shape[:a]:
        left *= size
    for size in x.shape[a:]:
        right *= size
    return x.reshape(left, right)


def k_squeeze(x, axes=None):
    if axes is None or len(axes) == 0:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int(a) for a in axes))


def k_unsqueeze(x, axes):
    rank = x.ndim + len(axes)
    at = sorted(int(a) + rank if int(a) < 0 else int(a) for a in axes)
    return x.reshape(x.shape) if not at else np.expand_dims(x, tuple(at))


def k_transpose(x, perm):
    return np.ascontiguousarray(np.transpose(x, perm or None))


def k_depth_to_space(x, blocksize, crd):
    n, c, h, w = x.shape
    b = blocksize
    if crd:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    return np.ascontiguousarray(y).reshape(n, c // (b * b), h * b, w * b)


def k_space_to_depth(x, blocksize, crd):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose((0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
    return np.ascontiguousarray(y).reshape(n, c * b * b, h // b, w // b)


def k_expand(x, shape):
    out = np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))
    return np.array(np.broadcast_to(x, out))


def k_tile(x, repeats):
    return np.tile(x, [int(r) for r in np.asarray(repeats).reshape(-1)])


def k_shape(x, start, end):
    return np.array(x.shape[start:end], dtype=np.int64)


def k_size(x):
    return np.array(x.size, dtype=np.int64)


# --- Reshape ------------------------------------------------------------------------------------
def _allowzero(node):
    return int(node.attr("allowzero", 0)) if node.version >= 14 else 0


def _target(node, x, shape):
    allowzero = _allowzero(node)
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, str):
            out.append(s)
        elif s == 0 and not allowzero:
            if i >= x.rank:
                raise ShapeInferenceError(f"{node.describe()}: shape entry {i} is 0 but the input {x} has no axis {i}")
            out.append(x.shape[i])
        elif s < -1 or (s == -1 and None in out):
            raise ShapeInferenceError(
                f"{node.describe()}: bad target shape {shape} (one -1 at most, no other negatives)"
            )
        else:
            out.append(None if s == -1 else s)
    return out


def _infer_reshape(node, inputs, consts=None):
    """0 copies the input dim (unless allowzero=1, opset >= 14) and one -1 takes what is left,
    symbols included: (batch, 16, 4, 4) -> [-1, 256] is (batch, 256)."""
    need(node, inputs, 2)
    x, value = inputs[0], (consts or {}).get(1)
    if value is None or value.dtype.kind not in "iO" or value.ndim != 1:
        raise ShapeInferenceError(f"{node.describe()}: the shape input must be a 1-D int64 initializer or Constant")
    shape = vector(node, consts, 1, "shape", symbols=True)
    out = _target(node, x, shape)
    if TensorType(x.dtype, tuple(d for d in out if d is not None)).symbols() - x.symbols():
        raise ShapeInferenceError(f"{node.describe()}: target {out} names symbols the input {x} lacks")
    if None in out:
        out[out.index(None)] = _rest(node, x, shape, [d for d in out if d is not None])
    else:
        total, wanted = Expr.of(dims.product(x.shape)), Expr.of(dims.product(out))
        if not dims.same(total.to_dim(), wanted.to_dim()) and (
            x.is_static and TensorType(x.dtype, tuple(out)).is_static or dims.provably_different(total, wanted)
        ):
            raise ShapeInferenceError(f"{node.describe()}: cannot reshape {x} to {out}; the element counts differ")
    return [TensorType(x.dtype, tuple(out))]


def _rest(node, x, shape, given):
    """What -1 stands for: the input's elements over the given dims'. Equal dims cancel first, so
    ``(batch, seq+1, 768) -> [batch, seq+1, 12, -1]`` is 64; a division the build cannot prove exact
    (``(batch, H, W) -> [-1, 7, 7]``) stays a ``//`` dim, and the run checks it as numpy does."""
    left = list(x.shape)
    rest = []
    for d in given:
        match = next((i for i, e in enumerate(left) if dims.same(d, e)), None)
        if match is not None:
            del left[match]
        else:
            rest.append(d)
    total, part = Expr.of(dims.product(left)), Expr.of(dims.product(rest))
    if part == Expr.const(0) or (total.is_const() and part.is_const() and total.constant() % part.constant()):
        raise ShapeInferenceError(
            f"{node.describe()}: cannot resolve -1 reshaping {x} to {shape}; the element counts do not divide"
        )
    quotient = dims.divide_exactly(total, part)
    if quotient is not None:
        return quotient.to_dim()
    # a division the algebra cannot do is often one of the input's sizes written another way
    # (Swin's window reverse gives back the batch): take that where the values agree
    for candidate in (*left, *sorted(x.symbols())):
        if dims.same((part * Expr.of(candidate)).to_dim(), total.to_dim()):
            return candidate
    return dims.floordiv(total, part).to_dim()


# --- Flatten, Transpose, Expand, Shape, Size ----------------------------------------------------
def _infer_flatten(node, inputs):
    """2-D (prod(shape[:axis]), prod(shape[axis:])); axis may be negative (opset >= 11)."""
    need(node, inputs, 1)
    x = inputs[0]
    axis = axis_index(node, node.attr("axis", 1), x.rank, extra=1)
    return [TensorType(x.dtype, (dim_product(node, x.shape[:axis]), dim_product(node, x.shape[axis:])))]


def _perm(node, rank):
    perm = ints(node, "perm") or list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        raise ShapeInferenceError(f"{node.describe()}: perm {perm} is not a permutation of 0..{rank - 1}")
    return perm


def _infer_transpose(node, inputs):
    """Default perm: reverse the axes."""
    need(node, inputs, 1)
    x = inputs[0]
    return [TensorType(x.dtype, tuple(x.shape[p] for p in _perm(node, x.rank)))]


def _infer_expand(node, inputs, consts=None):
    """Broadcast against the shape input in both directions (a 1 in the shape keeps the input dim)."""
    need(node, inputs, 2)
    shape = vector(node, consts, 1, "shape", symbols=True)
    return [TensorType(inputs[0].dtype, broadcast(node, inputs[0].shape, shape))]


def _infer_tile(node, inputs, consts=None):
    need(node, inputs, 2)
    x = inputs[0]
    reps = vector(node, consts, 1, "repeats", symbols=True)
    if len(reps) != x.rank or any(isinstance(r, int) and r < 0 for r in reps):
        raise ShapeInferenceError(f"{node.describe()}: repeats {reps} must give one count >= 0 per axis of {x}")
    return [TensorType(x.dtype, tuple(dims.product((d, r)) for d, r in zip(x.shape, reps, strict=True)))]


def bounds(node, rank: int) -> tuple[int, int]:
    """The clamped [start, end) of the dims a Shape node returns (from opset 15 start/end, negative
    from the end)."""
    start, end = _shape_attrs(node).values()
    end = rank if end is None else end
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return min(max(start, 0), rank), min(max(end, 0), rank)


def _shape_attrs(node):
    """start and end as given (Python slicing clamps them like ONNX); all dims before opset 15."""
    if node.version < 15:
        return {"start": 0, "end": None}
    end = node.attr("end")
    return {"start": int(node.attr("start", 0)), "end": None if end is None else int(end)}


def _infer_shape(node, inputs):
    need(node, inputs, 1)
    start, end = bounds(node, inputs[0].rank)
    return [TensorType("int64", (max(end - start, 0),))]


def _infer_size(node, inputs):
    need(node, inputs, 1)
    return [TensorType("int64", ())]


# --- DepthToSpace, SpaceToDepth -----------------------------------------------------------------
def _blocksize(node):
    b = node.attr("blocksize")
    if not isinstance(b, int) or b < 1:
        raise UnsupportedAttributeError(f"{node.describe()} needs a positive blocksize attribute, got {b!r}")
    return b


def _crd(node):
    return choice(node, "mode", "DCR", ("DCR", "CRD")) == "CRD"


def _infer_depth_to_space(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    b = _blocksize(node)
    _crd(node)
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.describe()} needs a 4-D input, got {x}")
    n, c, h, w = x.shape
    if not isinstance(c, int) or c % (b * b):
        raise ShapeInferenceError(f"{node.describe()}: channels {c} must be a multiple of blocksize² = {b * b}")
    scale = lambda d: d * b if isinstance(d, int) else None  # noqa: E731
    if scale(h) is None or scale(w) is None:
        raise ShapeInferenceError(f"{node.describe()}: height and width must be known, got {x}")
    return [TensorType(x.dtype, (n, c // (b * b), scale(h), scale(w)))]


def _infer_space_to_depth(node, inputs):
    need(node, inputs, 1)
    x = inputs[0]
    b = _blocksize(node)
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.describe()} needs a 4-D input, got {x}")
    n, c, h, w = x.shape
    if not all(isinstance(d, int) for d in (c, h, w)) or h % b or w % b:
        raise ShapeInferenceError(f"{node.describe()}: height and width must be known multiples of {b}, got {x}")
    return [TensorType(x.dtype, (n, c * b * b, h // b, w // b))]


# --- Squeeze, Unsqueeze ------------------------------------------------------------------------
def _static_axes(node):
    """The axes attribute before opset 13 (an input from 13)."""
    axes = node.attr("axes") if node.version < 13 else None
    return {} if axes is None else {"axes": tuple(int(a) for a in axes)}


def _infer_squeeze(node, inputs, consts=None):
    """Without axes, every size-1 axis (which a symbolic dim makes ambiguous)."""
    need(node, inputs, 1, optional=1 if node.version >= 13 else 0)
    x = inputs[0]
    axes = attr_or_input(node, consts, "axes", 1, 13)
    if not axes:
        if x.symbols():
            raise ShapeInferenceError(
                f"{node.describe()}: without axes it squeezes every size-1 axis, but {x} has symbolic dims "
                "that may or may not be 1; give axes explicitly"
            )
        return [TensorType(x.dtype, tuple(d for d in x.shape if d != 1))]
    axes = norm_axes(node, axes, x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeInferenceError(
                f"{node.describe()}: axis {a} of {x} is {x.shape[a]!r}, not 1, so it cannot be squeezed"
                + ("; fix that dim to 1" if isinstance(x.shape[a], str) else "")
            )
    return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def _infer_unsqueeze(node, inputs, consts=None):
    """Axes index the output (negative from its end, opset >= 11)."""
    need(node, inputs, 2 if node.version >= 13 else 1)
    x = inputs[0]
    axes = attr_or_input(node, consts, "axes", 1, 13, required=True)
    if not axes:
        raise ShapeInferenceError(f"{node.describe()} needs a non-empty 'axes'")
    rank = x.rank + len(axes)
    axes = set(norm_axes(node, axes, rank))
    dims = iter(x.shape)
    return [TensorType(x.dtype, tuple(1 if i in axes else next(dims) for i in range(rank)))]


def _unsqueeze_attrs(node):
    return {"axes": tuple(int(a) for a in node.attr("axes", ()))} if node.version < 13 else {}


def _zero(node, inputs, outputs):
    return 0


OPS = (
    OpDef(
        "Reshape",
        (5, 13, 14, 19, 21),
        batch=BatchRule("reshaped", shape=(1,)),
        infer=_infer_reshape,
        fn=k_reshape,
        flops=_zero,
        attrs=lambda node: {"allowzero": _allowzero(node)},
        ATTRS={"allowzero": INT},
        CONST_INPUTS=(1,),
        torch=_torch.reshape,
        view=True,
        scratch=no_scratch,
        probes=(Probe((1, 16, 64), consts=lambda: (np.array([1, 16, 64], np.int64),)),),
    ),
    OpDef(
        "Flatten",
        (1, 9, 11, 13, 21),
        batch="reshaped",
        infer=_infer_flatten,
        fn=k_flatten,
        flops=_zero,
        attrs=lambda node: {"axis": int(node.attr("axis", 1))},
        ATTRS={"axis": INT},
        torch=_torch.flatten,
        view=True,
        scratch=no_scratch,
    ),
    OpDef(
        "Squeeze",
        (1, 11, 13, 21, 23, 24, 25),
        batch=BatchRule("reshaped", shape=(1,)),
        infer=_infer_squeeze,
        fn=k_squeeze,
        flops=_zero,
        attrs=_static_axes,
        ATTRS={"axes": INTS},
        CONST_INPUTS=(1,),
        torch=_torch.squeeze,
        view=True,
        scratch=no_scratch,
    ),
    OpDef(
        "Unsqueeze",
        (1, 11, 13, 21, 23, 24, 25),
        batch=BatchRule("reshaped", shape=(1,)),
        infer=_infer_unsqueeze,
        fn=k_unsqueeze,
        flops=_zero,
        attrs=_unsqueeze_attrs,
        ATTRS={"axes": INTS},
        CONST_INPUTS=(1,),
        torch=_torch.unsqueeze,
        view=True,
        scratch=no_scratch,
    ),
    OpDef(
        "Transpose",
        (1, 13, 21, 23, 24, 25),
        batch="transpose",
        infer=_infer_transpose,
        fn=k_transpose,
        flops=_zero,
        attrs=lambda node: {"perm": tuple(ints(node, "perm"))},
        ATTRS={"perm": INTS},
        torch=_torch.transpose,
        scratch=no_scratch,
        cost_kind="transpose",
    ),
    OpDef(
        "DepthToSpace",
        (1, 11, 13, 28),
        infer=_infer_depth_to_space,
        fn=k_depth_to_space,
        flops=lambda node, inputs, outputs: 0,
        attrs=lambda node: {"blocksize": _blocksize(node), "crd": _crd(node) if node.version >= 11 else False},
        ATTRS={"blocksize": INT, "mode": STR},
    ),
    OpDef(
        "SpaceToDepth",
        (1, 13, 28),
        infer=_infer_space_to_depth,
        fn=k_space_to_depth,
        flops=lambda node, inputs, outputs: 0,
        attrs=lambda node: {"blocksize": _blocksize(node), "crd": _crd(node) if node.version >= 28 else False},
        ATTRS={"blocksize": INT, "mode": STR},
    ),
    OpDef(
        "Expand",
        (8, 13),
        batch=BatchRule("created", shape=(1,), creates=True),
        infer=_infer_expand,
        fn=k_expand,
        flops=_zero,
        CONST_INPUTS=(1,),
        torch=_torch.expand,
        scratch=no_scratch,
        cost_kind="gather",
    ),
    OpDef(
        "Tile",
        (6, 13),
        infer=_infer_tile,
        fn=k_tile,
        flops=_zero,
        CONST_INPUTS=(1,),
        torch=_torch.tile,
        scratch=no_scratch,
        cost_kind="gather",
    ),
    OpDef(
        "Shape",
        (1, 13, 15, 19, 21, 23, 24, 25),
        batch="shape",
        infer=_infer_shape,
        fn=k_shape,
        flops=_zero,
        attrs=_shape_attrs,
        ATTRS={"start": INT, "end": INT},
        torch=_torch.shape,
        scratch=no_scratch,
    ),
    OpDef(
        "Size",
        (1, 13, 19, 21, 23, 24, 25),
        infer=_infer_size,
        fn=k_size,
        flops=lambda node, inputs, outputs: 0,
        scratch=no_scratch,
    ),
)
