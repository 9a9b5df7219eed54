"""Values known before running a graph: constants and (symbolic) shape vectors.

:func:`cuvil_edge.ir.infer.build_graph` keeps a dict of *known values* while it
infers types, so ops that need an input's value (``CONST_INPUTS``: Reshape's
shape, Expand's shape ...) get it even when it is computed by a small subgraph
(``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` from a model exported
with a dynamic batch).  A known value is:

* an initializer;
* the output of a node whose inputs are all known numeric arrays of at most
  :data:`SMALL` elements (the op's own kernel evaluates it at build time);
* a *symbolic vector*: a numpy array of ``dtype=object`` holding ints and
  symbolic dims (canonical text, :mod:`cuvil_edge.ir.dims`), e.g. ``Shape`` of a
  ``float32[batch, 16, 4, 4]`` value is ``array(['batch', 16, 4, 4], dtype=object)``.
  Ops that list ``CONST_INPUTS`` accept such arrays (the convention agreed with the
  op modules).  They flow through the ops of :data:`SYMBOLIC`: indexing ops with
  numpy object-array semantics, int64 arithmetic (Add, Sub, Mul, Div, Mod, Max, Min,
  Neg) on the expressions, so ``Shape -> Gather -> Mul -> Concat -> Reshape`` gives
  ``[4*batch, 16]``; an object result without symbols becomes an ``int64`` array.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from cuvil_edge.ir import dims
from cuvil_edge.ir.dims import Expr
from cuvil_edge.ir.graph import Node, TensorType

log = logging.getLogger(__name__)

#: Largest value (elements) evaluated or kept at build time; also the largest dim of a
#: folded node's inputs and outputs (an empty tensor may still declare a huge dim).
SMALL = 4096
#: Nodes whose cost (``module.flops``) is above this are not folded at build time: a kernel's
#: work and temporaries can be large even when its inputs and outputs are small (a huge window).
FOLD_MAX_FLOPS = 2**26

#: ONNX TensorProto codes of the integer types a shape vector may be cast to.
_INT_CODES = {6: "int32", 7: "int64"}
#: ... and the float types it may be cast to (torch computes ``ceil(size / patch)`` in float).
_FLOAT_CODES = {1: "float32", 10: "float16", 11: "float64"}


def is_symbolic(value: np.ndarray | None) -> bool:
    return value is not None and value.dtype == object


@dataclass(frozen=True)
class Quotient:
    """A float shape value ``num / den`` that is not a whole number for every binding (a size over
    a patch before torch's ``ceil``): what ``Cast(to=FLOAT) -> Div`` makes of a dim."""

    num: Expr
    den: int

    @staticmethod
    def make(num: Expr, den: int):
        """The value in lowest terms: a dim where the division is exact."""
        if den < 0:
            num, den = -num, -den
        exact = dims.divide_exactly(num, Expr.const(den)) if den != 1 else num
        return exact.to_dim() if exact is not None else Quotient(num, den)


def _settle(array: np.ndarray, dtype: str = "int64") -> np.ndarray:
    """An object array without symbols becomes a numeric array of ``dtype``; others stay object."""
    array = np.asarray(array, dtype=object)
    if any(isinstance(v, (str, Quotient)) for v in array.reshape(-1)):
        return array
    return np.asarray(array.astype(np.dtype(dtype)))


def _obj(value: np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=object)


def _axes(node: Node, values: Sequence[np.ndarray | None], index: int) -> list[int] | None:
    """Axes from input ``index`` (newer opsets) or the ``axes`` attribute (older)."""
    if len(values) > index and values[index] is not None:
        return [int(a) for a in np.asarray(values[index]).reshape(-1)]
    attr = node.attr("axes")
    return None if attr is None else [int(a) for a in attr]


def _shape(node, values, types):
    shape = types[0].shape
    rank = len(shape)
    start, end = int(node.attr("start", 0)), node.attr("end")
    end = rank if end is None else int(end)
    start, end = (max(0, min(rank, s + rank if s < 0 else s)) for s in (start, end))
    return _settle(np.array(list(shape[start:end]), dtype=object).reshape(-1))


def _gather(node, values, types):
    data, indices = values[0], values[1]
    if data is None or indices is None or is_symbolic(indices):
        return None
    return _settle(
        np.asarray(np.take(_obj(data), np.asarray(indices, np.int64), axis=int(node.attr("axis", 0))), dtype=object)
    )


def _unsqueeze(node, values, types):
    axes = _axes(node, values, 1)
    if values[0] is None or axes is None:
        return None
    out = _obj(values[0])
    rank = out.ndim + len(axes)
    for a in sorted(a + rank if a < 0 else a for a in axes):
        out = np.expand_dims(out, a)
    return _settle(out)


def _squeeze(node, values, types):
    if values[0] is None:
        return None
    axes = _axes(node, values, 1)
    data = _obj(values[0])
    return _settle(np.squeeze(data) if axes is None else np.squeeze(data, axis=tuple(axes)))


def _concat(node, values, types):
    if any(v is None for v in values):
        return None
    return _settle(np.concatenate([_obj(v) for v in values], axis=int(node.attr("axis", 0))))


def _slice(node, values, types):
    data = values[0]
    if data is None:
        return None
    if node.version < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        if any(v is None or is_symbolic(v) for v in values[1:3]) or any(
            len(values) > i and node.inputs[i] and (values[i] is None or is_symbolic(values[i])) for i in (3, 4)
        ):
            return None
        starts, ends = values[1].reshape(-1), values[2].reshape(-1)
        axes = values[3].reshape(-1) if len(values) > 3 and values[3] is not None else None
        steps = values[4].reshape(-1) if len(values) > 4 and values[4] is not None else None
    data = _obj(data)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        index[a + data.ndim if a < 0 else a] = slice(int(s), int(e), st)
    return _settle(data[tuple(index)])


def _cast(node, values, types):
    """To an integer type (a float quotient is truncated, as Cast does: sizes are >= 0), or to a
    float type (the value is kept: dims are whole numbers, exact in float)."""
    to = int(node.attr("to", 0))
    if values[0] is None or to not in _INT_CODES and to not in _FLOAT_CODES:
        return None
    if to in _FLOAT_CODES:
        return _settle(values[0], _FLOAT_CODES[to])
    whole = np.frompyfunc(
        lambda v: dims.floordiv(v.num, Expr.const(v.den)).to_dim() if isinstance(v, Quotient) else v, 1, 1
    )
    return _settle(np.asarray(whole(_obj(values[0])), dtype=object))


def _ratio(v) -> tuple[Expr, int]:
    """A float shape entry as (numerator, denominator); a float that is no small fraction raises."""
    if isinstance(v, Quotient):
        return v.num, v.den
    if isinstance(v, (float, np.floating)):
        f = Fraction(float(v))
        if f.denominator > 1024:
            raise ValueError("not a small fraction")
        return Expr.const(f.numerator), f.denominator
    return _as_expr(v), 1


def _float_arithmetic(op: str) -> Callable:
    """Add/Sub/Mul/Div of float shape values (a division only by a constant), as fractions."""

    def combine(x, y):
        (n1, d1), (n2, d2) = _ratio(x), _ratio(y)
        if op == "Add":
            return Quotient.make(n1 * d2 + n2 * d1, d1 * d2)
        if op == "Sub":
            return Quotient.make(n1 * d2 - n2 * d1, d1 * d2)
        if op == "Mul":
            return Quotient.make(n1 * n2, d1 * d2)
        if not n2.is_const() or n2.constant() == 0:
            raise ValueError("a division by a symbolic float")
        return Quotient.make(n1 * d2, d1 * n2.constant())

    return combine


def _rounding(floor: bool) -> Callable:
    def rule(node, values, types):
        def whole(v):
            if not isinstance(v, Quotient):
                return v
            return dims.floordiv(v.num + (0 if floor else v.den - 1), Expr.const(v.den)).to_dim()

        return _settle(np.asarray(np.frompyfunc(whole, 1, 1)(_obj(values[0])), dtype=object), types[0].dtype)

    return rule


def _identity(node, values, types):
    return None if values[0] is None else _settle(values[0])


def _reshape(node, values, types):
    if values[0] is None or values[1] is None or is_symbolic(values[1]):
        return None
    target = [int(d) for d in np.asarray(values[1]).reshape(-1)]
    data = _obj(values[0])
    if not (node.version >= 14 and int(node.attr("allowzero", 0))):
        target = [data.shape[i] if d == 0 and i < data.ndim else d for i, d in enumerate(target)]
    return _settle(data.reshape(target))


def _transpose(node, values, types):
    perm = node.attr("perm")
    data = _obj(values[0])
    return _settle(np.transpose(data, None if perm is None else [int(p) for p in perm]))


def _equal(node, values, types):
    a, b = (_obj(v) for v in values[:2])

    def eq(x, y):
        if isinstance(x, str) or isinstance(y, str):
            ex, ey = _as_expr(x), _as_expr(y)
            if ex == ey:
                return True
            if dims.provably_different(ex, ey):
                return False  # symbols are sizes: 6*batch is never 20
            if any(not isinstance(v, str) and v < 0 for v in (x, y)):
                return False  # a symbolic entry is a size (torch's Where(Equal(shape, -1), 1, shape))
            raise ValueError("unknown")
        return x == y

    return np.vectorize(eq, otypes=[bool])(a, b)


def _where(node, values, types):
    cond = values[0]
    if cond is None or is_symbolic(cond):
        return None
    return _settle(np.where(np.asarray(cond).astype(bool), _obj(values[1]), _obj(values[2])))


def _as_expr(v) -> Expr:
    return Expr.of(int(v)) if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) else Expr.of(v)


def _arithmetic(combine: Callable[[Expr, Expr], Expr]) -> Callable:
    """An int64 elementwise op on shape vectors, dims as expressions (``Mul(batch, 4)`` is ``4*batch``);
    on float shape values (torch's ``ceil(size / patch)``) Add/Sub/Mul/Div as fractions."""

    def rule(node, values, types):
        if any(t is None for t in types[:2]):
            return None
        if types[0].dtype in _FLOAT_CODES.values() and types[1].dtype == types[0].dtype:
            if node.op_type not in ("Add", "Sub", "Mul", "Div"):
                return None
            combined = np.frompyfunc(_float_arithmetic(node.op_type), 2, 1)
            return _settle(np.asarray(combined(_obj(values[0]), _obj(values[1])), dtype=object), types[0].dtype)
        if any(t.dtype not in ("int32", "int64") for t in types[:2]):
            return None
        combined = np.frompyfunc(lambda x, y: combine(_as_expr(x), _as_expr(y)).to_dim(), 2, 1)
        return _settle(np.asarray(combined(_obj(values[0]), _obj(values[1])), dtype=object))

    return rule


def _size(node, values, types):
    return np.array(dims.product(types[0].shape), dtype=object) if types[0] is not None else None


def _neg(node, values, types):
    return _settle(np.asarray(np.frompyfunc(lambda x: (-_as_expr(x)).to_dim(), 1, 1)(_obj(values[0])), dtype=object))


#: op -> evaluation of its first output on symbolic vectors (None: unknown).
SYMBOLIC: dict[str, Callable] = {
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Cast": _cast,
    "Identity": _identity,
    "Reshape": _reshape,
    "Equal": _equal,
    "Where": _where,
    "Transpose": _transpose,
    "Add": _arithmetic(lambda a, b: a + b),
    "Sub": _arithmetic(lambda a, b: a - b),
    "Mul": _arithmetic(lambda a, b: a * b),
    "Div": _arithmetic(dims.floordiv),
    "Mod": _arithmetic(dims.mod),
    "Max": _arithmetic(dims.maximum),
    "Min": _arithmetic(dims.minimum),
    "Neg": _neg,
    "Ceil": _rounding(floor=False),
    "Floor": _rounding(floor=True),
}


def _small(value: np.ndarray | None) -> bool:
    return value is not None and value.size <= SMALL and all(d <= SMALL for d in value.shape)


def _small_type(t: TensorType | None) -> bool:
    return (
        t is not None and t.is_static and t.numel() <= SMALL and all(isinstance(d, int) and d <= SMALL for d in t.shape)
    )


def evaluate(
    node: Node,
    module,
    values: Sequence[np.ndarray | None],
    in_types: Sequence[TensorType | None],
    out_types: Sequence[TensorType],
) -> list[np.ndarray | None]:
    """Known values of ``node``'s outputs (``None`` where unknown); never raises.

    ``values`` are the known values of its inputs (``None``: unknown or absent); ``out_types``
    are all the types the op infers (the kernel computes every one, declared or not).
    """
    unknown: list[np.ndarray | None] = [None] * len(node.outputs)
    if node.op_type == "Size" and in_types and in_types[0] is not None and not in_types[0].is_static:
        return [_size(node, values, in_types)] + unknown[1:]
    if node.op_type == "Shape" and in_types and in_types[0] is not None:
        try:
            return [_shape(node, values, in_types)] + unknown[1:]
        except (ValueError, TypeError) as e:
            log.debug("%s: shape value unknown (%s)", node.describe(), e)
            return unknown
    present = [v for name, v in zip(node.inputs, values, strict=True) if name]
    if not present or any(v is None for v in present):
        return unknown
    if any(is_symbolic(v) for v in present):
        rule = SYMBOLIC.get(node.op_type)
        if rule is None or not all(v.size <= SMALL for v in present):  # type: ignore[union-attr]  # None: returned above
            return unknown
        try:
            return [rule(node, list(values), in_types)] + unknown[1:]
        except (ValueError, TypeError, IndexError, ArithmeticError) as e:
            log.debug("%s: symbolic value unknown (%s)", node.describe(), e)
            return unknown
    if not all(_small(v) for v in present):
        return unknown
    if not out_types or not all(_small_type(t) for t in out_types):
        return unknown
    try:
        if module.flops(node, list(in_types), list(out_types)) > FOLD_MAX_FLOPS:
            return unknown
        results = module.kernel(node, *values)
    except Exception as e:  # noqa: BLE001 - a kernel failing on constants fails at run time too
        log.debug("%s: cannot evaluate at build time (%s)", node.describe(), e)
        return unknown
    return [np.asarray(r) if r is not None else None for r in results][: len(node.outputs)] + unknown[len(results) :]


def reshape_target(node: Node, value: np.ndarray, data_type: TensorType) -> np.ndarray | None:
    """An int64 Reshape target equivalent to the symbolic ``value``, or None.

    A symbol at axis ``i`` that equals the data's dim ``i`` becomes 0 (copy that
    dim; only without allowzero): ``['batch', -1]`` on ``[batch, 16, 4, 4]`` is ``[0, -1]``.
    """
    if not is_symbolic(value) or value.ndim != 1:
        return None
    if node.version >= 14 and int(node.attr("allowzero", 0)):
        return None
    out = []
    for i, v in enumerate(value):
        if isinstance(v, str):
            if i >= data_type.rank or data_type.shape[i] != v:
                return None
            out.append(0)
        else:
            out.append(int(v))
    return np.array(out, dtype=np.int64)


#: op -> how to turn a symbolic CONST_INPUT into a plain int64 one: (input index, rule).
CONCRETE: dict[str, tuple[int, Callable]] = {"Reshape": (1, reshape_target)}


def concrete_input(
    node: Node, index: int, value: np.ndarray, in_types: Sequence[TensorType | None]
) -> np.ndarray | None:
    """The int64 equivalent of a symbolic value at input ``index``, where the op has one."""
    rule = CONCRETE.get(node.op_type)
    if rule is None or rule[0] != index or in_types[0] is None:
        return None
    return rule[1](node, value, in_types[0])


def consts_for(
    module, node: Node, values: Mapping[str, np.ndarray], in_types: Sequence[TensorType | None]
) -> dict[str, dict[int, np.ndarray]]:
    """Keyword arguments for ``module.infer``: ``{"consts": {index: value}}`` with every known
    value among the inputs listed in ``CONST_INPUTS`` (symbolic ones as object arrays, or
    as the op's int64 equivalent where :data:`CONCRETE` has one); ``{}`` when it lists none."""
    wanted = getattr(module, "CONST_INPUTS", ())
    if not wanted:
        return {}
    consts: dict[int, np.ndarray] = {}
    for i in wanted:
        if i < len(node.inputs) and node.inputs[i] in values:
            value = values[node.inputs[i]]
            concrete = concrete_input(node, i, value, in_types) if is_symbolic(value) else None
            consts[i] = value if concrete is None else concrete
    return {"consts": consts}
