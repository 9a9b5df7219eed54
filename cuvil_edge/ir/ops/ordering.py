"""Comparisons that include equality, one table row each (the op contract: ``_contract.py``):
GreaterOrEqual and LessOrEqual (opset 12; 16 adds bfloat16, not an IR dtype). They broadcast
like the other comparisons and give bool.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, INTS, infer_binary

ORDERED = ((12, FLOATS | INTS),)


def k_greater_or_equal(a, b):
    return np.asarray(np.greater_equal(a, b))


def k_less_or_equal(a, b):
    return np.asarray(np.less_equal(a, b))


def _infer_compare(node, inputs):
    return infer_binary(node, inputs, ORDERED, out_dtype="bool")


OPS = (
    OpDef("GreaterOrEqual", (12, 16), _infer_compare, k_greater_or_equal, per_element(1)),
    OpDef("LessOrEqual", (12, 16), _infer_compare, k_less_or_equal, per_element(1)),
)
