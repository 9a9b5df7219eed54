"""Ops that carry a state from one call to the next (prefill, then decode steps), one table row
each (the op contract: ``_contract.py``): LinearAttention (opset 27: linear, gated, delta and
gated-delta update rules, grouped heads) and CausalConvWithState (opset 27: a depthwise causal
1-D convolution whose last k-1 inputs are the next call's state, optional SiLU).

Both compute in float32 and round once, as the ONNX reference does; CausalConvWithState rounds
the convolution to the input's dtype before its activation, as the reference does.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import FLOAT, INT, STR, choice, need

HALF_OR_SINGLE = frozenset({"float16", "float32"})


def k_linear_attention(
    query,
    key,
    value,
    past_state=None,
    decay=None,
    beta=None,
    *,
    q_num_heads,
    kv_num_heads,
    scale,
    gating,
    delta,
    outputs,
):
    b, steps = query.shape[0], query.shape[1]
    q = query.reshape(b, steps, q_num_heads, -1).transpose(0, 2, 1, 3).astype(np.float32)
    k = key.reshape(b, steps, kv_num_heads, -1).transpose(0, 2, 1, 3).astype(np.float32)
    v = value.reshape(b, steps, kv_num_heads, -1).transpose(0, 2, 1, 3).astype(np.float32)
    d_k, d_v = q.shape[3], v.shape[3]
    if gating:  # per head (.., kv_heads) or per key channel (.., kv_heads * d_k)
        g = decay.reshape(b, steps, kv_num_heads, -1).transpose(0, 2, 1, 3).astype(np.float32)
    if delta:
        rate = beta.reshape(b, steps, beta.shape[2], 1).transpose(0, 2, 1, 3).astype(np.float32)
    if past_state is None:
        state = np.zeros((b, kv_num_heads, d_k, d_v), np.float32)
    else:
        state = past_state.astype(np.float32)
    factor = np.float32(1 / np.sqrt(d_k) if scale == 0.0 else scale)
    group = q_num_heads // kv_num_heads
    out = np.zeros((b, q_num_heads, steps, d_v), np.float32)
    for i in range(steps):
        k_t, v_t = k[:, :, i, :], v[:, :, i, :]
        if gating:
            state = state * np.exp(g[:, :, i, :])[..., None]
        if delta:
            v_t = rate[:, :, i, :] * (v_t - np.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        read = state if group == 1 else np.repeat(state, group, axis=1)
        out[:, :, i, :] = factor * np.einsum("bhd,bhdm->bhm", q[:, :, i, :], read)
    y = out.transpose(0, 2, 1, 3).reshape(b, steps, q_num_heads * d_v).astype(query.dtype)
    if outputs == 1:
        return y
    return y, state.astype(query.dtype if past_state is None else past_state.dtype)


def k_causal_conv_with_state(x, weight, bias=None, past_state=None, *, silu, outputs):
    k = weight.shape[2]
    t = np.float32 if x.dtype == np.float16 else x.dtype.type
    pad = np.zeros(x.shape[:2] + (k - 1,), x.dtype) if past_state is None else past_state.astype(x.dtype)
    padded = np.concatenate([pad, x], axis=2)
    wide = padded.astype(t)
    conv = np.zeros(x.shape, t)
    for j in range(k):  # depthwise: one filter per channel
        conv = conv + weight[:, 0, j].astype(t).reshape(1, -1, 1) * wide[:, :, j : j + x.shape[2]]
    if bias is not None:
        conv = conv + bias.astype(t).reshape(1, -1, 1)
    y = conv.astype(x.dtype)
    if silu:
        z = y.astype(np.float32)
        e = np.exp(-np.abs(z))
        y = (z * np.where(z >= 0, 1 / (1 + e), e / (1 + e))).astype(x.dtype)
    if outputs == 1:
        return y
    return y, padded[:, :, padded.shape[2] - (k - 1) :]


# --- inference and attributes -----------------------------------------------------------------
def _linear_attrs(node):
    rule = choice(node, "update_rule", "gated_delta", ("linear", "gated", "delta", "gated_delta"))
    heads = [node.attr(key) for key in ("q_num_heads", "kv_num_heads")]
    if not all(isinstance(h, int) and h > 0 for h in heads) or heads[0] % heads[1]:
        raise ShapeInferenceError(
            f"{node.describe()}: q_num_heads {heads[0]} must be a positive multiple of kv_num_heads {heads[1]}"
        )
    return {
        "q_num_heads": heads[0],
        "kv_num_heads": heads[1],
        "scale": float(node.attr("scale", 0.0)),
        "gating": rule in ("gated", "gated_delta"),
        "delta": rule in ("delta", "gated_delta"),
        "outputs": len(node.outputs),
    }


def _split(node, dim, heads, what):
    if not isinstance(dim, int) or dim % heads:
        raise ShapeInferenceError(f"{node.describe()}: {what} {dim} must be static and split into {heads} heads")
    return dim // heads


def _infer_linear_attention(node, inputs):
    need(node, inputs, 3, 3)
    q, k, v = inputs[:3]
    past, decay, beta = (list(inputs[3:]) + [None] * 3)[:3]
    want(node, q, ((27, HALF_OR_SINGLE),), "query")
    attrs = _linear_attrs(node)
    hq, hk = attrs["q_num_heads"], attrs["kv_num_heads"]
    if any(t.rank != 3 or t.dtype != q.dtype for t in (k, v)) or q.rank != 3:
        raise ShapeInferenceError(f"{node.describe()}: query, key and value must be 3-D {q.dtype}, got {q}, {k}, {v}")
    d_k, d_v = _split(node, q.shape[2], hq, "query's hidden size"), _split(node, v.shape[2], hk, "value's hidden size")
    if _split(node, k.shape[2], hk, "key's hidden size") != d_k:
        raise ShapeInferenceError(f"{node.describe()}: query and key head sizes differ")
    for name, t, wanted in (("decay", decay, attrs["gating"]), ("beta", beta, attrs["delta"])):
        if (t is not None) != wanted:
            raise ShapeInferenceError(f"{node.describe()}: the update rule {'needs' if wanted else 'forbids'} {name}")
    if decay is not None and (decay.rank != 3 or decay.shape[2] not in (hk, hk * d_k)):
        raise ShapeInferenceError(f"{node.describe()}: decay must be [B, T, {hk} or {hk * d_k}], got {decay}")
    if beta is not None and (beta.rank != 3 or beta.shape[2] not in (hk, 1)):
        raise ShapeInferenceError(f"{node.describe()}: beta must be [B, T, {hk} or 1], got {beta}")
    state = (q.shape[0], hk, d_k, d_v)
    if past is not None and (
        past.rank != 4 or any(isinstance(a, int) and a != e for a, e in zip(past.shape, state, strict=True))
    ):
        raise ShapeInferenceError(f"{node.describe()}: past_state must be {list(state)}, got {past}")
    return [
        TensorType(q.dtype, (q.shape[0], q.shape[1], hq * d_v)),
        TensorType(past.dtype if past is not None else q.dtype, state),
    ]


def _linear_flops(node, inputs, outputs):
    y, state = outputs[:2]
    per_state = state.numel()
    steps = inputs[0].shape[1] if isinstance(inputs[0].shape[1], int) else 1
    return steps * 8 * per_state + 2 * y.numel() * (per_state // max(y.numel() // max(steps, 1), 1) + 1)


def _infer_causal_conv(node, inputs):
    need(node, inputs, 2, 2)
    x, w = inputs[:2]
    bias, past = (list(inputs[2:]) + [None] * 2)[:2]
    want(node, x, ((27, HALF_OR_SINGLE),))
    if (
        x.rank != 3
        or w.rank != 3
        or w.dtype != x.dtype
        or w.shape[1] != 1
        or (isinstance(w.shape[0], int) and isinstance(x.shape[1], int) and w.shape[0] != x.shape[1])
    ):
        raise ShapeInferenceError(f"{node.describe()}: input must be [B, C, L] and weight [C, 1, k], got {x}, {w}")
    k = w.shape[2]
    if not isinstance(k, int) or k < 1:
        raise ShapeInferenceError(f"{node.describe()}: the kernel size must be static and positive, got {w}")
    if bias is not None and (bias.rank != 1 or bias.dtype != x.dtype):
        raise ShapeInferenceError(f"{node.describe()}: bias must be a {x.dtype} vector, got {bias}")
    state = (x.shape[0], x.shape[1], k - 1)
    if past is not None and (
        past.rank != 3 or any(isinstance(a, int) and a != e for a, e in zip(past.shape, state, strict=True))
    ):
        raise ShapeInferenceError(f"{node.describe()}: past_state must be {list(state)}, got {past}")
    return [x, TensorType(x.dtype, state)]


def _causal_attrs(node):
    activation = choice(node, "activation", "none", ("none", "silu", "swish"))
    return {"silu": activation != "none", "outputs": len(node.outputs)}


def _causal_flops(node, inputs, outputs):
    k = inputs[1].shape[2] if isinstance(inputs[1].shape[2], int) else 1
    silu = _causal_attrs(node)["silu"]
    return (2 * k + (TRANSCENDENTAL + 4 if silu else 0)) * outputs[0].numel()


OPS = (
    OpDef(
        "LinearAttention",
        (27,),
        infer=_infer_linear_attention,
        fn=k_linear_attention,
        flops=_linear_flops,
        attrs=_linear_attrs,
        ATTRS={"chunk_size": INT, "kv_num_heads": INT, "q_num_heads": INT, "scale": FLOAT, "update_rule": STR},
    ),
    OpDef(
        "CausalConvWithState",
        (27,),
        infer=_infer_causal_conv,
        fn=k_causal_conv_with_state,
        flops=_causal_flops,
        attrs=_causal_attrs,
        ATTRS={"activation": STR},
    ),
)
