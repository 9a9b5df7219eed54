"""Transformer ops of opset 23+, one table row each (the op contract: ``_contract.py``):
Attention (scaled dot-product attention with masks, causal and sliding windows, a KV cache,
grouped-query heads, softcap) and RotaryEmbedding.

Attention follows the ONNX reference step by step (the semantics of its node tests, which
onnxruntime passes): Q and K are each scaled by sqrt(scale); softcap is applied to Q·Kᵀ before
the additive bias; a query row whose bias is -inf everywhere gets zero probabilities (Y = 0);
``qk_matmul_output`` holds Q·Kᵀ after softcap (modes 0 and 1), plus the bias (mode 2), or the
probabilities (mode 3). float16 is computed in float32 and rounded once. The kernel returns as
many outputs as the node declares (``outputs``), so a compiled call site assigns exactly those.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import FLOAT, INT, need

MASKS = FLOATS | {"bool"}


def k_attention(
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    q_num_heads,
    kv_num_heads,
    scale,
    is_causal,
    softcap,
    qk_mode,
    softmax_dtype,
    left_window,
    right_window,
    outputs,
):
    t = np.float32 if q.dtype == np.float16 else q.dtype.type
    if q.ndim == 3:  # (batch, sequence, heads * head size) -> (batch, heads, sequence, head size)
        q4 = q.reshape(q.shape[0], q.shape[1], q_num_heads, -1).transpose(0, 2, 1, 3)
        k4 = k.reshape(k.shape[0], k.shape[1], kv_num_heads, -1).transpose(0, 2, 1, 3)
        v4 = v.reshape(v.shape[0], v.shape[1], kv_num_heads, -1).transpose(0, 2, 1, 3)
    else:
        q4, k4, v4 = q, k, v
    present_key = k4 if past_key is None else np.concatenate((past_key, k4), axis=2)
    present_value = v4 if past_value is None else np.concatenate((past_value, v4), axis=2)
    steps, total = q4.shape[2], present_key.shape[2]
    bias = np.zeros((steps, total), dtype=t)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            mask = np.where(attn_mask, t(0), t(-np.inf))
        else:
            mask = attn_mask.astype(t)
        if mask.shape[-1] < total:  # a short mask is padded with "masked"
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, total - mask.shape[-1])], constant_values=-np.inf)
        bias = bias + mask
    if is_causal or left_window >= 0 or right_window >= 0:
        if past_key is None and nonpad_kv_seqlen is not None:  # external cache: a frontier per batch row
            offset = (nonpad_kv_seqlen.astype(np.int64) - steps).reshape(-1, 1, 1, 1)
        else:
            offset = 0 if past_key is None else past_key.shape[2]
        ahead = np.arange(steps).reshape(-1, 1) + offset - np.arange(total)  # query position - key position
        allowed = np.ones(ahead.shape, dtype=bool)
        if is_causal:
            allowed &= ahead >= 0
        if left_window >= 0:
            allowed &= ahead <= left_window
        if right_window >= 0:
            allowed &= -ahead <= right_window
        bias = bias + np.where(allowed, t(0), t(-np.inf))
    if nonpad_kv_seqlen is not None:
        valid = np.arange(total) < nonpad_kv_seqlen.reshape(-1, 1)
        bias = bias + np.where(valid, t(0), t(-np.inf)).reshape(-1, 1, 1, total)
    keys, values = present_key.astype(t), present_value.astype(t)
    if q4.shape[1] != keys.shape[1]:  # grouped-query attention: each KV head serves consecutive Q heads
        keys = np.repeat(keys, q4.shape[1] // keys.shape[1], axis=1)
        values = np.repeat(values, q4.shape[1] // values.shape[1], axis=1)
    root = t(np.sqrt(1 / np.sqrt(q4.shape[3]) if scale is None else scale))
    scores = np.matmul(q4.astype(t) * root, np.swapaxes(keys * root, 2, 3))
    if softcap > 0:
        scores = t(softcap) * np.tanh(scores / t(softcap))
    logits = scores + bias
    wide = logits if softmax_dtype is None else logits.astype(softmax_dtype)
    top = np.max(wide, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), wide.dtype.type(0), top)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(wide - top)
    total_e = np.sum(e, axis=-1, keepdims=True)
    probs = e / np.where(total_e == 0, wide.dtype.type(1), total_e)
    blocked = np.isneginf(np.max(bias, axis=-1, keepdims=True))  # no attendable key in this row
    probs = np.where(blocked, wide.dtype.type(0), probs).astype(t)
    y = np.matmul(probs, values)
    if q.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)
    qk = probs if qk_mode == 3 else (logits if qk_mode == 2 else scores)
    if outputs == 1:
        return y.astype(q.dtype)
    return (y.astype(q.dtype), present_key, present_value, qk.astype(q.dtype))[:outputs]


def k_rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, rotary_dim, num_heads):
    t = np.float32 if x.dtype == np.float16 else x.dtype.type
    if x.ndim == 4:  # (batch, heads, sequence, head size) -> (batch, sequence, heads, head size)
        heads = x.transpose(0, 2, 1, 3).astype(t)
    else:
        heads = x.reshape(x.shape[0], x.shape[1], num_heads, -1).astype(t)
    width = rotary_dim if rotary_dim else heads.shape[3]
    cos = (cos_cache if position_ids is None else cos_cache[position_ids]).astype(t)[..., None, :]
    sin = (sin_cache if position_ids is None else sin_cache[position_ids]).astype(t)[..., None, :]
    rotated = heads[..., :width]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:
        x1, x2 = rotated[..., : width // 2], rotated[..., width // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        turned = np.stack((real, imag), axis=-1).reshape(rotated.shape)
    else:
        turned = np.concatenate((real, imag), axis=-1)
    out = np.concatenate((turned, heads[..., width:]), axis=-1)
    out = out.reshape(x.shape) if x.ndim == 3 else out.transpose(0, 2, 1, 3)
    return np.asarray(out.astype(x.dtype))


# --- inference and attributes -----------------------------------------------------------------
def _div(node, dim, parts, what):
    if isinstance(dim, str):
        raise ShapeInferenceError(f"{node.describe()}: {what} must be static to split it into {parts} heads")
    if parts < 1 or dim % parts:
        raise ShapeInferenceError(f"{node.describe()}: {what} {dim} does not split into {parts} heads")
    return dim // parts


def _add(node, a, b, what):
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    raise ShapeInferenceError(f"{node.describe()}: {what} lengths {a} and {b} must be static to concatenate them")


def _same(node, a, b, what):
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ShapeInferenceError(f"{node.describe()}: {what} differ ({a} vs {b})")


def _heads4(node, q, k, v, attrs):
    """(batch, q heads, steps, head size), (kv heads, kv steps, head size), value head size."""
    if q.rank == 3:
        if attrs["q_num_heads"] is None or attrs["kv_num_heads"] is None:
            raise ShapeInferenceError(
                f"{node.describe()}: 3-D Q, K, V need the q_num_heads and kv_num_heads attributes"
            )
        hq, hk = attrs["q_num_heads"], attrs["kv_num_heads"]
        qd = (q.shape[0], hq, q.shape[1], _div(node, q.shape[2], hq, "Q's hidden size"))
        kd = (k.shape[0], hk, k.shape[1], _div(node, k.shape[2], hk, "K's hidden size"))
        vd = (v.shape[0], hk, v.shape[1], _div(node, v.shape[2], hk, "V's hidden size"))
    else:
        qd, kd, vd = q.shape, k.shape, v.shape
    _same(node, qd[3], kd[3], "Q and K head sizes")
    _same(node, kd[2], vd[2], "K and V sequence lengths")
    _same(node, kd[1], vd[1], "K and V head counts")
    if isinstance(qd[1], int) and isinstance(kd[1], int) and (kd[1] < 1 or qd[1] % kd[1]):
        raise ShapeInferenceError(f"{node.describe()}: {qd[1]} query heads do not group over {kd[1]} key/value heads")
    return qd, kd, vd


def _infer_attention(node, inputs):
    need(node, inputs, 3, 4 if node.version >= 24 else 3)
    q, k, v = inputs[:3]
    mask, past_key, past_value, nonpad = (list(inputs[3:]) + [None] * 4)[:4]
    for name, t in (("Q", q), ("K", k), ("V", v), ("past_key", past_key), ("past_value", past_value)):
        if t is not None:
            want(node, t, ((23, FLOATS),), name)
            if t.dtype != q.dtype:
                raise ShapeInferenceError(
                    f"{node.describe()}: {name} is {t.dtype}, Q is {q.dtype}; cast them to one dtype"
                )
    if q.rank not in (3, 4) or k.rank != q.rank or v.rank != q.rank:
        raise ShapeInferenceError(f"{node.describe()}: Q, K and V must all be 3-D or all 4-D, got {q}, {k}, {v}")
    attrs = _attention_attrs(node)
    if (
        q.rank == 4
        and (node.attr("q_num_heads") is not None or node.attr("kv_num_heads") is not None)
        and node.version >= 25
    ):
        raise ShapeInferenceError(f"{node.describe()}: q_num_heads and kv_num_heads are for 3-D inputs only")
    qd, kd, vd = _heads4(node, q, k, v, attrs)
    past = 0
    if (past_key is None) != (past_value is None):
        raise ShapeInferenceError(f"{node.describe()}: past_key and past_value must be given together")
    if past_key is not None:
        if nonpad is not None:
            raise ShapeInferenceError(
                f"{node.describe()}: nonpad_kv_seqlen cannot be combined with past_key/past_value"
            )
        if past_key.rank != 4 or past_value.rank != 4:
            raise ShapeInferenceError(f"{node.describe()}: past_key and past_value must be 4-D")
        _same(node, past_key.shape[3], kd[3], "past_key and K head sizes")
        _same(node, past_value.shape[3], vd[3], "past_value and V head sizes")
        past = past_key.shape[2]
    total = _add(node, past, kd[2], "past and new key")
    if mask is not None:
        want(node, mask, ((23, MASKS),), "attn_mask")
        if mask.rank < 1 or mask.rank > 4:
            raise ShapeInferenceError(f"{node.describe()}: attn_mask must have rank 1 to 4, got {mask}")
    if nonpad is not None and (nonpad.dtype != "int64" or nonpad.rank != 1):
        raise ShapeInferenceError(f"{node.describe()}: nonpad_kv_seqlen must be an int64 vector, got {nonpad}")
    if q.rank == 3:
        y = TensorType(q.dtype, (qd[0], qd[2], qd[1] * vd[3] if isinstance(vd[3], int) else vd[3]))
    else:
        y = TensorType(q.dtype, (qd[0], qd[1], qd[2], vd[3]))
    present_k = TensorType(q.dtype, (kd[0], kd[1], total, kd[3]))
    present_v = TensorType(q.dtype, (vd[0], vd[1], total, vd[3]))
    return [y, present_k, present_v, TensorType(q.dtype, (qd[0], qd[1], qd[2], total))]


def _opt_int(node, key):
    value = node.attr(key)
    return None if value is None else int(value)


def _attention_attrs(node):
    mode = int(node.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise UnsupportedAttributeError(f"{node.describe()}: qk_matmul_output_mode must be 0 to 3, got {mode}")
    precision = node.attr("softmax_precision")
    if precision is not None and dtypes.FROM_ONNX_CODE.get(int(precision)) not in FLOATS:
        raise UnsupportedAttributeError(f"{node.describe()}: softmax_precision {precision} is not float16/32/64")
    scale = node.attr("scale")
    windows = node.version >= 25
    left, right = (int(node.attr(key, -1)) if windows else -1 for key in ("left_window_size", "right_window_size"))
    if left < -1 or right < -1:
        raise UnsupportedAttributeError(f"{node.describe()}: window sizes must be -1 or >= 0, got {left}, {right}")
    return {
        "q_num_heads": _opt_int(node, "q_num_heads"),
        "kv_num_heads": _opt_int(node, "kv_num_heads"),
        "scale": None if scale is None else float(scale),
        "is_causal": int(node.attr("is_causal", 0)),
        "softcap": float(node.attr("softcap", 0.0)),
        "qk_mode": mode,
        "softmax_dtype": None if precision is None else dtypes.FROM_ONNX_CODE[int(precision)],
        "left_window": left,
        "right_window": right,
        "outputs": len(node.outputs),
    }


def _attention_sizes(outputs):
    y, present_k, present_v, qk = outputs[:4]
    batch_heads_steps_total = qk.numel()
    return (
        batch_heads_steps_total,
        present_k.shape[3] if present_k.is_static else 1,
        present_v.shape[3] if present_v.is_static else 1,
    )


def _attention_macs(node, inputs, outputs):
    cells, head, value_head = _attention_sizes(outputs)
    return cells * (head + value_head)


def _attention_flops(node, inputs, outputs):
    cells, head, value_head = _attention_sizes(outputs)
    return 2 * cells * (head + value_head) + (TRANSCENDENTAL + 4) * cells


def _infer_rotary(node, inputs):
    need(node, inputs, 3, 1)
    x, cos, sin = inputs[:3]
    positions = inputs[3] if len(inputs) > 3 else None
    want(node, x, ((23, frozenset({"float16", "float32"})),))
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ShapeInferenceError(f"{node.describe()}: cos_cache and sin_cache must be {x.dtype} like X")
    if x.rank not in (3, 4):
        raise ShapeInferenceError(f"{node.describe()}: X must be 3-D or 4-D, got {x}")
    attrs = _rotary_attrs(node)
    if x.rank == 3:
        if not attrs["num_heads"]:
            raise ShapeInferenceError(f"{node.describe()}: a 3-D X needs the num_heads attribute")
        head = _div(node, x.shape[2], attrs["num_heads"], "X's hidden size")
    else:
        head = x.shape[3]
    width = attrs["rotary_dim"] or head
    if isinstance(width, int) and (width % 2 or (isinstance(head, int) and width > head)):
        raise ShapeInferenceError(f"{node.describe()}: rotary_embedding_dim {width} must be even and at most {head}")
    if cos.shape != sin.shape or (
        isinstance(width, int) and isinstance(cos.shape[-1], int) and cos.shape[-1] != width // 2
    ):
        raise ShapeInferenceError(f"{node.describe()}: cos_cache {cos} and sin_cache {sin} must end in {width}/2")
    if positions is not None and positions.dtype != "int64":
        raise ShapeInferenceError(f"{node.describe()}: position_ids must be int64, got {positions}")
    return [x]


def _rotary_attrs(node):
    return {
        "interleaved": int(node.attr("interleaved", 0)),
        "rotary_dim": int(node.attr("rotary_embedding_dim", 0)),
        "num_heads": int(node.attr("num_heads", 0)),
    }


OPS = (
    OpDef(
        "Attention",
        (23, 24, 25),
        infer=_infer_attention,
        fn=k_attention,
        flops=_attention_flops,
        attrs=_attention_attrs,
        ATTRS={
            "is_causal": INT,
            "kv_num_heads": INT,
            "q_num_heads": INT,
            "qk_matmul_output_mode": INT,
            "scale": FLOAT,
            "softcap": FLOAT,
            "softmax_precision": INT,
            "left_window_size": INT,
            "right_window_size": INT,
        },
        macs=_attention_macs,
    ),
    OpDef(
        "RotaryEmbedding",
        (23,),
        infer=_infer_rotary,
        fn=k_rotary_embedding,
        flops=lambda node, inputs, outputs: 3 * outputs[0].numel(),
        attrs=_rotary_attrs,
        ATTRS={"interleaved": INT, "rotary_embedding_dim": INT, "num_heads": INT},
    ),
)
