"""Swish (opset 24): x * sigmoid(alpha * x), the op contract's one-row form (``_contract.py``).
float16 is computed in float32 and rounded once; the sigmoid never overflows."""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, infer_unary
from cuvil_edge.ir.ops._util import FLOAT


def k_swish(x, alpha):
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    z = w * w.dtype.type(alpha)
    e = np.exp(-np.abs(z))
    return np.asarray((w * np.where(z >= 0, 1 / (1 + e), e / (1 + e))).astype(x.dtype))


OPS = (
    OpDef("Swish", (24,), lambda node, inputs: infer_unary(node, inputs, ((24, FLOATS),)), k_swish,
          per_element(TRANSCENDENTAL + 4), lambda node: {"alpha": float(node.attr("alpha", 1.0))},
          ATTRS={"alpha": FLOAT}),
)
