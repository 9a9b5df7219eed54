"""Shape computations the build has already evaluated, written as expressions of the input sizes.

A graph exported with dynamic axes computes shapes at run time (``Shape -> Gather -> Div ->
Concat -> Reshape``).  The build knows each such value as a vector of integer expressions over
the symbols (:mod:`cuvil_edge.ir.shape_values`), so the generated module need not run those
nodes: it reads each symbol once from an input's shape (``batch = v0.shape[0]``) and writes the
vector as a literal of them (``np.array([batch, 64, (height//8)*(width//8)], dtype=np.int64)``).
The nodes that only fed such values are then dead and are not written at all.

Values that depend on a symbol no input carries (NonZero's count) keep their kernel calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil_edge.ir import dims, shape_values
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import known_values

#: Largest vector written as a literal (a shape vector has one entry per axis).
MAX_LITERAL = 64


@dataclass(frozen=True)
class ShapeCode:
    #: symbol -> (graph input name, axis) it is read from, for the symbols the literals use
    symbols: dict[str, tuple[str, int]]
    #: node index -> {output name: Python expression of the value}
    literals: dict[int, dict[str, str]]
    #: indices of the nodes the module writes (the others only fed literals)
    live: frozenset[int]


def variable(symbol: str) -> str:
    """The generated module's name for a symbol's size (symbols are identifiers, see ir.dims)."""
    return f"d_{symbol}"


def plan(graph: Graph) -> ShapeCode:
    """Which nodes become literals, which symbols the module reads, which nodes still run."""
    symbols: dict[str, tuple[str, int]] = {}
    for v in graph.inputs:
        for axis, d in enumerate(v.type.shape):
            if isinstance(d, str) and dims.SYMBOL.match(d):
                symbols.setdefault(d, (v.name, axis))
    known = known_values(graph) if any(isinstance(d, str) for v in graph.inputs for d in v.type.shape) else {}
    keep = {v.name for v in graph.outputs}
    literals: dict[int, dict[str, str]] = {}
    read: set[str] = set()
    for index, node in enumerate(graph.nodes):
        outs = [o for o in node.outputs if o]
        if not outs or any(o in keep for o in outs):
            continue
        written = {o: _literal(known.get(o), graph.types[o].dtype, symbols, read) for o in outs}
        texts = {o: text for o, text in written.items() if text is not None}
        if len(texts) == len(written):
            literals[index] = texts
    # a node is skipped when every reader of its outputs is skipped or a literal; a node that no one
    # reads still runs, as it did before (the memory plan counts it)
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for name in set(node.inputs):
            if name:
                readers.setdefault(name, []).append(index)
    skipped: set[int] = set()
    for index in range(len(graph.nodes) - 1, -1, -1):
        outs = [o for o in graph.nodes[index].outputs if o]
        reading = [r for o in outs for r in readers.get(o, ())]
        if reading and not any(o in keep for o in outs) and all(r in skipped or r in literals for r in reading):
            skipped.add(index)
    live = set(range(len(graph.nodes))) - skipped
    return ShapeCode({s: symbols[s] for s in sorted(read)}, literals, frozenset(live))


def _literal(value, dtype: str, symbols: dict[str, tuple[str, int]], read: set[str]) -> str | None:
    """``value`` as Python source, or None where it is not a small symbolic integer vector whose
    symbols the inputs carry (numeric values are folded into initializers by the passes)."""
    if not shape_values.is_symbolic(value) or value.size > MAX_LITERAL or dtype not in ("int32", "int64"):
        return None
    entries = []
    for v in value.reshape(-1).tolist():
        if isinstance(v, str):
            expr = dims.parse(v)
            if not expr.symbols() <= set(symbols):
                return None
            read |= expr.symbols()
            entries.append(expr.python(variable))
        else:
            entries.append(str(int(v)))
    array = f"np.array([{', '.join(entries)}], dtype=np.{dtype})"
    return array if value.ndim == 1 else f"{array}.reshape({tuple(int(d) for d in value.shape)!r})"
