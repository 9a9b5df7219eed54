"""QDQ-wrapped products become the integer ops, so a target with int8 kernels computes in int8.

    DequantizeLinear(xq, xs, xz) ─┐
    DequantizeLinear(Wq, ws, wz) ─┴→ Conv (+ float bias B) → QuantizeLinear(ys, yz)
      ⇒  QLinearConv(xq, xs, xz, Wq, ws, wz, ys, yz, round(B / (xs · ws)) as int32)
    the same with MatMul and a 2-D Wq (ws per tensor or per column)
      ⇒  QLinearMatMul(xq, xs, xz, Wq, ws, wz, ys, yz)
    QuantizeLinear(DequantizeLinear(a) + DequantizeLinear(b), ys, yz), all per tensor
      ⇒  CuvilQLinearAdd(a, as, az, b, bs, bz, ys, yz)       (the same float32 arithmetic, exactly)
    QuantizeLinear(MaxPool(DequantizeLinear(x, s, z)), s, z)   (one scale and zero point)
      ⇒  MaxPool(x)          (exact: the max commutes with the increasing dequantization, and
                             quantizing a dequantized value with its own parameters returns it)

What onnxruntime's quantizer (QDQ format) and our ``quantize_int8`` produce. As onnxruntime does it:
the float product of the dequantized operands is exactly (xq - xz)(Wq - wz) · xs · ws, so the only
change is the bias, rounded onto the accumulator's grid (half an accumulator step, far below one
output step); a bias that is already DequantizeLinear(int32, xs · ws) is taken as it is. A
CuvilFusedConv's Relu is dropped only where it changes nothing: when y's zero point is the lowest
value of its type, QuantizeLinear already clamps every negative y to it.

Only when the product's output has no reader but the QuantizeLinear, and the scales and zero points
are initializers of the shapes the integer ops take; anything else is left as it was (it runs in
float, as it would without this pass). The DequantizeLinear nodes stay while something else reads them.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, fresh_graph_name, fresh_tensor_name, rebuild, sole_user, users

_QUANT = (np.dtype(np.int8), np.dtype(np.uint8))


def _const(graph: Graph, name: str | None) -> np.ndarray | None:
    return graph.initializers.get(name) if name else None


def _dq_parts(graph: Graph, node: Node | None):
    """(q, scale, zero point or None, axis) of a DequantizeLinear whose scale (and zero point) are
    initializers, else None."""
    if node is None or node.op_type != "DequantizeLinear" or node.attr("block_size", 0):
        return None
    scale = _const(graph, node.inputs[1])
    zp_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    zp = _const(graph, zp_name)
    if scale is None or (zp_name and zp is None) or scale.dtype != np.float32:
        return None
    return node.inputs[0], scale, zp, int(node.attr("axis", 1))


def _per_tensor(scale, zp) -> bool:
    return scale.size == 1 and (zp is None or zp.size == 1)


def _along(scale, zp, axis, rank, size, want_axis) -> bool:
    """A scale (and zero point) per tensor, or of ``size`` elements along ``want_axis``."""
    if _per_tensor(scale, zp):
        return True
    return (
        scale.ndim == 1
        and scale.size == size
        and (axis % rank) == want_axis
        and (zp is None or zp.shape == scale.shape)
    )


class FuseQDQ(Pass):
    name = "fuse-qdq"

    def rewrite(self, graph: Graph) -> PassResult:
        uses, producer = users(graph), graph.producer()
        taken = set(graph.types) | {n.name for n in graph.nodes}
        inits = dict(graph.initializers)
        replace: dict[int, Node | None] = {}
        changes: list[str] = []
        for q in graph.nodes:
            if q.op_type != "QuantizeLinear" or len(q.inputs) < 3 or q.attr("output_dtype", 0):
                continue
            op = producer.get(q.inputs[0])
            if op is None or id(op) in replace or sole_user(graph, q.inputs[0], uses) is not q:
                continue
            fused = self._fuse(graph, op, q, inits, taken)
            if fused is not None:
                replace[id(op)], replace[id(q)] = fused, None
                changes.append(f"{op.describe()} with its QuantizeLinear {q.name!r} became {fused.op_type}")
        if not changes:
            return PassResult(graph, False)
        replaced = [replace.get(id(n), n) for n in graph.nodes]
        nodes = _drop_unread([n for n in replaced if n is not None], graph)
        read = {i for n in nodes for i in n.inputs} | {v.name for v in graph.outputs}
        return PassResult(rebuild(graph, nodes, {k: v for k, v in inits.items() if k in read}), True, changes)

    def _fuse(self, graph: Graph, op: Node, q: Node, inits: dict, taken: set) -> Node | None:
        producer = graph.producer()
        ys, yz = _const(graph, q.inputs[1]), _const(graph, q.inputs[2])
        if ys is None or yz is None or ys.size != 1 or yz.size != 1 or yz.dtype not in _QUANT:
            return None
        if op.op_type == "Add" and len(op.inputs) == 2:
            return self._add(graph, op, q, inits, taken)
        if op.op_type == "MaxPool" and len(op.outputs) == 1:
            return self._max_pool(graph, op, q, ys, yz, taken)
        if op.op_type not in ("Conv", "CuvilFusedConv", "MatMul") or len(op.inputs) < 2:
            return None
        x, w = _dq_parts(graph, producer.get(op.inputs[0])), _dq_parts(graph, producer.get(op.inputs[1]))
        if x is None or w is None or not _per_tensor(x[1], x[2]):
            return None
        wq = _const(graph, w[0])
        if wq is None or wq.dtype not in _QUANT or graph.types[x[0]].dtype not in ("int8", "uint8"):
            return None
        activation = str(op.attr("activation", "none"))
        lowest = np.iinfo(yz.dtype).min
        if activation not in ("none", "relu") or (activation == "relu" and int(yz.reshape(())) != lowest):
            return None
        xz = x[2] if x[2] is not None else np.zeros((), graph.types[x[0]].dtype)
        wz = w[2] if w[2] is not None else np.zeros(w[1].shape, wq.dtype)
        if op.op_type == "MatMul":
            if wq.ndim != 2 or not _along(w[1], w[2], w[3], 2, wq.shape[1], 1):
                return None
            bias = None
        else:
            if wq.ndim < 3 or not _along(w[1], w[2], w[3], wq.ndim, wq.shape[0], 0):
                return None
            bias = self._bias(graph, op, x[1], w[1], wq.shape[0])
            if bias is False:
                return None
        names = []
        for what, value in (("x_zero_point", xz), ("w_zero_point", wz), ("bias", bias)):
            if value is None:
                continue
            name = fresh_tensor_name(taken, f"{op.name}.{what}")
            inits[name] = np.ascontiguousarray(value)
            names.append(name)
        xz_name, wz_name = names[0], names[1]
        inputs = (
            x[0],
            producer[op.inputs[0]].inputs[1],
            xz_name,
            w[0],
            producer[op.inputs[1]].inputs[1],
            wz_name,
            q.inputs[1],
            q.inputs[2],
        )
        if op.op_type == "MatMul":
            return Node(fresh_graph_name(taken, op.name), "QLinearMatMul", inputs, q.outputs, {}, 10)
        attrs = {
            k: v
            for k, v in op.attrs.items()
            if k in ("strides", "pads", "dilations", "group", "auto_pad", "kernel_shape")
        }
        return Node(
            fresh_graph_name(taken, op.name),
            "QLinearConv",
            inputs + ((names[2],) if bias is not None else ()),
            q.outputs,
            attrs,
            10,
        )

    @staticmethod
    def _max_pool(graph: Graph, op: Node, q: Node, ys, yz, taken: set) -> Node | None:
        dq = graph.producer().get(op.inputs[0])
        parts = _dq_parts(graph, dq)
        if parts is None or parts[2] is None or graph.types[parts[0]].dtype != yz.dtype:
            return None
        if (
            parts[1].size != 1
            or parts[2].size != 1
            or float(parts[1].reshape(())) != float(ys.reshape(()))
            or (int(parts[2].reshape(())) != int(yz.reshape(())))
        ):
            return None
        return Node(
            fresh_graph_name(taken, op.name), "MaxPool", (parts[0],), q.outputs, dict(op.attrs), max(op.version, 12)
        )

    @staticmethod
    def _add(graph: Graph, op: Node, q: Node, inits: dict, taken: set) -> Node | None:
        producer, inputs = graph.producer(), []
        for name in op.inputs:
            dq = producer.get(name)
            parts = _dq_parts(graph, dq)
            if (
                dq is None
                or parts is None
                or not _per_tensor(parts[1], parts[2])
                or graph.types[parts[0]].dtype not in ("int8", "uint8")
            ):
                return None
            zp = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2] else None
            if zp is None:
                zp = fresh_tensor_name(taken, f"{op.name}.zero_point")
                inits[zp] = np.zeros((), graph.types[parts[0]].dtype)
            inputs += [parts[0], dq.inputs[1], zp]
        return Node(
            fresh_graph_name(taken, op.name), "CuvilQLinearAdd", (*inputs, q.inputs[1], q.inputs[2]), q.outputs, {}, 1
        )

    @staticmethod
    def _bias(graph: Graph, op: Node, xs, ws, m):
        """The int32 bias on the accumulator's grid (xs · ws), None without one, False when it is not
        a constant the integer op can take."""
        name = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] else None
        if name is None:
            return None
        grid = (xs.astype(np.float32).reshape(()) * ws.astype(np.float32).reshape(-1)).astype(np.float32)
        dq = _dq_parts(graph, graph.producer().get(name))
        if dq is not None:
            bq = _const(graph, dq[0])
            if (
                bq is not None
                and bq.dtype == np.int32
                and bq.shape == (m,)
                and (dq[2] is None or not dq[2].any())
                and np.allclose(dq[1].reshape(-1), grid, rtol=1e-6, atol=0)
            ):
                return bq
            return False
        b = _const(graph, name)
        if b is None or b.dtype != np.float32 or b.shape != (m,) or not np.all(grid > 0):
            return False
        return np.clip(np.rint(b.astype(np.float64) / grid), -(2**31), 2**31 - 1).astype(np.int32)


def _drop_unread(nodes: list[Node], graph: Graph) -> list[Node]:
    """Without the DequantizeLinear nodes nothing reads any more."""
    outputs = {v.name for v in graph.outputs}
    while True:
        read = {i for n in nodes for i in n.inputs} | outputs
        kept = [n for n in nodes if n.op_type != "DequantizeLinear" or any(o in read for o in n.outputs)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def fuse_qdq(graph: Graph) -> Graph:
    """``graph`` with its QDQ-wrapped Conv/MatMul as QLinearConv/QLinearMatMul (itself when none is).

    Raises:
        PassError: the rewrite failed or produced an invalid graph.
    """
    return FuseQDQ()(graph).graph


__all__ = ["FuseQDQ", "fuse_qdq"]
