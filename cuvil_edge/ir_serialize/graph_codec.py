"""The ``graph`` object of the payload header (PACKAGE_SPEC §6.2) back into a checked Graph.

The header is not trusted: every field is type-checked here and the graph is
rebuilt through :func:`cuvil_edge.ir.infer.build_graph`, so op names, versions
and types are re-inferred from the op registry.  The declared structure must
then equal the rebuilt one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cuvil_edge.errors import ModelError, PackageFormatError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import MAX_INLINE_TENSOR, Graph, Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize._canonical import (
    check_graph_name,
    check_int,
    check_tensor_name,
    fields,
    get_int,
    get_list,
    get_str,
)

GRAPH_KEYS = ("name", "opset", "inputs", "outputs", "nodes", "initializers")
VALUE_KEYS = ("name", "dtype", "shape")
NODE_KEYS = ("name", "op", "version", "inputs", "outputs", "attrs")
MAX_RANK = 64
MAX_OPSET = 1000
_SCALARS = (bool, int, float, str)


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """The header ``graph`` object (PACKAGE_SPEC §6.2).

    Raises:
        PackageFormatError: an attribute holds a tensor (fold it into an initializer).
    """
    try:
        return graph.to_dict()
    except ValueError as e:
        raise PackageFormatError(f"graph {graph.name!r} cannot be serialized: {e}") from e


def graph_from_dict(obj: Any, arrays: Mapping[str, np.ndarray]) -> Graph:
    """Rebuild and re-check the graph described by ``obj`` with ``arrays`` as initializers.

    Raises:
        PackageFormatError: a field is missing, unknown or mistyped, the graph fails
            the IR's checks, or the declared structure differs from the rebuilt one.
    """
    g = fields(obj, GRAPH_KEYS, "header graph")
    name = check_graph_name(g["name"], "header graph name", empty=True)
    opset = get_int(g, "opset", "header graph", 1, MAX_OPSET)
    inputs = [_value(v, f"graph input #{i}") for i, v in enumerate(get_list(g, "inputs", "header graph"))]
    outputs = [_value(v, f"graph output #{i}") for i, v in enumerate(get_list(g, "outputs", "header graph"))]
    nodes = [_node(n, i) for i, n in enumerate(get_list(g, "nodes", "header graph"))]
    inits = [check_tensor_name(s, "initializer name") for s in get_list(g, "initializers", "header graph")]
    if inits != list(arrays):
        raise PackageFormatError("header graph 'initializers' must list exactly the tensor table's names, in its order")
    try:
        graph = build_graph(name, inputs, [v.name for v in outputs], nodes, arrays, opset)
    except ModelError as e:
        raise PackageFormatError(f"the payload graph fails the IR checks: {e}") from e
    if _normalized(graph_to_dict(graph)) != _normalized(g):
        raise PackageFormatError(
            "the header graph differs from the graph rebuilt from it (declared output types or attributes "
            "do not match what the ops infer); PACKAGE_SPEC §6.2"
        )
    return graph


def _normalized(graph_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Node order is not significant (build_graph re-orders topologically)."""
    return {**graph_dict, "nodes": sorted(graph_dict["nodes"], key=lambda n: n["name"])}


def _value(obj: Any, where: str) -> Value:
    v = fields(obj, VALUE_KEYS, where)
    shape = get_list(v, "shape", where)
    if len(shape) > MAX_RANK:
        raise PackageFormatError(f"{where} has rank {len(shape)}, more than {MAX_RANK}")
    dims = tuple(
        check_graph_name(d, f"{where} symbolic dim") if isinstance(d, str) else check_int(d, f"{where} dim")
        for d in shape
    )
    return Value(check_graph_name(v["name"], f"{where} name"), TensorType(get_str(v, "dtype", where), dims))


def _node(obj: Any, index: int) -> Node:
    where = f"header node #{index}"
    n = fields(obj, NODE_KEYS, where)
    ins = tuple(check_graph_name(s, f"{where} input", empty=True) for s in get_list(n, "inputs", where))
    outs = tuple(check_graph_name(s, f"{where} output", empty=True) for s in get_list(n, "outputs", where))
    attrs = n["attrs"]
    if not isinstance(attrs, dict):
        raise PackageFormatError(f"{where} field 'attrs' must be a JSON object")
    return Node(
        name=check_graph_name(n["name"], f"{where} name"),
        op_type=get_str(n, "op", where),
        inputs=ins,
        outputs=outs,
        attrs={
            check_graph_name(k, f"{where} attribute name"): _attr(v, f"{where} attribute {k!r}")
            for k, v in attrs.items()
        },
        version=get_int(n, "version", where, 1, MAX_OPSET),
    )


def _attr(value: Any, where: str) -> Any:
    """JSON scalars and flat lists of scalars (lists become tuples), or a small inline
    tensor ``{"tensor": {"dtype", "shape", "values"}}`` (PACKAGE_SPEC §6.2).

    Raises:
        PackageFormatError: another JSON type, an int outside int64, or a bad inline tensor.
    """
    if isinstance(value, _SCALARS):
        return _scalar(value, where)
    if isinstance(value, list) and all(isinstance(x, _SCALARS) for x in value):
        return tuple(_scalar(x, where) for x in value)
    if isinstance(value, dict) and set(value) == {"tensor"}:
        return _inline_tensor(value["tensor"], where)
    raise PackageFormatError(f"{where} must be a number, string or flat list of them, got {value!r:.80}")


_INT64 = np.iinfo(np.int64)


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and not _INT64.min <= value <= _INT64.max:
        raise PackageFormatError(f"{where} holds the integer {value}, outside int64")
    return value


def _inline_tensor(obj: Any, where: str) -> np.ndarray:
    """A read-only array from ``{"dtype", "shape", "values"}``; every value must fit the dtype.

    Raises:
        PackageFormatError: unknown keys or dtype, a bad shape, a count that differs from the
            shape, or a value that is not a number of the dtype's range (ints for integer dtypes).
    """
    t = fields(obj, ("dtype", "shape", "values"), where)
    dtype = get_str(t, "dtype", where)
    if dtype not in dtypes.SUPPORTED or dtype == "bool":  # bool fills are rare; keep the codec small
        raise PackageFormatError(f"{where}: inline tensor dtype {dtype!r} is not supported")
    dims = get_list(t, "shape", where)
    if len(dims) > MAX_RANK:
        raise PackageFormatError(f"{where}: inline tensor has rank {len(dims)}, more than {MAX_RANK}")
    shape = [check_int(d, f"{where} shape", 0, MAX_INLINE_TENSOR) for d in dims]
    values = get_list(t, "values", where)
    count = int(np.prod(shape, dtype=object))  # python ints: no overflow
    if len(values) > MAX_INLINE_TENSOR or count != len(values):
        raise PackageFormatError(
            f"{where}: inline tensor of shape {shape} must have {count} values "
            f"(at most {MAX_INLINE_TENSOR}), got {len(values)}"
        )
    if not all(_fits(v, np.dtype(dtype)) for v in values):
        raise PackageFormatError(
            f"{where}: inline tensor values must be numbers that fit {dtype} (integers in its range, or finite floats)"
        )
    array = np.array(values, dtype=dtype).reshape(shape)
    array.flags.writeable = False
    return array


def _fits(value: Any, dtype: np.dtype) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if dtype.kind == "f":
        return abs(value) <= float(np.finfo(dtype).max)  # exact int/float comparison: never overflows
    info = np.iinfo(dtype)
    return isinstance(value, int) and info.min <= value <= info.max
