"""Sum: elementwise sum of one or more inputs, added left to right.  Opset 6
needs equal shapes; from 8 the inputs broadcast."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._elementwise import FLOATS, broadcast_all, want
from cuvil_edge.ir.ops._util import same_dtype, template_function

OP_TYPE = "Sum"
VERSIONS = (6, 8, 13)  # 13 adds bfloat16 only (not an IR dtype)
TYPES = ((6, FLOATS),)


def infer(node, inputs):
    if not inputs or any(t is None for t in inputs):
        raise ShapeInferenceError(f"{node.describe()} needs at least one input and no empty ones")
    dtype = same_dtype(node, inputs)
    want(node, inputs[0], TYPES)
    if node.version < 8 and len({t.shape for t in inputs}) > 1:
        raise ShapeInferenceError(f"{node.describe()} at opset {node.version} needs inputs of one shape, "
                                  f"got {[str(t) for t in inputs]}; broadcasting needs opset 8")
    return [TensorType(dtype, broadcast_all(node, [t.shape for t in inputs]))]


def flops(node, inputs, outputs):
    return (len(inputs) - 1) * outputs[0].numel()


TEMPLATE = '''
def k_sum(*xs):
    y = xs[0]
    with np.errstate(all="ignore"):
        for x in xs[1:]:
            y = np.add(y, x)
    return np.asarray(y)
'''

k_sum = template_function(TEMPLATE, "k_sum")


def kernel(node, *xs):
    return [k_sum(*xs)]


def emit(node, args, outs):
    return f"{outs[0]} = k_sum({', '.join(args)})"
