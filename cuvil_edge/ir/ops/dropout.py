"""Dropout in inference: y = x.  The optional mask follows onnxruntime: zeros
of x's dtype at opsets 7-9, all False at 10-11, all True from 12 (where ratio
and training_mode became inputs).  Training mode is refused: training_mode
must be absent or a constant False.  Opset 6 (is_test attribute) is not
supported: onnxruntime has no kernel for it either; upgrade the model."""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import FLOATS, want
from cuvil_edge.ir.ops._util import need, template_function

OP_TYPE = "Dropout"
VERSIONS = (7, 10, 12, 13, 22)  # 13, 22: bfloat16 / float8 only (not IR dtypes)
TYPES = ((7, FLOATS),)
BOOL = ((7, frozenset({"bool"})),)
CONST_INPUTS = (2,)


def _mask_kind(node):
    return 0 if node.version < 10 else 1 if node.version < 12 else 2


def _refuse_training(node, training=None, known=True):
    if not known or (training is not None and bool(np.asarray(training).reshape(-1)[0])):
        raise UnsupportedAttributeError(
            f"{node.describe()} runs in training mode (training_mode {'is not a constant' if not known else 'True'}); "
            "only inference is supported: export the model in eval mode")


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=2 if node.version >= 12 else 0)
    want(node, inputs[0], TYPES)
    if len(inputs) > 1 and inputs[1] is not None:
        want(node, inputs[1], TYPES, "ratio")
    if len(inputs) > 2 and inputs[2] is not None:
        want(node, inputs[2], BOOL, "training_mode")
        _refuse_training(node, (consts or {}).get(2), known=2 in (consts or {}))
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
    _refuse_training(node, training)
    return [x, k_dropout_mask(x, _mask_kind(node))]


def emit(node, args, outs):
    lines = [f"{outs[0]} = {args[0]}"]
    if len(outs) > 1 and outs[1] != "_":
        lines.append(f"{outs[1]} = k_dropout_mask({args[0]}, {_mask_kind(node)})")
    return "\n".join(lines)
