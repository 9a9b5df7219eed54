"""Bias fusion: a constant Add after Conv, Gemm or 2-D MatMul moves into the op.

    Conv(x, W[, b]) → Add(·, c), c of shape (M,1,..,1) or (1,M,1,..,1)  ⇒  Conv(x, W, b + c)
    Gemm(a, B[, C]) → Add(·, c), c broadcasting to (N,)                 ⇒  Gemm(a, B, β·C + c), β = 1
    MatMul(a, B) → Add(·, c), a and B 2-D, c broadcasting to (N,)        ⇒  Gemm(a, B, c)
    MatMul(a, B) → Add(·, c), a of rank > 2, B a 2-D weight, c as (N,)   ⇒  CuvilFusedMatMul(a, B, c)

Only when the intermediate has no other reader and is not a graph output; c may be either Add operand.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import (
    Pass,
    PassResult,
    all_names,
    fresh_tensor_name,
    replaced,
    sole_user,
    users,
    with_,
)


def _channel_vector(c: np.ndarray, channels: int, rank: int, axis: int) -> np.ndarray | None:
    """``c`` as a (channels,) vector when it only varies along ``axis`` of a rank-``rank`` result."""
    if c.ndim > rank or c.size not in (1, channels):
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if c.size == channels and channels > 1 and shape[axis] != channels:
        return None
    return np.broadcast_to(c.reshape(-1), (channels,))


def _existing(graph: Graph, node: Node, index: int, channels: int):
    if len(node.inputs) <= index or not node.inputs[index]:
        return np.zeros(channels)
    return graph.initializers.get(node.inputs[index])


def _conv(graph, node, c):
    t = graph.types[node.outputs[0]]
    vec = _channel_vector(c, t.shape[1], t.rank, 1)
    old = _existing(graph, node, 2, t.shape[1])
    if vec is None or old is None:
        return None
    return "Conv", np.asarray(old, np.float64) + vec, {}


def _gemm_like(graph, node, c):
    t = graph.types[node.outputs[0]]
    if t.rank != 2 or not isinstance(t.shape[1], int):
        return None
    vec = _channel_vector(c, t.shape[1], 2, 1)
    if node.op_type == "MatMul":
        if node.version < 7 or graph.types[node.inputs[0]].rank != 2 or graph.types[node.inputs[1]].rank != 2:
            return None
        return None if vec is None else ("Gemm", vec.astype(np.float64), {})
    old = _existing(graph, node, 2, t.shape[1])
    if vec is None or old is None or (np.ndim(old) == 2 and np.shape(old)[0] != 1):
        return None
    base = np.asarray(old, np.float64).reshape(-1) * float(node.attr("beta", 1.0))
    return "Gemm", base + vec, {"beta": 1.0}


def _mat_mul(graph, node, c):
    a, b, t = (graph.types[name] for name in (*node.inputs[:2], node.outputs[0]))
    if a.rank == 2 and b.rank == 2:
        return _gemm_like(graph, node, c)
    # a Linear on a batch of sequences (torch's export): the weight is a 2-D initializer
    if a.rank < 3 or b.rank != 2 or node.inputs[1] not in graph.initializers or not isinstance(t.shape[-1], int):
        return None
    vec = _channel_vector(c, t.shape[-1], t.rank, t.rank - 1)
    return None if vec is None else ("CuvilFusedMatMul", vec.astype(np.float64), {})


#: producer op -> the fused (op, new bias, attribute changes), or None when c does not fit.
FUSIONS = {"Conv": _conv, "Gemm": _gemm_like, "MatMul": _mat_mul}


class FuseBias(Pass):
    name = "fuse-bias"

    def rewrite(self, graph: Graph) -> PassResult:
        uses, producer = users(graph), graph.producer()
        taken, inits = all_names(graph), dict(graph.initializers)
        replace: dict[int, Node | None] = {}
        changes = []
        for add in graph.nodes:
            if add.op_type != "Add" or len(add.inputs) != 2:
                continue
            for mine, other in ((0, 1), (1, 0)):
                prev, c = producer.get(add.inputs[mine]), graph.initializers.get(add.inputs[other])
                if prev is None or c is None or prev.op_type not in FUSIONS or id(prev) in replace:
                    continue
                if sole_user(graph, add.inputs[mine], uses) is not add:
                    continue
                if graph.types[add.outputs[0]] != graph.types[add.inputs[mine]]:
                    continue  # the Add broadcasts the result to a larger shape
                fused = FUSIONS[prev.op_type](graph, prev, c)
                if fused is None:
                    continue
                op, bias, attrs = fused
                name = fresh_tensor_name(taken, f"{prev.name}_bias")
                inits[name] = bias.astype(c.dtype)
                replace[id(prev)] = with_(
                    prev, op_type=op, inputs=(*prev.inputs[:2], name), outputs=add.outputs, set_attrs=attrs
                )
                replace[id(add)] = None
                changes.append(
                    f"fused {add.describe()} into {prev.describe()}" + (f" as {op}" if op != prev.op_type else "")
                )
                break
        return replaced(graph, replace, changes, inits)
