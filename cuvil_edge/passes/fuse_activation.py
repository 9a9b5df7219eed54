"""Activation fusion: Conv / Gemm followed by an activation become one fused node.

    Conv → Relu                       ⇒  CuvilFusedConv(activation="relu")
    Conv → Clip(min 0, max 6)         ⇒  CuvilFusedConv(activation="relu6")
    Conv → Sigmoid                    ⇒  CuvilFusedConv(activation="sigmoid")
    Conv → HardSwish                  ⇒  CuvilFusedConv(activation="hardswish")
    Conv → Gelu(approximate="none")   ⇒  CuvilFusedConv(activation="gelu")
    Conv → Swish(alpha=1)             ⇒  CuvilFusedConv(activation="swish")
    Gemm → (the same)                 ⇒  CuvilFusedGemm(activation=...)
    CuvilFusedMatMul → (the same)     ⇒  CuvilFusedMatMul(activation=...)

Only when the Conv/Gemm output has no other reader and is not a graph output.
The fused ops live in ``ir/ops/fused_conv.py`` and ``fused_gemm.py``; they keep
all Conv/Gemm attributes and apply the activation to the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import Pass, PassResult, replaced, sole_user, users, with_


def _clip_bounds(graph: Graph, node: Node) -> tuple[float | None, float | None]:
    if node.version < 11:
        return node.attr("min"), node.attr("max")
    bounds: list[float | None] = []
    for i in (1, 2):
        if len(node.inputs) <= i or not node.inputs[i]:
            bounds.append(None)
            continue
        value = graph.initializers.get(node.inputs[i])
        bounds.append(float("nan") if value is None else float(np.asarray(value).reshape(-1)[0]))
    return bounds[0], bounds[1]


def _clip(graph: Graph, node: Node) -> str | None:
    return "relu6" if _clip_bounds(graph, node) == (0.0, 6.0) else None


#: activation op -> its name in the fused op (None when this node does not qualify).
ACTIVATIONS: dict[str, Callable[[Graph, Node], str | None]] = {
    "Relu": lambda graph, node: "relu",
    "Clip": _clip,
    "Sigmoid": lambda graph, node: "sigmoid",
    "HardSwish": lambda graph, node: "hardswish",
    "Gelu": lambda graph, node: "gelu" if str(node.attr("approximate", "none")) == "none" else None,
    "Swish": lambda graph, node: "swish" if float(node.attr("alpha", 1.0)) == 1.0 else None,
}

#: producer op -> fused op (a CuvilFusedMatMul, made by FuseBias, takes an activation too).
FUSED = {"Conv": "CuvilFusedConv", "Gemm": "CuvilFusedGemm", "CuvilFusedMatMul": "CuvilFusedMatMul"}


class FuseActivation(Pass):
    name = "fuse-activation"

    def rewrite(self, graph: Graph) -> PassResult:
        uses, producer = users(graph), graph.producer()
        replace: dict[int, Node | None] = {}
        changes = []
        for act in graph.nodes:
            rule = ACTIVATIONS.get(act.op_type)
            prev = producer.get(act.inputs[0]) if rule and act.inputs else None
            if (
                rule is None
                or prev is None
                or prev.op_type not in FUSED
                or id(prev) in replace
                or prev.attr("activation", "none") != "none"
            ):
                continue
            if sole_user(graph, act.inputs[0], uses) is not act or graph.types[act.inputs[0]].dtype not in (
                "float16",
                "float32",
                "float64",
            ):
                continue
            name = rule(graph, act)
            if name is None:
                continue
            replace[id(prev)] = with_(
                prev, op_type=FUSED[prev.op_type], outputs=act.outputs[:1], set_attrs={"activation": name}
            )
            replace[id(act)] = None
            changes.append(f"fused {act.describe()} into {prev.describe()} as {FUSED[prev.op_type]}({name})")
        return replaced(graph, replace, changes)
