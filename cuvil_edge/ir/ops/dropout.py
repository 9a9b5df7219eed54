"""Dropout in inference: y = x.  The optional mask follows onnxruntime: zeros
of x's dtype at opsets 7-9, all False at 10-11, all True from 12 (where ratio
and training_mode became inputs).  training_mode and ratio must be constants
(CONST_INPUTS: the ONNX backend binds them when a model feeds them as graph
inputs); training with ratio 0 drops nothing and is the identity (mask all
True); training with ratio > 0 is random and refused.  Opset 6 (is_test
attribute) is not supported: onnxruntime has no kernel for it either; upgrade
the model."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._util import FLOAT, INT, need, template_function

OP_TYPE = "Dropout"
VERSIONS = (7, 10, 12, 13, 22)  # 13, 22: bfloat16 / float8 only (not IR dtypes)
ATTRS = {"ratio": FLOAT, "seed": INT}
TYPES = ((7, FLOATS),)
BOOL = ((7, frozenset({"bool"})),)
CONST_INPUTS = (1, 2)


class TrainingModeNotConstantError(ShapeInferenceError, UnsupportedAttributeError):
    """training_mode (or, in training, ratio) is not a constant: unsupported as such, and a
    ShapeInferenceError so that the ONNX backend binds the fed value and imports again."""


def _mask_kind(node):
    return 0 if node.version < 10 else 1 if node.version < 12 else 2


def _scalar(value):
    return np.asarray(value).reshape(-1)[0]


def _refuse_training(node, training=None, known=True, ratio=None, ratio_known=True):
    """Raise unless the node is an identity: not training, or training with a constant ratio of 0."""
    if not known:
        raise TrainingModeNotConstantError(
            f"{node.describe()} may run in training mode (training_mode is not a constant); "
            "only inference is supported: export the model in eval mode")
    if training is None or not bool(_scalar(training)):
        return
    if not ratio_known:
        raise TrainingModeNotConstantError(
            f"{node.describe()} runs in training mode with a ratio that is not a constant; "
            "only inference (or training with ratio 0) is supported: export the model in eval mode")
    value = 0.5 if ratio is None else float(_scalar(ratio))
    if value != 0.0:
        raise UnsupportedAttributeError(
            f"{node.describe()} runs in training mode (training_mode True, ratio {value}): random dropout is not "
            "supported, only inference or training with ratio 0: export the model in eval mode")


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=2 if node.version >= 12 else 0)
    want(node, inputs[0], TYPES)
    for index, what in ((1, "ratio"), (2, "training_mode")):
        t = inputs[index] if len(inputs) > index else None
        if t is not None and not (t.is_static and t.numel() == 1):
            raise ShapeInferenceError(f"{node.describe()}: {what} must be a scalar, got {t}")
    if len(inputs) > 1 and inputs[1] is not None:
        want(node, inputs[1], TYPES, "ratio")
    if len(inputs) > 2 and inputs[2] is not None:
        want(node, inputs[2], BOOL, "training_mode")
        consts = consts or {}
        has_ratio = len(inputs) > 1 and inputs[1] is not None
        _refuse_training(node, consts.get(2), known=2 in consts, ratio=consts.get(1), ratio_known=not has_ratio or 1 in consts)
    mask = inputs[0].dtype if _mask_kind(node) == 0 else "bool"
    return [inputs[0], TensorType(mask, inputs[0].shape)]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_dropout_mask(x, kind):
    if kind == 0:
        return np.zeros(x.shape, dtype=x.dtype)
    return np.full(x.shape, kind == 2)
'''

k_dropout_mask = template_function(TEMPLATE, "k_dropout_mask")


def kernel(node, x, ratio=None, training=None):
    _refuse_training(node, training, ratio=ratio)
    return [x, k_dropout_mask(x, _mask_kind(node))]


def emit(node, args, outs):
    lines = [f"{outs[0]} = {args[0]}"]
    if len(outs) > 1 and outs[1] != "_":
        lines.append(f"{outs[1]} = k_dropout_mask({args[0]}, {_mask_kind(node)})")
    return "\n".join(lines)
