"""Normalisations over spatial axes or channel groups, one table row each (the op contract:
``_contract.py``): InstanceNormalization, GroupNormalization (the normalisation DP-SGD models use,
since Opacus refuses BatchNorm) and LRN. float16 is computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import FLOAT, INT, need, same_dtype


def k_instance_normalization(x, scale, bias, epsilon):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    axes = tuple(range(2, x.ndim))
    mean = w.mean(axis=axes, keepdims=True)
    var = np.square(w - mean).mean(axis=axes, keepdims=True)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    out = (w - mean) / np.sqrt(var + w.dtype.type(epsilon)) * scale.reshape(per_channel) + bias.reshape(per_channel)
    return out.astype(x.dtype)


def k_group_normalization(x, scale, bias, epsilon, num_groups, per_channel_affine):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    groups = w.reshape(x.shape[0], num_groups, -1)
    mean = groups.mean(axis=2, keepdims=True)
    var = np.square(groups - mean).mean(axis=2, keepdims=True)
    normed = ((groups - mean) / np.sqrt(var + w.dtype.type(epsilon))).reshape(x.shape)
    if not per_channel_affine:  # opset 18: one scale and bias per group
        scale, bias = np.repeat(scale, x.shape[1] // num_groups), np.repeat(bias, x.shape[1] // num_groups)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    return (normed * scale.reshape(per_channel) + bias.reshape(per_channel)).astype(x.dtype)


def k_lrn(x, size, alpha, beta, bias):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    before = (size - 1) // 2  # channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
    padded = np.pad(np.square(w), [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2))
    channels = x.shape[1]
    window = sum(padded[:, i:i + channels] for i in range(size))
    t = w.dtype.type
    return (w / (t(bias) + t(alpha / size) * window) ** t(beta)).astype(x.dtype)


def _check_nc(node, x):
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs an input of rank >= 2 (N, C, ...), got {x}")


def _infer_affine(count_of):
    """X, scale, bias; scale and bias are vectors of ``count_of(node, x)`` entries."""
    def infer(node, inputs):
        need(node, inputs, 3)
        x, scale, bias = inputs
        same_dtype(node, inputs)
        want(node, x, ((1, FLOATS),))
        _check_nc(node, x)
        n = count_of(node, x)
        for name, t in (("scale", scale), ("bias", bias)):
            if t.rank != 1 or (isinstance(t.shape[0], int) and isinstance(n, int) and t.shape[0] != n):
                raise ShapeInferenceError(f"{node.describe()}: {name} must be a vector of {n}, got {t}")
        return [x]
    return infer


def _groups(node):
    groups = node.attr("num_groups")
    if not isinstance(groups, int) or groups < 1:
        raise ShapeInferenceError(f"{node.describe()} needs a positive num_groups attribute, got {groups!r}")
    return groups


def _group_count(node, x):
    groups = _groups(node)
    if isinstance(x.shape[1], int) and x.shape[1] % groups:
        raise ShapeInferenceError(f"{node.describe()}: {x.shape[1]} channels do not split into {groups} groups")
    return x.shape[1] if node.version >= 21 else groups


def _infer_lrn(node, inputs):
    need(node, inputs, 1)
    want(node, inputs[0], ((1, FLOATS),))
    _check_nc(node, inputs[0])
    size = node.attr("size")
    if not isinstance(size, int) or size < 1:
        raise ShapeInferenceError(f"{node.describe()} needs a positive size attribute, got {size!r}")
    return [inputs[0]]


def _per_element(cost):
    def flops(node, inputs, outputs):
        return cost * outputs[0].numel()
    return flops


def _lrn_flops(node, inputs, outputs):
    return (2 * int(node.attr("size", 1)) + TRANSCENDENTAL + 3) * outputs[0].numel()


OPS = (
    OpDef("InstanceNormalization", (1, 6, 22), _infer_affine(lambda node, x: x.shape[1]), k_instance_normalization,
          _per_element(8), lambda node: {"epsilon": float(node.attr("epsilon", 1e-5))}, ATTRS={"epsilon": FLOAT}),
    OpDef("GroupNormalization", (18, 21), _infer_affine(_group_count), k_group_normalization, _per_element(8),
          lambda node: {"epsilon": float(node.attr("epsilon", 1e-5)), "num_groups": _groups(node),
                        "per_channel_affine": node.version >= 21},
          ATTRS={"epsilon": FLOAT, "num_groups": INT, "stash_type": INT}),
    OpDef("LRN", (1, 13), _infer_lrn, k_lrn, _lrn_flops,
          lambda node: {"size": int(node.attr("size")), "alpha": float(node.attr("alpha", 1e-4)),
                        "beta": float(node.attr("beta", 0.75)), "bias": float(node.attr("bias", 1.0))},
          ATTRS={"size": INT, "alpha": FLOAT, "beta": FLOAT, "bias": FLOAT}),
)
