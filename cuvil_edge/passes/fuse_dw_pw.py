"""Depthwise + pointwise fusion: the inverted-residual block's second half becomes one node.

    Conv/CuvilFusedConv(x, Wd, Bd; group = C, stride 1, act ∈ none/relu/relu6)
      → Conv/CuvilFusedConv(·, Wp, Bp; 1x1, group 1, stride 1, no pads, act ∈ none/relu/relu6)
      [→ Add(·, r) with r of the same shape]
    ⇒  CuvilDwPw(x, Wd, Bd, Wp, Bp[, r])

Only when the depthwise output has the pointwise conv as its sole reader (and the pointwise
output the Add, when one is taken), neither is a graph output, the input is 4-D float with static
channels. Runs after FuseActivation, so the activations are already inside the convolutions. The
native kernel never writes the depthwise output to memory (``ir/ops/fused_block.py``); SAME pads,
a strided or padded pointwise conv, or a transcendental activation keep the two nodes, which the
native kernels of each already run. So does a strided depthwise conv (:data:`STRIDES`): the fused
kernel takes it, but measured 1.2-1.4x slower than the two kernels on MobileNetV2's stride-2
blocks (its phase-split rows cost more than the depthwise kernel's own strided path saves). And
so do maps narrower than :data:`MIN_WIDTH`: the fused kernel computes (kw - 1) extra columns per
row, which on 14- and 7-wide maps cost 5-15% more than the two kernels (equal at 56, 5% faster at
112, one thread, on the 2-core AMD EPYC it was tuned on: the expanded tensor stays in cache, so
skipping its trip through memory saves little).
"""

from __future__ import annotations

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.ops.conv import _conv_attrs
from cuvil_edge.ir.ops.fused_block import CLAMPS
from cuvil_edge.passes._infra import (
    Pass,
    PassResult,
    all_names,
    rebuild,
    replaced,
    sole_user,
    users,
)
from cuvil_edge.passes.naming import fresh_name

CONVS = ("Conv", "CuvilFusedConv")
#: depthwise strides the pass fuses, and the narrowest output map (see the module docstring)
STRIDES = ((1, 1),)
MIN_WIDTH = 56
FLOATS = ("float16", "float32", "float64")


def _conv(graph: Graph, node: Node | None) -> dict | None:
    """The resolved 2-D attributes of a float Conv whose input and weight types are known."""
    if node is None or node.op_type not in CONVS or len(node.inputs) < 2:
        return None
    x, w = graph.types.get(node.inputs[0]), graph.types.get(node.inputs[1])
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4 or x.dtype not in FLOATS:
        return None
    if not all(isinstance(d, int) for d in (*x.shape[1:], *w.shape)):
        return None
    attrs = _conv_attrs(node)
    # without kernel_shape the attributes stay unresolved: the defaults for two spatial dims
    attrs = {
        **attrs,
        "strides": attrs["strides"] or (1, 1),
        "dilations": attrs["dilations"] or (1, 1),
        "pads": attrs["pads"] or ((0,) * 4 if attrs["auto_pad"] == "NOTSET" else ()),
    }
    if attrs["auto_pad"] != "NOTSET" or attrs["activation"] not in CLAMPS:
        return None
    return {**attrs, "c": x.shape[1], "w": w.shape}


def _depthwise(graph: Graph, node: Node) -> dict | None:
    a = _conv(graph, node)
    if a is None or not (a["group"] == a["c"] == a["w"][0] and a["w"][1] == 1) or a["strides"] not in STRIDES:
        return None
    width = graph.types[node.outputs[0]].shape[-1]
    return a if isinstance(width, int) and width >= MIN_WIDTH else None


def _pointwise(graph: Graph, node: Node | None) -> dict | None:
    a = _conv(graph, node)
    if (
        a is None
        or a["group"] != 1
        or a["w"][2:] != (1, 1)
        or any(a["pads"])
        or a["dilations"] != (1, 1)
        or a["strides"] != (1, 1)
    ):
        return None
    return a


def _residual(graph: Graph, pw: Node, uses) -> tuple[Node, str] | None:
    """The Add reading the pointwise output and the other operand, when shapes and dtypes match."""
    add = sole_user(graph, pw.outputs[0], uses)
    if add is None or add.op_type != "Add" or len(add.inputs) != 2 or pw.outputs[0] not in add.inputs:
        return None
    other = add.inputs[1] if add.inputs[0] == pw.outputs[0] else add.inputs[0]
    mine, theirs = graph.types[pw.outputs[0]], graph.types.get(other)
    if other == pw.outputs[0] or theirs is None or theirs.shape != mine.shape or theirs.dtype != mine.dtype:
        return None
    return add, other


class FuseDepthwisePointwise(Pass):
    name = "fuse-dw-pw"

    def rewrite(self, graph: Graph) -> PassResult:
        uses = users(graph)
        replace: dict[int, Node | None] = {}
        changes = []
        for dw in graph.nodes:
            d = _depthwise(graph, dw) if id(dw) not in replace else None
            pw = sole_user(graph, dw.outputs[0], uses) if d is not None else None
            p = _pointwise(graph, pw) if pw is not None and id(pw) not in replace else None
            if d is None or pw is None or p is None or pw.inputs[0] != dw.outputs[0] or pw.inputs[1] == dw.outputs[0]:
                continue
            res = _residual(graph, pw, uses)
            inputs = [
                dw.inputs[0],
                dw.inputs[1],
                dw.inputs[2] if len(dw.inputs) > 2 else "",
                pw.inputs[1],
                pw.inputs[2] if len(pw.inputs) > 2 else "",
            ]
            last = pw
            if res is not None:
                inputs.append(res[1])
                last = res[0]
            while inputs and not inputs[-1]:
                inputs.pop()
            fused = Node(
                dw.name,
                "CuvilDwPw",
                tuple(inputs),
                last.outputs[:1],
                {
                    "strides": list(d["strides"]),
                    "pads": list(d["pads"]),
                    "dilations": list(d["dilations"]),
                    "dw_activation": d["activation"],
                    "pw_activation": p["activation"],
                },
                1,
            )
            # at the last node's place: the residual may be computed after the depthwise conv
            replace[id(dw)] = replace[id(pw)] = None
            replace[id(last)] = fused
            changes.append(
                f"fused {dw.describe()}, {pw.describe()}{' and ' + res[0].describe() if res else ''} into CuvilDwPw"
            )
        return replaced(graph, replace, changes)


def _conv_node(name: str, inputs: tuple[str, ...], out: str, activation: str, attrs: dict) -> Node:
    """A Conv as the importer made it, or the CuvilFusedConv FuseActivation made of it."""
    if activation == "none":
        return Node(name, "Conv", tuple(i for i in inputs if i), (out,), attrs, 11)
    return Node(name, "CuvilFusedConv", tuple(i for i in inputs if i), (out,), {**attrs, "activation": activation}, 1)


def split_dw_pw(graph: Graph) -> Graph:
    """``graph`` with every CuvilDwPw written out again as its two CuvilFusedConv (and the Add):
    training lowers convolutions to torch layers, one per weight, and has no lowering of the
    fused block (the weights keep their names, so trained values land where they came from).

    Raises:
        ModelError: the rewritten graph does not type-check.
    """
    if not any(n.op_type == "CuvilDwPw" for n in graph.nodes):
        return graph
    taken, nodes = all_names(graph), []
    for n in graph.nodes:
        if n.op_type != "CuvilDwPw":
            nodes.append(n)
            continue
        x, wd, bd, wp, bp, res = (list(n.inputs) + [""] * 6)[:6]
        kernel = list(graph.types[wd].shape[2:])
        dw_out, pw_out = fresh_name(taken, n.outputs[0] + "/dw"), fresh_name(taken, n.outputs[0] + "/pw")
        nodes.append(
            _conv_node(
                fresh_name(taken, n.name + "/dw"),
                (x, wd, bd),
                dw_out,
                n.attr("dw_activation"),
                {
                    "group": graph.types[x].shape[1],
                    "kernel_shape": kernel,
                    "strides": list(n.attr("strides")),
                    "pads": list(n.attr("pads")),
                    "dilations": list(n.attr("dilations")),
                },
            )
        )
        nodes.append(
            _conv_node(
                fresh_name(taken, n.name + "/pw"),
                (dw_out, wp, bp),
                pw_out if res else n.outputs[0],
                n.attr("pw_activation"),
                {"kernel_shape": [1, 1]},
            )
        )
        if res:
            nodes.append(Node(fresh_name(taken, n.name + "/add"), "Add", (pw_out, res), n.outputs, {}, 14))
    return rebuild(graph, nodes)
