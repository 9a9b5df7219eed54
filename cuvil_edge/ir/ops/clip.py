"""Clip: y = min(max(x, min), max).  Before opset 11 the bounds are float
attributes (defaults: float32 lowest/highest); from 11 they are optional scalar
inputs (absent: unbounded); 12 adds integer dtypes.  min > max gives max."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.ops._elementwise import FLOATS, INTS, want
from cuvil_edge.ir.ops._util import FLOAT, need, same_dtype, template_function

OP_TYPE = "Clip"
VERSIONS = (6, 11, 12, 13)  # 13 adds bfloat16 only (not an IR dtype)
ATTRS = {"min": FLOAT, "max": FLOAT}
TYPES = ((6, FLOATS), (12, FLOATS | INTS))
FLOAT32_MAX = 3.4028234663852886e38


def infer(node, inputs):
    need(node, inputs, 1, optional=2 if node.version >= 11 else 0)
    same_dtype(node, inputs)
    want(node, inputs[0], TYPES)
    for bound in inputs[1:]:
        if bound is not None and not (bound.is_static and bound.numel() == 1 and bound.rank <= 1):
            raise ShapeInferenceError(f"{node.describe()}: min and max must be scalars, got {bound}")
    return [inputs[0]]


def flops(node, inputs, outputs):
    return outputs[0].numel()


TEMPLATE = '''
def k_clip(x, lo, hi):
    with np.errstate(all="ignore"):
        if lo is not None:
            x = np.maximum(x, np.asarray(lo).astype(x.dtype).reshape(()))
        if hi is not None:
            x = np.minimum(x, np.asarray(hi).astype(x.dtype).reshape(()))
    return np.asarray(x)
'''

k_clip = template_function(TEMPLATE, "k_clip")


def _attr_bounds(node):
    return float(node.attr("min", -FLOAT32_MAX)), float(node.attr("max", FLOAT32_MAX))


def kernel(node, x, lo=None, hi=None):
    if node.version < 11:
        lo, hi = _attr_bounds(node)
    return [k_clip(x, lo, hi)]


def emit(node, args, outs):
    if node.version < 11:
        lo, hi = (repr(b) for b in _attr_bounds(node))
    else:
        lo, hi = ((args[i] if len(args) > i and args[i] else "None") for i in (1, 2))
    return f"{outs[0]} = k_clip({args[0]}, {lo}, {hi})"
