"""Reference execution of any graph with the op registry's numpy kernels.

The interpreter is the oracle for compiled modules and constant folding, so it
favours clarity over speed: one kernel call per node, values freed after their
last use.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cuvil_edge.errors import CuvilError, ExecutionError
from cuvil_edge.ir import dims, ops
from cuvil_edge.ir.graph import Graph, TensorType


def bind_inputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Check feeds against the graph inputs and return the symbol bindings.

    Raises:
        ExecutionError: missing/extra feeds, wrong dtype, rank or size, or a
            symbol bound to two different sizes.
    """
    expected = {v.name for v in graph.inputs}
    if set(feeds) != expected:
        raise ExecutionError(
            f"graph {graph.name!r} takes inputs {sorted(expected)}, got {sorted(feeds)}; feed exactly those names"
        )
    bindings: dict[str, int] = {}
    for v in graph.inputs:
        array = feeds[v.name]
        want: TensorType = v.type
        if not isinstance(array, np.ndarray):
            raise ExecutionError(f"input {v.name!r} must be a numpy array, got {type(array).__name__}")
        if array.dtype != np.dtype(want.dtype):
            raise ExecutionError(f"input {v.name!r} must be {want.dtype}, got {array.dtype}; cast it with .astype")
        if array.ndim != want.rank:
            raise ExecutionError(f"input {v.name!r} must have shape {list(want.shape)}, got {list(array.shape)}")
        for axis, (dim, size) in enumerate(zip(want.shape, array.shape, strict=True)):
            if isinstance(dim, str):
                if bindings.setdefault(dim, size) != size:
                    raise ExecutionError(f"symbol {dim!r} is {bindings[dim]} elsewhere but {size} in input {v.name!r}")
            elif dim != size:
                raise ExecutionError(
                    f"input {v.name!r} axis {axis} must be {dim}, got {size} (shape {list(array.shape)})"
                )
    return bindings


def run(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute ``graph`` on ``feeds``; returns its outputs by name.

    Raises:
        ExecutionError: bad feeds, or a kernel failed (the node is named).
    """
    bindings = bind_inputs(graph, feeds)
    last_use: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[name] = index
    keep = {v.name for v in graph.outputs}
    env: dict[str, np.ndarray] = dict(graph.initializers)
    env.update(feeds)
    for index, node in enumerate(graph.nodes):
        module = ops.get(node.op_type, node.describe())
        args = [env[name] if name else None for name in node.inputs]
        try:
            results = module.kernel(node, *args)
        except CuvilError:
            raise
        except Exception as e:  # a kernel fault must name the node, not leak numpy's traceback
            raise ExecutionError(f"{node.describe()} failed: {type(e).__name__}: {e}") from e
        for name, value in zip(node.outputs, results, strict=False):
            if name:
                _check_shape(graph, node, name, value, bindings)
                env[name] = value
        for name in node.inputs:
            if last_use.get(name) == index and name not in keep and name not in graph.initializers:
                env.pop(name, None)
    return {v.name: env[v.name] for v in graph.outputs}


def _check_shape(graph: Graph, node, name: str, value, bindings: dict[str, int]) -> None:
    """A value's shape is its inferred type's, bound to the feeds' sizes: a symbolic dim the build
    took on trust (a slice bound within its axis, a division it could not prove exact) that this
    run breaks is an error naming the node, not a wrong shape passed on. Symbols only the data
    decides (NonZero's count) are bound where they first appear."""
    want = graph.types.get(name)
    shape = getattr(value, "shape", None)
    if want is None or shape is None or want.is_static and tuple(want.shape) == tuple(shape):
        return
    if len(shape) != want.rank:
        raise ExecutionError(f"{node.describe()} made {name!r} of shape {list(shape)}, but its type is {want}")
    for dim, size in zip(want.shape, shape, strict=True):
        if isinstance(dim, int):
            ok = dim == size
        else:
            expr = dims.parse(dim)
            free = expr.symbols() - set(bindings)
            if len(free) == 1 and expr == dims.Expr.symbol(next(iter(free))):
                bindings[dim] = int(size)
                continue
            ok = bool(free) or expr.evaluate(bindings) == size
        if not ok:
            bound = want.bind(bindings)
            raise ExecutionError(
                f"{node.describe()} made {name!r} of shape {list(shape)}, but its type {want} is {list(bound.shape)} "
                f"for {', '.join(f'{k}={v}' for k, v in sorted(bindings.items()))}: the model does not hold for "
                "these input sizes (a slice or reshape it makes assumes other sizes)"
            )
