"""Convolution + residual Add fusion: the residual block's tail becomes one node.

    Conv/CuvilFusedConv(x, W[, B]; activation none) → Add(·, r) [→ Relu]
    ⇒  CuvilConvAdd(x, W, B or absent, r; activation none | relu)

Only when the convolution's output has the Add as its sole reader (and the Add's the activation,
when one is taken), neither is a graph output, and r has the Add's output type exactly (no
broadcast). The fused node stands where the Add stood, since r may be computed after the
convolution (ResNet's downsampling shortcut is). Runs after FuseActivation and
FuseDepthwisePointwise, which take the convolutions and Adds their own fusions need first. On a
target with the native GEMM the Add and the clamp happen in its store (``ir/ops/conv_add.py``):
the convolution's output is written once and never read back by two more passes.
"""

from __future__ import annotations

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, all_names, rebuild, replaced, sole_user, users
from cuvil_edge.passes.naming import fresh_name

CONVS = ("Conv", "CuvilFusedConv")
FLOATS = ("float16", "float32", "float64")


def _fusable_conv(graph: Graph, name: str, producers: dict, uses) -> Node | None:
    """The convolution (without an activation of its own) writing ``name``, if it has no other reader."""
    node = producers.get(name)
    if node is None or node.op_type not in CONVS or len(node.inputs) < 2 or sole_user(graph, name, uses) is None:
        return None
    if node.op_type == "CuvilFusedConv" and node.attr("activation", "none") != "none":
        return None
    t = graph.types.get(name)
    return node if t is not None and t.dtype in FLOATS else None


class FuseConvAdd(Pass):
    name = "fuse-conv-add"

    def rewrite(self, graph: Graph) -> PassResult:
        uses = users(graph)
        producers = {out: n for n in graph.nodes for out in n.outputs}
        replace: dict[int, Node | None] = {}
        changes = []
        for add in graph.nodes:
            if add.op_type != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1] or id(add) in replace:
                continue
            out = graph.types.get(add.outputs[0])
            for i in (0, 1):
                conv = _fusable_conv(graph, add.inputs[i], producers, uses)
                other = graph.types.get(add.inputs[1 - i])
                if conv is None or id(conv) in replace or other is None or other != out:
                    continue
                if graph.types.get(add.inputs[i]) != out:
                    continue
                act = sole_user(graph, add.outputs[0], uses)
                activation = "relu" if act is not None and act.op_type == "Relu" else None
                last = act if activation is not None and act is not None else add
                attrs = {k: v for k, v in conv.attrs.items() if k != "activation"}
                inputs = (
                    conv.inputs[0],
                    conv.inputs[1],
                    conv.inputs[2] if len(conv.inputs) > 2 else "",
                    add.inputs[1 - i],
                )
                fused = Node(
                    conv.name,
                    "CuvilConvAdd",
                    inputs,
                    last.outputs[:1],
                    {**attrs, "activation": activation or "none"},
                    1,
                )
                replace[id(conv)] = replace[id(add)] = None
                replace[id(last)] = fused
                relu = f" and {act.describe()}" if activation and act is not None else ""
                changes.append(f"fused {conv.describe()}, {add.describe()}{relu}")
                break
        return replaced(graph, replace, changes)


def split_conv_add(graph: Graph) -> Graph:
    """``graph`` with every CuvilConvAdd written out again as its convolution, Add and activation:
    training lowers one torch layer per convolution and int8 quantizes convolutions one by one
    (the weights keep their names, so trained values land where they came from, and the
    convolution its node's name, which ``keep_float`` and the reports name it by).

    Raises:
        ModelError: the rewritten graph does not type-check.
    """
    if not any(n.op_type == "CuvilConvAdd" for n in graph.nodes):
        return graph
    taken, nodes = all_names(graph), []
    for n in graph.nodes:
        if n.op_type != "CuvilConvAdd":
            nodes.append(n)
            continue
        x, w, b, r = n.inputs
        activation = n.attr("activation", "none")
        attrs = {k: v for k, v in n.attrs.items() if k != "activation"}
        conv_out = fresh_name(taken, n.outputs[0] + "/conv")
        nodes.append(Node(n.name, "Conv", tuple(i for i in (x, w, b) if i), (conv_out,), attrs, 11))
        if activation == "none":
            nodes.append(Node(fresh_name(taken, n.name + "/add"), "Add", (conv_out, r), n.outputs, {}, 14))
            continue
        summed = fresh_name(taken, n.outputs[0] + "/add")
        nodes.append(Node(fresh_name(taken, n.name + "/add"), "Add", (conv_out, r), (summed,), {}, 14))
        nodes.append(Node(fresh_name(taken, n.name + "/relu"), "Relu", (summed,), n.outputs, {}, 14))
    return rebuild(graph, nodes)
