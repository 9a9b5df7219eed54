"""Training losses, one table row each (the op contract: ``_contract.py``):
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss. Classes are on axis 1 of the input
([N, C] or [N, C, d1, ...]); targets equal to ``ignore_index`` weigh 0; ``mean`` divides by the
sum of the weights used. float16 is computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import INT, STR, choice, need

TARGETS = frozenset({"int32", "int64"})


def _picked_loss(log_probs, target, weight, ignore_index, reduction):
    """-log_probs[n, target[n, ...], ...] weighted and reduced (shared by both losses)."""
    labels = target.astype(np.int64)
    ignored = labels == ignore_index if ignore_index is not None else np.zeros(labels.shape, dtype=bool)
    safe = np.where(ignored, 0, labels)
    picked = -np.take_along_axis(log_probs, safe[:, None], axis=1)[:, 0]
    weights = np.ones(labels.shape, log_probs.dtype) if weight is None else weight.astype(log_probs.dtype)[safe]
    weights = np.where(ignored, log_probs.dtype.type(0), weights)
    loss = picked * weights
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(np.sum(loss))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.sum(loss) / np.sum(weights))


def k_negative_log_likelihood_loss(x, target, weight=None, *, ignore_index, reduction):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    return _picked_loss(w, target, weight, ignore_index, reduction).astype(x.dtype)


def k_softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index, reduction, outputs):
    w = scores.astype(np.float32) if scores.dtype == np.float16 else scores
    shifted = w - np.max(w, axis=1, keepdims=True)
    log_probs = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    loss = _picked_loss(log_probs, labels, weights, ignore_index, reduction).astype(scores.dtype)
    if outputs == 1:
        return loss
    return loss, log_probs.astype(scores.dtype)


# --- inference and attributes -----------------------------------------------------------------
def _infer_loss(node, inputs):
    need(node, inputs, 2, 1)
    x, target = inputs[:2]
    weight = inputs[2] if len(inputs) > 2 else None
    want(node, x, ((12, FLOATS),))
    if target.dtype not in TARGETS:
        raise ShapeInferenceError(f"{node.describe()}: the target must be int32 or int64, got {target}")
    if (
        x.rank < 2
        or target.rank != x.rank - 1
        or target.shape[0] != x.shape[0]
        or tuple(target.shape[1:]) != tuple(x.shape[2:])
    ):
        raise ShapeInferenceError(f"{node.describe()}: the target {target} must be the input {x} without axis 1")
    if weight is not None and (weight.dtype != x.dtype or weight.rank != 1 or weight.shape[0] != x.shape[1]):
        raise ShapeInferenceError(
            f"{node.describe()}: the weight must be a {x.dtype} vector of {x.shape[1]}, got {weight}"
        )
    reduced = TensorType(x.dtype, tuple(target.shape) if _loss_attrs(node)["reduction"] == "none" else ())
    return [reduced, x]


def _loss_attrs(node):
    ignore = node.attr("ignore_index")
    return {
        "ignore_index": None if ignore is None else int(ignore),
        "reduction": choice(node, "reduction", "mean", ("none", "sum", "mean")),
    }


def _loss_flops(node, inputs, outputs):
    return (TRANSCENDENTAL * 2 + 4) * inputs[0].numel()


ATTRS = {"ignore_index": INT, "reduction": STR}

OPS = (
    OpDef(
        "NegativeLogLikelihoodLoss",
        (12, 13, 22),
        infer=lambda node, inputs: _infer_loss(node, inputs)[:1],
        fn=k_negative_log_likelihood_loss,
        flops=lambda node, inputs, outputs: 3 * inputs[1].numel(),
        attrs=_loss_attrs,
        helpers=(_picked_loss,),
        ATTRS=ATTRS,
    ),
    OpDef(
        "SoftmaxCrossEntropyLoss",
        (12, 13),
        infer=_infer_loss,
        fn=k_softmax_cross_entropy_loss,
        flops=_loss_flops,
        attrs=lambda node: {**_loss_attrs(node), "outputs": len(node.outputs)},
        helpers=(_picked_loss,),
        ATTRS=ATTRS,
    ),
)
