"""BatchNormalization folded into the preceding Conv or Gemm.

    Conv(x, W, b) → BatchNormalization(scale, B, mean, var)  ⇒  Conv(x, W·s, (b − mean)·s + B)
    Gemm(a, W, c) → BatchNormalization(scale, B, mean, var)  ⇒  Gemm(a, W·s, (β·c − mean)·s + B), β = 1

with s = scale / sqrt(var + epsilon) per output channel.  Only when the Conv/Gemm
output has no other reader and is not a graph output, every weight is an
initializer, and the BatchNormalization is in inference mode with only its first
output read.  New initializers get new names (shared weights are never changed).
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


def _bn_params(graph: Graph, bn: Node):
    if len(bn.inputs) != 5 or int(bn.attr("training_mode", 0)) or any(o for o in bn.outputs[1:]):
        return None
    if bn.version < 9 and not int(bn.attr("spatial", 1)):
        return None
    arrays = [graph.initializers.get(i) for i in bn.inputs[1:]]
    if any(a is None for a in arrays):
        return None
    scale, bias, mean, var = (np.asarray(a, np.float64).reshape(-1) for a in arrays)
    return scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5))), bias, mean


def _fold_conv(graph, conv, s, bias, mean):
    w = graph.initializers.get(conv.inputs[1])
    b = graph.initializers.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    if w is None or (len(conv.inputs) > 2 and conv.inputs[2] and b is None) or s.shape[0] != w.shape[0]:
        return None
    new_w = np.asarray(w, np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))
    old_b = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    return new_w.astype(w.dtype), ((old_b - mean) * s + bias).astype(w.dtype), {}


def _fold_gemm(graph, gemm, s, bias, mean):
    w = graph.initializers.get(gemm.inputs[1])
    c = graph.initializers.get(gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2] else None
    if w is None or (len(gemm.inputs) > 2 and gemm.inputs[2] and c is None) or w.ndim != 2:
        return None
    n_axis = 0 if int(gemm.attr("transB", 0)) else 1
    if s.shape[0] != w.shape[n_axis]:
        return None
    new_w = np.asarray(w, np.float64) * (s[:, None] if n_axis == 0 else s[None, :])
    old_c = np.zeros(w.shape[n_axis]) if c is None else np.asarray(c, np.float64) * float(gemm.attr("beta", 1.0))
    return new_w.astype(w.dtype), ((old_c - mean) * s + bias).astype(w.dtype), {"beta": 1.0}


#: producer op -> how to fold the BatchNormalization's per-channel affine map into it.
FOLDS = {"Conv": _fold_conv, "Gemm": _fold_gemm}


class FoldBatchNorm(Pass):
    name = "fold-batchnorm"

    def rewrite(self, graph: Graph) -> PassResult:
        uses, producer = users(graph), graph.producer()
        taken, inits = all_names(graph), dict(graph.initializers)
        replace: dict[int, Node | None] = {}
        changes = []
        for bn in graph.nodes:
            prev = producer.get(bn.inputs[0]) if bn.op_type == "BatchNormalization" else None
            if prev is None or prev.op_type not in FOLDS or id(prev) in replace:
                continue
            if sole_user(graph, bn.inputs[0], uses) is not bn or graph.types[bn.inputs[0]].dtype not in (
                "float32",
                "float64",
            ):
                continue
            params = _bn_params(graph, bn)
            folded = params and FOLDS[prev.op_type](graph, prev, *params)
            if not folded:
                continue
            new_w, new_b, attrs = folded
            w_name = fresh_tensor_name(taken, f"{prev.inputs[1]}_bn")
            b_name = fresh_tensor_name(taken, f"{prev.name}_bn_bias")
            inits[w_name], inits[b_name] = new_w, new_b
            replace[id(prev)] = with_(
                prev, inputs=(prev.inputs[0], w_name, b_name), outputs=bn.outputs[:1], set_attrs=attrs
            )
            replace[id(bn)] = None
            changes.append(f"folded {bn.describe()} into {prev.describe()}")
        return replaced(graph, replace, changes, inits)
