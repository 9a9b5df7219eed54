"""Build a checked, typed :class:`Graph`: structure checks, topological order, type inference."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from cuvil_edge.errors import CuvilError, MalformedModelError, ShapeInferenceError
from cuvil_edge.ir import dims, dtypes, ops, shape_values
from cuvil_edge.ir.graph import MAX_DIM, MAX_ELEMENTS, MAX_RANK, Graph, Node, TensorType, Value, readonly
from cuvil_edge.ir.ops._util import check_attrs


def check_type(t: TensorType, where: str) -> TensorType:
    """Reject unknown dtypes, negative, absurd or non-integer dims, and absurd element counts.

    Symbolic dims come back in canonical text (:mod:`cuvil_edge.ir.dims`).

    Raises:
        MalformedModelError: a dim is negative, too large, or not an int/symbolic dim; the rank is
            over :data:`MAX_RANK`; or the static dims hold more than :data:`MAX_ELEMENTS` elements.
        UnsupportedAttributeError: the dtype is not supported.
    """
    dtypes.check(t.dtype, where)
    if t.rank > MAX_RANK:
        raise MalformedModelError(f"{where} has rank {t.rank}, more than {MAX_RANK}; fix the model's shapes")
    if any(isinstance(d, str) for d in t.shape):
        t = TensorType(t.dtype, tuple(_canonical_dim(d, where) for d in t.shape))
    for d in t.shape:
        if isinstance(d, bool) or not isinstance(d, (int, str)):
            raise MalformedModelError(f"{where} has a dim {d!r} that is neither an int nor a symbol")
        if isinstance(d, int) and not 0 <= d <= MAX_DIM:
            raise MalformedModelError(f"{where} has dim {d}, outside 0..{MAX_DIM}; fix the model's shapes")
        if isinstance(d, str) and not d:
            raise MalformedModelError(f"{where} has an empty symbolic dim name")
    if t.numel() > MAX_ELEMENTS:
        raise MalformedModelError(
            f"{where} has shape {list(t.shape)}: more than {MAX_ELEMENTS} elements; fix the model's shapes"
        )
    return t


def _canonical_dim(d, where: str):
    """A symbolic dim in canonical text; a constant expression becomes its int."""
    if not isinstance(d, str) or not d:
        return d
    try:
        return dims.canonical(d)
    except (dims.DimError, ArithmeticError) as e:
        raise MalformedModelError(
            f"{where} has a dim that is not a symbol or an integer expression over "
            f"symbols ({e}); name dynamic axes like 'batch'"
        ) from None


def topological_order(nodes: Sequence[Node], available: set[str]) -> list[Node]:
    """Nodes ordered so each one's inputs are produced before it.

    Raises:
        MalformedModelError: duplicate producers, dangling inputs, or a cycle.
    """
    producer: dict[str, Node] = {}
    for n in nodes:
        for out in n.outputs:
            if not out:  # an optional output the model skips ("Y, '', '', qk")
                continue
            if out in producer or out in available:
                raise MalformedModelError(
                    f"value {out!r} is produced twice ({n.describe()}); every value needs one producer"
                )
            producer[out] = n
    for n in nodes:
        for name in n.inputs:
            if name and name not in producer and name not in available:
                raise MalformedModelError(
                    f"{n.describe()} reads {name!r}, which no node, graph input or initializer provides"
                )
    waiting = {id(n): sum(1 for i in set(n.inputs) if i in producer) for n in nodes}
    users: dict[str, list[Node]] = {}
    for n in nodes:
        for name in set(n.inputs):
            if name in producer:
                users.setdefault(name, []).append(n)
    ready = deque(n for n in nodes if waiting[id(n)] == 0)
    order: list[Node] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for out in n.outputs:
            for user in users.get(out, ()):
                waiting[id(user)] -= 1
                if waiting[id(user)] == 0:
                    ready.append(user)
    if len(order) != len(nodes):
        stuck = [n.name for n in nodes if waiting[id(n)] > 0]
        raise MalformedModelError(f"the graph has a cycle through nodes {stuck[:8]}; a model must be acyclic")
    return order


#: Exceptions that an op's inference raises only by mistake, on input it failed to validate.
#: :func:`_infer_nodes` turns them into a ShapeInferenceError naming the node: a last-resort
#: net, so that a caller always gets a ModelError; each one caught is a bug to fix in the op.
UNEXPECTED = (ArithmeticError, ValueError, TypeError, IndexError, KeyError, MemoryError, RecursionError)


def _infer_nodes(order: Sequence[Node], types: dict[str, TensorType], values: dict[str, np.ndarray]) -> None:
    """Infer the output types of ``order`` into ``types``, tracking known values in ``values``
    (see :mod:`cuvil_edge.ir.shape_values`).

    Raises:
        UnsupportedOpError: a node's op has no module.
        UnsupportedAttributeError: a node's attribute has the wrong kind or an unsupported value.
        ShapeInferenceError: a node's input types do not fit its op (or its inference failed unexpectedly).
        MalformedModelError: an inferred output type has an absurd dim.
    """
    for node in order:
        module = ops.get(node.op_type, node.describe(), node.version)
        try:
            _infer_node(node, module, types, values)
        except CuvilError:
            raise
        except UNEXPECTED as e:
            raise ShapeInferenceError(
                f"{node.describe()}: cannot infer output types ({type(e).__name__}: {e}); the model is malformed "
                "or uses the op in a way the IR does not support"
            ) from e


def _infer_node(node: Node, module, types: dict[str, TensorType], values: dict[str, np.ndarray]) -> None:
    """Check ``node``'s attribute kinds, infer and check its output types, fold its known values."""
    check_attrs(node, module)
    in_types = [types[i] if i else None for i in node.inputs]
    out_types = module.infer(node, in_types, **shape_values.consts_for(module, node, values, in_types))
    if len(out_types) < len([o for o in node.outputs if o]):
        raise ShapeInferenceError(
            f"{node.describe()} declares {len(node.outputs)} outputs, the op gives {len(out_types)}"
        )
    for out, t in zip(node.outputs, out_types, strict=False):
        if out:
            types[out] = check_type(t, f"output {out!r} of {node.describe()}")
    known = shape_values.evaluate(
        node, module, [values.get(i) if i else None for i in node.inputs], in_types, out_types
    )
    for out, value in zip(node.outputs, known, strict=False):
        if out and value is not None:
            values[out] = value


def known_values(graph: Graph) -> dict[str, np.ndarray]:
    """Every value of ``graph`` known before running it: initializers, small constant
    results, and symbolic shape vectors (object arrays; see :mod:`cuvil_edge.ir.shape_values`).

    Raises:
        ShapeInferenceError: re-inference failed (the graph was built elsewhere).
    """
    values: dict[str, np.ndarray] = dict(graph.initializers)
    types = {name: t for name, t in graph.types.items()}
    _infer_nodes(graph.nodes, types, values)
    return values


def build_graph(
    name: str,
    inputs: Sequence[Value],
    outputs: Sequence[str],
    nodes: Sequence[Node],
    initializers: Mapping[str, np.ndarray],
    opset: int,
) -> Graph:
    """Check structure, order nodes, infer every value's type.

    Raises:
        MalformedModelError: structural problems (see :func:`topological_order`).
        UnsupportedOpError: a node's op has no module.
        ShapeInferenceError: a node's input types do not fit its op.
    """
    types: dict[str, TensorType] = {}
    for v in inputs:
        if v.name in types:
            raise MalformedModelError(f"graph input {v.name!r} is declared twice")
        types[v.name] = check_type(v.type, f"graph input {v.name!r}")
    frozen: dict[str, np.ndarray] = {}
    for key, array in initializers.items():
        if key in types:
            raise MalformedModelError(f"initializer {key!r} has the same name as a graph input")
        frozen[key] = readonly(np.asarray(array))
        types[key] = check_type(TensorType.of(frozen[key]), f"initializer {key!r}")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise MalformedModelError("node names are not unique; give every node its own name")
    order = topological_order(nodes, set(types))
    _infer_nodes(order, types, dict(frozen))
    out_values = []
    for out in outputs:
        if out not in types:
            raise MalformedModelError(f"graph output {out!r} is not produced by any node or input")
        out_values.append(Value(out, types[out]))
    if not out_values:
        raise MalformedModelError("the graph has no outputs")
    return Graph(name, tuple(inputs), tuple(out_values), tuple(order), frozen, types, opset)


def with_sizes(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """The same graph with some dynamic axes fixed (``{"seq": 128}``), every type inferred again:
    what a plan of memory and time needs for the axes other than the batch.

    Raises:
        ShapeInferenceError: a name is not a dynamic axis of the graph's inputs, or a size is not
            a positive int (or the model does not hold at that size).
    """
    if not sizes:
        return graph
    axes = {d for v in graph.inputs for d in v.type.shape if isinstance(d, str)}
    for name, size in sizes.items():
        if name not in axes:
            raise ShapeInferenceError(
                f"the model has no dynamic axis {name!r}; its inputs' dynamic axes are "
                f"{', '.join(sorted(axes)) or 'none'}"
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ShapeInferenceError(f"dynamic axis {name!r} must be sized by a positive int, got {size!r}")
    inputs = [Value(v.name, v.type.bind(sizes)) for v in graph.inputs]
    return build_graph(
        graph.name, inputs, [v.name for v in graph.outputs], graph.nodes, graph.initializers, graph.opset
    )


def with_initializers(graph: Graph, arrays: Mapping[str, np.ndarray]) -> Graph:
    """The same graph with some initializers replaced (same dtype and shape required).

    Raises:
        ShapeInferenceError: unknown name, or dtype/shape differ from the original.
    """
    merged = dict(graph.initializers)
    for key, array in arrays.items():
        if key not in merged:
            raise ShapeInferenceError(f"{key!r} is not an initializer of graph {graph.name!r}")
        old, new = merged[key], np.asarray(array)
        if old.shape != new.shape or old.dtype != new.dtype:
            raise ShapeInferenceError(
                f"initializer {key!r} must stay {old.dtype}{list(old.shape)}, got {new.dtype}{list(new.shape)}"
            )
        merged[key] = readonly(new)
    return Graph(graph.name, graph.inputs, graph.outputs, graph.nodes, merged, graph.types, graph.opset)
