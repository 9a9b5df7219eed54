"""Turn an IR graph into a trainable torch module (for local DP-SGD only).

Nodes whose weights are float32 initializers become the torch layers Opacus computes per-sample
gradients for with its standard grad samplers:

    Conv (1-3-D, grouped, depthwise; CuvilFusedConv)          ⇒  nn.Conv1d/2d/3d (+ its activation)
    Gemm (alpha 1, no transA), MatMul (CuvilFusedGemm, CuvilFusedMatMul)  ⇒  nn.Linear
    InstanceNormalization                                     ⇒  nn.GroupNorm(C, C)
    GroupNormalization 21 / 18 (one scale per group)          ⇒  nn.GroupNorm(G, C) / nn.GroupNorm(G, G) on (N, G, -1)
    torch's GroupNorm export: Reshape(x, (0, G, -1)) → InstanceNormalization(scale 1, bias 0)
        → Reshape(·, shape of x) [→ Mul(·, w)] [→ Add(·, b)]  ⇒  nn.GroupNorm(G, C), weight w, bias b
    LayerNormalization                                        ⇒  nn.LayerNorm
    torch's LayerNorm export below opset 17: ReduceMean(x) → Sub(x, ·) → Pow(·, 2) → ReduceMean
        → Add(·, eps) → Sqrt → Div [→ Mul(·, w)] [→ Add(·, b)]  ⇒  nn.LayerNorm, weight w, bias b
    MatMul(x, W) → Add(·, b)                                  ⇒  nn.Linear with bias b

A weight may be an initializer or a pure reshape of one (Identity, Reshape, Unsqueeze, Squeeze,
Flatten): torch's exporter shares equal parameters that way, and layers reading one initializer
share one torch parameter (tied, as in the IR; export with ``training=TrainingMode.TRAINING`` or
non-default weights to keep equal parameters apart). Every other node runs as a torch function
(:mod:`torch_functions`) and the initializers it reads stay constant: a layer scale or PRelu
slope, BatchNormalization, Gemm with alpha != 1 or transA, a computed weight. An initializer a
layer trains that a function also reads is refused, since Opacus' per-sample gradients would miss
that use. Only nodes the logits need run. After training, :meth:`IRTorchModule.ir_weights` maps
the trained parameters back to the IR's initializer names and layouts.

torch is imported here (and in :mod:`torch_functions`) and nowhere else on the agent side; the
inference path (verify -> build -> run) never imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from cuvil_edge.agent.torch_functions import activation, check, lowered_ops, lowering, trainable_ops
from cuvil_edge.errors import UnsupportedOpError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.ops._torch import torch_pads, window_pads


@dataclass(frozen=True)
class _Step:
    """One call in ``forward``: ``fn(node, *tensors)``, or ``fn(node, layer, *tensors)`` for a layer."""

    node: Node
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: Callable[..., Any]
    key: str | None = None


@dataclass(frozen=True)
class _Bound:
    """An initializer trained as ``param``: layer layout = view (transposed if so) reshaped."""

    param: nn.Parameter
    transposed: bool
    view_shape: tuple[int, ...]
    init_shape: tuple[int, ...]


class IRTorchModule(nn.Module):
    """A torch module that computes exactly what the IR graph computes.

    ``forward`` returns the logits when the graph ends in Softmax (so training
    can use a numerically stable cross-entropy), else the graph output.

    Raises:
        UnsupportedOpError: an op without a training lowering (named with its node), or a graph
            that is not one input -> one output.
    """

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        if len(graph.inputs) != 1 or len(graph.outputs) != 1:
            raise UnsupportedOpError("training needs a graph with exactly one input and one output")
        self.input_name = graph.inputs[0].name
        self.output_name = graph.outputs[0].name
        self._graph = graph
        self._producer = graph.producer()
        self._readers: dict[str, list[Node]] = {}
        for node in graph.nodes:
            for name in node.inputs:
                self._readers.setdefault(name, []).append(node)
        self._source = _initializer_views(graph)
        self._bound: dict[str, _Bound] = {}
        self._absorbed: set[int] = set()  # ids of nodes a layer computes with another node
        self.layers = nn.ModuleDict()
        last = self._producer.get(self.output_name)
        self.logits_name = last.inputs[0] if last is not None and last.op_type == "Softmax" else self.output_name
        self._steps = self._plan()
        trained = {name for name in self._source if self._source[name] in self._bound}
        for step in self._steps:
            used = [name for name in step.inputs if name in trained]
            if used:
                raise UnsupportedOpError(
                    f"{step.node.describe()}: reads {used[0]!r}, a weight trained in a layer elsewhere; per-sample "
                    "gradients would miss this use, so the graph is not trainable as exported"
                )
        self._consts = {k: torch.from_numpy(np.array(v)) for k, v in graph.initializers.items() if k not in self._bound}

    # --- planning ------------------------------------------------------------------------
    def _plan(self) -> list[_Step]:
        steps: list[tuple[int, _Step]] = []
        for index, node in enumerate(self._graph.nodes):  # torch's exports of GroupNorm and LayerNorm
            pattern = {"InstanceNormalization": self._torch_group_norm, "ReduceMean": self._torch_layer_norm}
            step = pattern[node.op_type](node, f"n{index}") if node.op_type in pattern else None
            if step is not None:  # placed where its input exists; its readers follow its last node
                first = self._producer.get(node.inputs[0]) if node.op_type == "InstanceNormalization" else node
                steps.append((self._graph.nodes.index(first), step))
        for index, node in enumerate(self._graph.nodes):
            if id(node) in self._absorbed:
                continue
            check(node)
            declared = ops.registry().get(node.op_type)
            kind = declared.trainable if declared is not None else None
            builder = _LAYERS.get(kind) if kind is not None else None
            step = builder(self, node, f"n{index}") if builder is not None else None
            if step is None:
                function = lowering(node.op_type)
                if function is None:
                    raise UnsupportedOpError(
                        f"{node.describe()}: op {node.op_type} has no training lowering; trainable graphs may use "
                        f"{', '.join(sorted(lowered_ops() | trainable_ops()))}"
                    )
                step = _Step(node, node.inputs, node.outputs, function)
            steps.append((index, step))
        steps.sort(key=lambda pair: pair[0])
        needed, live = {self.logits_name}, []
        for _, step in reversed(steps):  # only what the logits need runs
            if needed & set(step.outputs):
                live.append(step)
                needed |= {name for name in step.inputs if name}
        return live[::-1]

    def _view(self, name: str) -> np.ndarray | None:
        """The float32 value of ``name`` when it is an initializer or a pure reshape of one."""
        source = self._source.get(name) if name else None
        if source is None or self._graph.initializers[source].dtype != np.float32:
            return None
        return np.asarray(self._graph.initializers[source]).reshape(self._graph.types[name].shape)  # type: ignore[arg-type]  # a weight's shape is static

    def _bind(self, layer: nn.Module, attr: str, name: str, transposed: bool = False) -> None:
        """Make ``layer.<attr>`` the trained parameter of ``name`` (checked by :meth:`_view` first)."""
        source, view = self._source[name], self._view(name)
        if view is None:  # callers check with _view first; a new caller that does not is refused here
            raise UnsupportedOpError(f"{name!r} is not a float32 weight (or a reshape of one) that training can bind")
        current: nn.Parameter = getattr(layer, attr)
        init_shape = tuple(self._graph.initializers[source].shape)
        bound = self._bound.get(source)
        if bound is not None:
            if bound.param.shape != current.shape or bound.transposed != transposed:
                raise UnsupportedOpError(
                    f"initializer {source!r} is used by two layers in different layouts; "
                    "export the model without sharing that weight"
                )
            setattr(layer, attr, bound.param)
            return
        with torch.no_grad():
            current.copy_(torch.from_numpy(np.array((view.T if transposed else view).reshape(current.shape))))
        self._bound[source] = _Bound(current, transposed, tuple(view.shape), init_shape)

    def _sole_reader(self, name: str) -> Node | None:
        readers = self._readers.get(name, [])
        keep = name in (self.output_name, self.logits_name)
        return readers[0] if len(readers) == 1 and not keep else None

    def _torch_group_norm(self, node: Node, key: str) -> _Step | None:
        """torch's GroupNorm export around the InstanceNormalization ``node``, as one nn.GroupNorm."""
        types, inits = self._graph.types, self._graph.initializers
        pre = self._producer.get(node.inputs[0])
        if pre is None or pre.op_type != "Reshape" or self._sole_reader(pre.outputs[0]) is not node:
            return None
        x, grouped = types[pre.inputs[0]].shape, types[pre.outputs[0]].shape
        scale, bias = (inits.get(name) for name in node.inputs[1:3])
        if (
            len(x) < 2
            or not isinstance(x[1], int)
            or len(grouped) != 3
            or grouped[0] != x[0]
            or scale is None
            or bias is None
            or not isinstance(grouped[1], int)
            or x[1] % grouped[1]
            or not (np.all(scale == 1) and np.all(bias == 0))
        ):
            return None
        post = self._sole_reader(node.outputs[0])
        if post is None or post.op_type != "Reshape" or types[post.outputs[0]].shape != x:
            return None
        layer = nn.GroupNorm(grouped[1], x[1], eps=float(node.attr("epsilon", 1e-5)))
        out = self._absorb_affine(layer, [pre, node, post], lambda view: _is_vector(view, x[1], len(x), 1), key)  # type: ignore[arg-type]  # static channels
        return _Step(node, (pre.inputs[0],), (out,), _call, key)

    def _absorb_affine(
        self, layer: nn.Module, nodes: list[Node], fits: Callable[[np.ndarray | None], bool], key: str
    ) -> str:
        """Fold Mul(·, w) and Add(·, b) after ``nodes`` into ``layer``'s weight and bias where they
        follow and ``fits`` them; absorb ``nodes`` and register ``layer``. Returns the last output."""
        affine, tail = {}, nodes[-1]
        for op, attr in (("Mul", "weight"), ("Add", "bias")):
            after = self._sole_reader(tail.outputs[0])
            other = _operand(self, after, tail, op, fits)
            if other is not None and after is not None:  # _operand gives None for no reader
                affine[attr], tail = other, after
                nodes.append(after)
        self._absorbed |= {id(n) for n in nodes}
        for attr in ("weight", "bias"):
            if attr in affine:
                self._bind(layer, attr, affine[attr])
            else:
                _freeze(layer, attr, 1.0 if attr == "weight" else 0.0)
        self.layers[key] = layer
        return tail.outputs[0]

    def _torch_layer_norm(self, node: Node, key: str) -> _Step | None:
        """torch's LayerNorm export below opset 17, from the ReduceMean ``node``, as one nn.LayerNorm:
        ReduceMean(x) → Sub(x, ·) → Pow(·, 2) → ReduceMean → Add(·, eps) → Sqrt → Div(x - mean, ·)
        [→ Mul(·, w)] [→ Add(·, b)]."""
        x, inits = node.inputs[0], self._graph.initializers
        shape, axes = self._graph.types[x].shape, _reduced_axes(node, self._graph)
        sub = self._sole_reader(node.outputs[0])
        if axes is None or sub is None or sub.op_type != "Sub" or sub.inputs != (x, node.outputs[0]):
            return None
        readers = {n.op_type: n for n in self._readers.get(sub.outputs[0], [])}
        if (
            set(readers) != {"Pow", "Div"}
            or len(self._readers[sub.outputs[0]]) != 2
            or sub.outputs[0] in (self.output_name, self.logits_name)
        ):
            return None
        chain = [readers["Pow"]]
        for op in ("ReduceMean", "Add", "Sqrt", "Div"):
            after = self._sole_reader(chain[-1].outputs[0])
            if after is None or after.op_type != op:
                return None
            chain.append(after)
        pow_, mean, add, _, div = chain
        eps = _scalar(inits.get(add.inputs[1] if add.inputs[0] == mean.outputs[0] else add.inputs[0]))
        normalized = tuple(shape[len(shape) - len(axes) :])
        if (
            div is not readers["Div"]
            or div.inputs[0] != sub.outputs[0]
            or _scalar(inits.get(pow_.inputs[1])) != 2
            or eps is None
            or _reduced_axes(mean, self._graph) != axes
            or axes != tuple(range(len(shape) - len(axes), len(shape)))
            or not all(isinstance(d, int) for d in normalized)
        ):
            return None
        out = self._absorb_affine(
            nn.LayerNorm(normalized, eps=eps),
            [node, sub, *chain],
            lambda view: _trails(view, normalized, len(shape)),  # type: ignore[arg-type]  # static dims
            key,
        )
        return _Step(node, (x,), (out,), _call, key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, Any] = dict(self._consts)
        env[self.input_name] = x
        for step in self._steps:
            args = [env[name] if name else None for name in step.inputs]
            out = step.fn(step.node, self.layers[step.key], *args) if step.key else step.fn(step.node, *args)
            for name, value in zip(step.outputs, out if isinstance(out, tuple) else (out,), strict=False):
                if name:
                    env[name] = value
        return env[self.logits_name]

    def ir_weights(self) -> dict[str, np.ndarray]:
        """Trained parameters under their IR initializer names, in IR layout (float32)."""
        out: dict[str, np.ndarray] = {}
        for name, bound in self._bound.items():
            value = bound.param.detach().cpu().numpy()
            if bound.transposed:
                value = value.reshape(bound.view_shape[::-1]).T
            out[name] = np.array(value.reshape(bound.init_shape), dtype=np.float32, order="C")  # a copy
        return out


def _initializer_views(graph: Graph) -> dict[str, str]:
    """Value name -> the initializer it is (a pure reshape of) when its shape is static: a weight
    read through a view op (its ``view`` facet) is still that initializer, as torch's exporter
    shares equal parameters."""
    source = {name: name for name in graph.initializers}
    for node in graph.nodes:
        settings = all(not name or name in graph.initializers for name in node.inputs[1:])
        if (
            ops.get(node.op_type, node.describe()).view
            and node.inputs
            and node.inputs[0] in source
            and settings
            and graph.types[node.outputs[0]].is_static
        ):
            source[node.outputs[0]] = source[node.inputs[0]]
    return source


def _operand(
    module: IRTorchModule, after: Node | None, before: Node, op: str, fits: Callable[[np.ndarray | None], bool]
) -> str | None:
    """The other operand of ``after`` (an ``op`` reading ``before``'s output) when it is a weight that ``fits``."""
    if after is None or after.op_type != op or len(after.inputs) != 2:
        return None
    other = after.inputs[1] if after.inputs[0] == before.outputs[0] else after.inputs[0]
    return other if fits(module._view(other)) else None


def _trails(view: np.ndarray | None, shape: tuple[int, ...], rank: int) -> bool:
    """``view`` broadcast to rank ``rank`` varies exactly along the trailing axes of ``shape``."""
    if view is None or view.ndim > rank:
        return False
    padded = (1,) * (rank - view.ndim) + view.shape
    return padded[rank - len(shape) :] == shape and all(d == 1 for d in padded[: rank - len(shape)])


def _scalar(value: np.ndarray | None) -> float | None:
    return None if value is None or np.size(value) != 1 else float(np.asarray(value).reshape(-1)[0])


def _is_vector(view: np.ndarray | None, size: int, rank: int, axis: int) -> bool:
    if view is None or view.size != size or view.ndim > rank:
        return False
    return size == 1 or ((1,) * (rank - view.ndim) + view.shape)[axis] == size


def _call(node: Node, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def _reduced_axes(node: Node, graph: Graph) -> tuple[int, ...] | None:
    """The sorted, non-negative axes a ReduceMean keeping its dims reduces (None: unknown or all)."""
    rank = len(graph.types[node.inputs[0]].shape)
    axes = (
        node.attr("axes")
        if node.version < 18
        else (graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None)
    )
    if axes is None or not int(node.attr("keepdims", 1)) or np.size(axes) == 0:
        return None
    return tuple(sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)))


def _freeze(layer: nn.Module, attr: str, value: float) -> None:
    """A constant ``attr`` (Opacus' LayerNorm sampler needs a bias to exist)."""
    param = getattr(layer, attr)
    with torch.no_grad():
        param.fill_(value)
    param.requires_grad_(False)


# --- layers ---------------------------------------------------------------------------------
def _conv_layer(module: IRTorchModule, node: Node, key: str) -> _Step | None:
    weight = module._view(node.inputs[1])
    if weight is None or not 3 <= weight.ndim <= 5:
        return None
    out_c, in_c, *kernel = weight.shape
    group, n = int(node.attr("group", 1)), len(kernel)
    has_bias = len(node.inputs) > 2 and module._view(node.inputs[2]) is not None
    pads = list(node.attr("pads") or [0] * (2 * n))
    symmetric = node.attr("auto_pad", "NOTSET") == "NOTSET" and pads[:n] == pads[n:]  # else padded per call
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[n - 1]
    layer = conv(
        in_c * group,
        out_c,
        tuple(kernel),
        stride=tuple(node.attr("strides") or (1,) * n),
        padding=tuple(pads[:n]) if symmetric else 0,
        dilation=tuple(node.attr("dilations") or (1,) * n),
        groups=group,
        bias=has_bias,
    )
    module._bind(layer, "weight", node.inputs[1])
    if has_bias:
        module._bind(layer, "bias", node.inputs[2])
    module.layers[key] = layer
    extra = node.inputs[2:3] if len(node.inputs) > 2 and not has_bias else ()
    return _Step(node, (node.inputs[0], *extra), node.outputs, _conv_forward, key)


def _conv_forward(node: Node, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    pads = [] if any(layer.padding) else window_pads(node, x.shape[2:], layer.kernel_size, layer.stride, layer.dilation)  # type: ignore[arg-type]  # a conv layer
    y = layer(F.pad(x, torch_pads(pads)) if any(any(p) for p in pads) else x)
    if bias is not None:
        y = y + bias.reshape(1, -1, *(1,) * (y.dim() - 2))
    return activation(node)(y)


def _linear_layer(module: IRTorchModule, node: Node, key: str) -> _Step | None:
    gemm = _kind(node) == "gemm"
    weight = module._view(node.inputs[1])
    if weight is None or weight.ndim != 2 or (gemm and (node.attr("alpha", 1.0) != 1.0 or node.attr("transA", 0))):
        return None
    transposed = not (gemm and node.attr("transB", 0))
    k, n = weight.shape if transposed else weight.shape[::-1]
    c, tail = node.inputs[2] if len(node.inputs) > 2 else "", node
    has_bias = bool(c) and node.attr("beta", 1.0) == 1.0 and _is_vector(module._view(c), n, 2, -1)
    if not gemm and not c and node.attr("activation", "none") == "none":
        # MatMul → Add(·, bias): torch's export of a Linear on a batch of sequences
        rank = len(module._graph.types[node.outputs[0]].shape)
        after = module._sole_reader(node.outputs[0])
        c = _operand(module, after, node, "Add", lambda view: _is_vector(view, n, rank, -1)) or ""
        if c and after is not None:  # _operand gives "" for no reader
            has_bias, tail = True, after
            module._absorbed.add(id(after))
    layer = nn.Linear(k, n, bias=has_bias)
    module._bind(layer, "weight", node.inputs[1], transposed)
    if has_bias:
        module._bind(layer, "bias", c)
    module.layers[key] = layer
    return _Step(node, (node.inputs[0], "" if has_bias else c), tail.outputs, _linear_forward, key)


def _linear_forward(node: Node, layer: nn.Module, a: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    y = layer(a)
    return activation(node)(y if c is None else y + node.attr("beta", 1.0) * c)


def _norm_layer(module: IRTorchModule, node: Node, key: str) -> _Step | None:
    scale, bias = module._view(node.inputs[1]), module._view(node.inputs[2])
    x = module._graph.types[node.inputs[0]].shape
    if scale is None or bias is None or not isinstance(x[1], int):
        return None
    eps = float(node.attr("epsilon", 1e-5))
    if _kind(node) == "instance_norm":
        layer, fn = nn.GroupNorm(x[1], x[1], eps=eps), _call
    else:  # group_norm
        groups = int(node.attr("num_groups"))
        if node.version >= 21:
            layer, fn = nn.GroupNorm(groups, x[1], eps=eps), _call
        else:
            layer, fn = nn.GroupNorm(groups, groups, eps=eps), _per_group
    module._bind(layer, "weight", node.inputs[1])
    module._bind(layer, "bias", node.inputs[2])
    module.layers[key] = layer
    return _Step(node, node.inputs[:1], node.outputs, fn, key)


def _per_group(node: Node, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    groups: int = layer.num_groups  # type: ignore[assignment]  # an nn.GroupNorm
    return layer(x.reshape(x.shape[0], groups, math.prod(x.shape[1:]) // groups)).reshape(x.shape)


def _layer_norm_layer(module: IRTorchModule, node: Node, key: str) -> _Step | None:
    _only_first_output(module, node)
    x = module._graph.types[node.inputs[0]].shape
    shape = x[int(node.attr("axis", -1)) % len(x) :]
    scale = module._view(node.inputs[1])
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    bias = module._view(node.inputs[2]) if has_bias else None
    if (
        not all(isinstance(d, int) for d in shape)
        or scale is None
        or scale.size != math.prod(shape)
        or (has_bias and (bias is None or bias.size != scale.size))
    ):
        return None
    layer = nn.LayerNorm(tuple(shape), eps=float(node.attr("epsilon", 1e-5)))
    module._bind(layer, "weight", node.inputs[1])
    if has_bias:
        module._bind(layer, "bias", node.inputs[2])
    else:
        _freeze(layer, "bias", 0.0)
    module.layers[key] = layer
    return _Step(node, node.inputs[:1], node.outputs[:1], _call, key)


def _only_first_output(module: IRTorchModule, node: Node) -> None:
    if any(module._readers.get(name) for name in node.outputs[1:] if name):
        raise UnsupportedOpError(f"{node.describe()}: only its first output has a training lowering")


def _kind(node: Node) -> str | None:
    """The node's ``trainable`` facet (the layer builders below are chosen by it)."""
    return ops.registry()[node.op_type].trainable


#: The layer builder of each ``trainable`` kind (``_contract.TRAINABLE_KINDS``).
_LAYERS: dict[str, Callable[[IRTorchModule, Node, str], _Step | None]] = {
    "conv": _conv_layer,
    "gemm": _linear_layer,
    "matmul": _linear_layer,
    "instance_norm": _norm_layer,
    "group_norm": _norm_layer,
    "layer_norm": _layer_norm_layer,
}
