"""Turn an IR graph into a trainable torch module (for local DP-SGD only).

Weighted nodes become real ``nn.Conv2d`` / ``nn.Linear`` layers so Opacus can
compute per-sample gradients with its standard hooks; every other node runs as
a torch function.  After training, :meth:`IRTorchModule.ir_weights` maps the
trained parameters back to the IR's initializer names and layouts.

torch is imported here and only here on the agent side; the inference path
(verify -> build -> run) never imports this module.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from cuvil_edge.errors import UnsupportedOpError
from cuvil_edge.ir.graph import Graph, Node

TRAINABLE_OPS = ("Conv", "Gemm", "MatMul")


def _pads2d(node: Node) -> tuple[int, int, int, int]:
    pads = list(node.attr("pads", [0, 0, 0, 0]))
    return pads[0], pads[1], pads[2], pads[3]  # top, left, bottom, right


def _symmetric(node: Node) -> tuple[int, int] | None:
    top, left, bottom, right = _pads2d(node)
    return (top, left) if (top, left) == (bottom, right) else None


def _pad_input(node: Node, x: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    top, left, bottom, right = _pads2d(node)
    return F.pad(x, (left, right, top, bottom), value=value)


def _conv_layer(node: Node, w: np.ndarray, b: np.ndarray | None) -> nn.Conv2d:
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"{node.describe()}: auto_pad SAME is not trainable yet; export with explicit pads")
    out_c, in_c_per_group, kh, kw = w.shape
    group = int(node.attr("group", 1))
    sym = _symmetric(node)
    layer = nn.Conv2d(in_c_per_group * group, out_c, (kh, kw), stride=tuple(node.attr("strides", [1, 1])),
                      padding=sym or 0, dilation=tuple(node.attr("dilations", [1, 1])), groups=group,
                      bias=b is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.array(w)))
        if b is not None:
            layer.bias.copy_(torch.from_numpy(np.array(b)))
    return layer


def _linear_layer(weight_kn: np.ndarray, bias: np.ndarray | None) -> nn.Linear:
    k, n = weight_kn.shape
    layer = nn.Linear(k, n, bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.array(weight_kn.T, order="C")))
        if bias is not None:
            layer.bias.copy_(torch.from_numpy(np.array(bias)))
    return layer


class IRTorchModule(nn.Module):
    """A torch module that computes exactly what the IR graph computes.

    ``forward`` returns the logits when the graph ends in Softmax (so training
    can use a numerically stable cross-entropy), else the graph output.
    """

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        if len(graph.inputs) != 1 or len(graph.outputs) != 1:
            raise UnsupportedOpError("training needs a graph with exactly one input and one output")
        self.input_name = graph.inputs[0].name
        self.output_name = graph.outputs[0].name
        self.nodes = list(graph.nodes)
        self.layers = nn.ModuleDict()
        self.weight_map: dict[str, tuple[str, str, bool]] = {}  # ir name -> (layer key, param, transposed)
        consts: dict[str, np.ndarray] = {}
        inits = graph.initializers
        for index, node in enumerate(self.nodes):
            key = f"n{index}"
            layer = self._make_layer(node, inits, key)
            if layer is not None:
                self.layers[key] = layer
        for name, array in inits.items():
            if name not in self.weight_map:
                consts[name] = array
        self._consts = {k: torch.from_numpy(np.array(v)) for k, v in consts.items()}
        producer = {o: n for n in self.nodes for o in n.outputs}
        last = producer.get(self.output_name)
        self.logits_name = last.inputs[0] if last is not None and last.op_type == "Softmax" else self.output_name

    def _make_layer(self, node: Node, inits, key: str) -> nn.Module | None:
        ins = list(node.inputs)
        if node.op_type == "Conv" and ins[1] in inits:
            bias = inits[ins[2]] if len(ins) > 2 and ins[2] in inits else None
            self.weight_map[ins[1]] = (key, "weight", False)
            if bias is not None:
                self.weight_map[ins[2]] = (key, "bias", False)
            return _conv_layer(node, inits[ins[1]], bias)
        plain_gemm = (node.attr("alpha", 1.0) == 1.0 and node.attr("beta", 1.0) == 1.0 and not node.attr("transA", 0))
        if node.op_type == "Gemm" and plain_gemm and ins[1] in inits:
            w = inits[ins[1]]
            w_kn = w.T if node.attr("transB", 0) else w
            bias = inits[ins[2]] if len(ins) > 2 and ins[2] in inits and inits[ins[2]].ndim == 1 else None
            self.weight_map[ins[1]] = (key, "weight", not node.attr("transB", 0))
            if bias is not None:
                self.weight_map[ins[2]] = (key, "bias", False)
            return _linear_layer(w_kn, bias)
        if node.op_type == "MatMul" and ins[1] in inits and inits[ins[1]].ndim == 2:
            self.weight_map[ins[1]] = (key, "weight", True)
            return _linear_layer(inits[ins[1]], None)
        if node.op_type not in _FUNCTIONS and node.op_type not in TRAINABLE_OPS:
            raise UnsupportedOpError(
                f"{node.describe()}: op {node.op_type} has no training lowering; trainable graphs may use "
                f"{', '.join(sorted(set(_FUNCTIONS) | set(TRAINABLE_OPS)))}"
            )
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = dict(self._consts)
        env[self.input_name] = x
        for index, node in enumerate(self.nodes):
            key = f"n{index}"
            if key in self.layers:
                arg = env[node.inputs[0]]
                if node.op_type == "Conv" and _symmetric(node) is None:
                    arg = _pad_input(node, arg)
                env[node.outputs[0]] = self.layers[key](arg)
            else:
                args = [env[i] if i else None for i in node.inputs]
                env[node.outputs[0]] = _FUNCTIONS[node.op_type](node, *args)
            if node.outputs[0] == self.logits_name:
                return env[self.logits_name]
        return env[self.output_name]

    def ir_weights(self) -> dict[str, np.ndarray]:
        """Trained parameters under their IR initializer names, in IR layout (float32)."""
        out: dict[str, np.ndarray] = {}
        for name, (key, param, transposed) in self.weight_map.items():
            value = getattr(self.layers[key], param).detach().cpu().numpy()
            out[name] = np.ascontiguousarray(value.T if transposed else value).astype(np.float32)
        return out


def _maxpool(node: Node, x):
    sym = _symmetric(node)
    if sym is None:
        x, sym = _pad_input(node, x, float("-inf")), (0, 0)
    return F.max_pool2d(x, tuple(node.attr("kernel_shape")), tuple(node.attr("strides", [1, 1])), sym,
                        tuple(node.attr("dilations", [1, 1])), ceil_mode=bool(node.attr("ceil_mode", 0)))


def _avgpool(node: Node, x):
    sym = _symmetric(node)
    if sym is None:
        raise UnsupportedOpError(f"{node.describe()}: asymmetric AveragePool padding is not trainable yet")
    return F.avg_pool2d(x, tuple(node.attr("kernel_shape")), tuple(node.attr("strides", [1, 1])), sym,
                        ceil_mode=bool(node.attr("ceil_mode", 0)),
                        count_include_pad=bool(node.attr("count_include_pad", 0)))


def _flatten(node: Node, x):
    axis = int(node.attr("axis", 1))
    axis = axis + x.dim() if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis])) if axis else 1
    return x.reshape(lead, -1)


def _reshape(node: Node, x, shape):
    target = [int(s) for s in shape.tolist()]
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if s == 0 else s for i, s in enumerate(target)]
    return x.reshape(target)


def _softmax(node: Node, x):
    if node.version < 13:
        axis = int(node.attr("axis", 1))
        shape = x.shape
        flat = x.reshape(int(np.prod(shape[:axis])), -1)
        return F.softmax(flat, dim=1).reshape(shape)
    return F.softmax(x, dim=int(node.attr("axis", -1)))


def _gemm(node: Node, a, b, c=None):
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    y = node.attr("alpha", 1.0) * (a @ b)
    return y if c is None else y + node.attr("beta", 1.0) * c


_FUNCTIONS: dict[str, Callable] = {
    "Relu": lambda node, x: F.relu(x),
    "MaxPool": _maxpool,
    "AveragePool": _avgpool,
    "GlobalAveragePool": lambda node, x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True),
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Softmax": _softmax,
    "Identity": lambda node, x: x,
    "Add": lambda node, a, b: a + b,
    "Mul": lambda node, a, b: a * b,
    "MatMul": lambda node, a, b: a @ b,
    "Gemm": _gemm,
}
