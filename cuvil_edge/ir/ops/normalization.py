"""Normalisations, one table row each (the op contract: ``_contract.py``): BatchNormalization,
LayerNormalization, InstanceNormalization, GroupNormalization (the normalisation DP-SGD models use,
since Opacus refuses BatchNorm) and LRN. Instance/Group/LRN compute float16 in float32 and round
once; BatchNormalization computes in the input dtype, LayerNormalization in ``stash_type``.

BatchNormalization: y = (x - mean) / sqrt(var + epsilon) * scale + B. Inference form (every
version): mean/var are the running mean/var inputs. Opset 14+ training_mode=1: mean/var are the
batch statistics over every axis but 1 (population variance), and the optional outputs
running_mean / running_var are ``input * momentum + batch statistic * (1 - momentum)`` (momentum
default 0.9). The training outputs of opsets 7-9 (saved mean/var) and extra outputs without
training_mode are rejected. Opset 7 ``spatial=0`` takes per-(C, *spatial) parameters.

LayerNormalization (opset 17): normalise over axes axis..rank-1, then Y = norm * Scale + B.
``stash_type`` 1 computes in float32 (otherwise the input dtype); the optional Mean and InvStdDev
outputs have the reduced shape (size-1 normalised axes) in the stash dtype.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops import _torch
from cuvil_edge.ir.ops._contract import BatchRule, OpDef, Probe
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._native import _native_lib
from cuvil_edge.ir.ops._scratch import batch_norm_scratch, instance_norm_scratch, layer_norm_scratch, lrn_scratch
from cuvil_edge.ir.ops._util import (
    DEFAULT_CAPABILITIES,
    FLOAT,
    INT,
    axis_index,
    broadcast,
    need,
    required,
    same_dtype,
    want_dtype,
)

TARGET_NATIVE = DEFAULT_CAPABILITIES["TARGET_NATIVE"]


def k_batch_normalization(x, scale, bias, mean, var, epsilon, momentum=0.9, training=False, outputs=1):
    if training:  # normalise with the batch statistics (population variance), update the running ones
        axes = (0,) + tuple(range(2, x.ndim))
        wide = x.astype(np.float64)
        batch_mean, batch_var = wide.mean(axis=axes), wide.var(axis=axes)
        use_mean, use_var = batch_mean.astype(mean.dtype), batch_var.astype(var.dtype)
    else:
        use_mean, use_var = mean, var
    shape = scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    inv = (scale / np.sqrt(use_var + epsilon)).astype(x.dtype)
    shift = (bias - use_mean * inv).astype(x.dtype)
    y = x * inv.reshape(shape) + shift.reshape(shape)
    if not training:
        return y
    running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype)
    running_var = (var * momentum + batch_var * (1 - momentum)).astype(var.dtype)
    results = (y.astype(x.dtype, copy=False), running_mean, running_var)
    return results[0] if outputs == 1 else results[:outputs]


def k_layer_normalization(x, scale, bias=None, axis=-1, epsilon=1e-5, stash=None, outputs=1):
    first = axis + x.ndim if axis < 0 else axis
    if TARGET_NATIVE:
        size = 1
        for dim in x.shape[first:]:
            size *= dim
        ok = outputs == 1 and x.dtype == np.float32 and stash != "float64" and scale.size == size
        lib = _native_lib() if ok and (bias is None or bias.size == size) else None
        if lib is not None:
            # one pass per row in C (statistics summed in double), scale and bias applied there
            xc, sc = np.ascontiguousarray(x), np.ascontiguousarray(scale, dtype=np.float32)
            bc = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
            y = np.empty_like(xc)
            lib.cuvil_layer_norm_f32(
                xc.ctypes.data,
                sc.ctypes.data,
                None if bc is None else bc.ctypes.data,
                y.ctypes.data,
                x.size // max(size, 1),
                size,
                epsilon,
            )
            return y
    work = x.astype(stash, copy=False) if stash is not None else x
    axes = tuple(range(first, x.ndim))
    mean = work.mean(axis=axes, keepdims=True)
    centred = work - mean
    inv = 1 / np.sqrt((centred * centred).mean(axis=axes, keepdims=True) + epsilon)
    y = (centred * inv).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y if outputs == 1 else (y, mean, inv)[:outputs]


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
    window = sum(padded[:, i : i + channels] for i in range(size))
    t = w.dtype.type
    return (w / (t(bias) + t(alpha / size) * window) ** t(beta)).astype(x.dtype)


def _bn_training(node) -> bool:
    return node.version >= 14 and bool(int(node.attr("training_mode", 0)))


def _infer_batch_normalization(node, inputs):
    need(node, inputs, 5)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    training = _bn_training(node)
    if len([o for o in node.outputs if o]) > 1 and not training:
        raise UnsupportedAttributeError(
            f"{node.describe()} asks for the training outputs (running/saved mean and var), which are not supported; "
            "export the model in eval mode"
        )
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs X of shape (N, C, ...), got {x}")
    per_channel = (x.shape[1],) if node.version >= 9 or int(node.attr("spatial", 1)) else x.shape[1:]
    for name, t in zip(("scale", "B", "mean", "var"), inputs[1:], strict=True):
        want_dtype(node, t, dtypes.FLOATS)
        if t.shape != per_channel and t.shape != (x.shape[1],):
            raise ShapeInferenceError(f"{node.describe()}: {name} {t} must have shape {per_channel}")
    if training:
        if len(node.outputs) > 3:
            raise ShapeInferenceError(f"{node.describe()} declares {len(node.outputs)} outputs; training mode has 3")
        return [x, TensorType(inputs[3].dtype, inputs[3].shape), TensorType(inputs[4].dtype, inputs[4].shape)]
    return [x]


def _bn_attrs(node):
    return {
        "epsilon": float(node.attr("epsilon", 1e-5)),
        "momentum": float(node.attr("momentum", 0.9)),
        "training": _bn_training(node),
        "outputs": max(1, len(node.outputs)) if _bn_training(node) else 1,
    }


def _ln_attrs(node):
    stash = int(node.attr("stash_type", 1))
    if stash not in (1, 0) and stash != dtypes.ONNX_CODE.get("float64"):
        raise UnsupportedAttributeError(f"{node.describe()}: stash_type {stash} is not supported (1 = float32)")
    return {
        "axis": int(node.attr("axis", -1)),
        "epsilon": float(node.attr("epsilon", 1e-5)),
        "stash": dtypes.FROM_ONNX_CODE[stash] if stash else None,
        "outputs": max(1, len(node.outputs)),
    }


def _infer_layer_normalization(node, inputs):
    need(node, inputs, 2, optional=1)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    a = _ln_attrs(node)
    axis = axis_index(node, a["axis"], x.rank)
    for what, t in zip(("Scale", "B"), inputs[1:], strict=False):
        if t is not None and (t.dtype != x.dtype or broadcast(node, x.shape, t.shape) != x.shape):
            raise ShapeInferenceError(f"{node.describe()}: {what} {t} must be {x.dtype} and broadcast to X {x}")
    stats = TensorType(a["stash"] or x.dtype, x.shape[:axis] + (1,) * (x.rank - axis))
    return [x, stats, stats][: a["outputs"]]


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
    OpDef(
        "BatchNormalization",
        (7, 9, 14, 15),
        batch="batch_norm",
        infer=_infer_batch_normalization,
        fn=k_batch_normalization,
        flops=_per_element(2),
        attrs=_bn_attrs,
        ATTRS={"epsilon": FLOAT, "momentum": FLOAT, "spatial": INT, "training_mode": INT},
        torch=_torch.batch_norm,
        scratch=batch_norm_scratch,
        cost_kind="normalization affine",
    ),
    OpDef(
        "LayerNormalization",
        (17,),
        batch="layer_norm",
        infer=_infer_layer_normalization,
        fn=k_layer_normalization,
        flops=lambda node, inputs, outputs: 8 * inputs[0].numel(),  # mean, centre, square, mean, scale, shift
        attrs=_ln_attrs,
        helpers=(_native_lib,),
        ATTRS={"axis": INT, "epsilon": FLOAT, "stash_type": INT},
        torch=_torch.norm,
        trainable="layer_norm",
        scratch=layer_norm_scratch,
        cost_kind="normalization",
        cost_native="layer norm",
        # its C kernel's own kind; the numpy path's "normalization" is InstanceNormalization's probe
        probes=(
            Probe(
                (1, 16, 64),
                {"axis": -1},
                lambda: (np.ones(64, np.float32), np.zeros(64, np.float32)),
                kinds=("native layer norm",),
            ),
        ),
    ),
    OpDef(
        "InstanceNormalization",
        (1, 6, 22),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_affine(lambda node, x: x.shape[1]),
        fn=k_instance_normalization,
        flops=_per_element(8),
        attrs=lambda node: {"epsilon": float(node.attr("epsilon", 1e-5))},
        ATTRS={"epsilon": FLOAT},
        torch=_torch.norm,
        trainable="instance_norm",
        scratch=instance_norm_scratch,
        cost_kind="normalization",
        probes=(Probe((1, 16, 16, 16), consts=lambda: (np.ones(16, np.float32), np.zeros(16, np.float32))),),
    ),
    OpDef(
        "GroupNormalization",
        (18, 21),
        batch=BatchRule("windowed", sample_axes=(0,)),
        infer=_infer_affine(_group_count),
        fn=k_group_normalization,
        flops=_per_element(8),
        attrs=lambda node: {
            "epsilon": float(node.attr("epsilon", 1e-5)),
            "num_groups": _groups(node),
            "per_channel_affine": node.version >= 21,
        },
        ATTRS={"epsilon": FLOAT, "num_groups": INT, "stash_type": INT},
        torch=_torch.norm,
        trainable="group_norm",
        cost_kind="normalization",
    ),
    OpDef(
        "LRN",
        (1, 13),
        infer=_infer_lrn,
        fn=k_lrn,
        flops=_lrn_flops,
        attrs=lambda node: {
            "size": int(required(node, "size")),
            "alpha": float(node.attr("alpha", 1e-4)),
            "beta": float(node.attr("beta", 0.75)),
            "bias": float(node.attr("bias", 1.0)),
        },
        ATTRS={"size": INT, "alpha": FLOAT, "beta": FLOAT, "bias": FLOAT},
        torch=_torch.lrn,
        scratch=lrn_scratch,
        cost_kind="normalization window",
    ),
)
