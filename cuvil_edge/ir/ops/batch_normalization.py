"""BatchNormalization, inference form: y = (x - mean) / sqrt(var + epsilon) * scale + B with the
running mean/var inputs at every version.  training_mode=1 (opset 14+) and the training-only
outputs are rejected.  Opset 7 ``spatial=0`` takes per-(C, *spatial) parameters."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import need, template_function, want_dtype

OP_TYPE = "BatchNormalization"
VERSIONS = (7, 9, 14, 15)


def infer(node, inputs):
    need(node, inputs, 5)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    if int(node.attr("training_mode", 0)):
        raise UnsupportedAttributeError(f"{node.describe()}: training_mode=1 is not supported; export the model in eval mode")
    if len([o for o in node.outputs if o]) > 1:
        raise UnsupportedAttributeError(
            f"{node.describe()} asks for the training outputs (running/saved mean and var), which are not supported; "
            "export the model in eval mode")
    if x.rank < 2:
        raise ShapeInferenceError(f"{node.describe()} needs X of shape (N, C, ...), got {x}")
    per_channel = (x.shape[1],) if node.version >= 9 or int(node.attr("spatial", 1)) else x.shape[1:]
    for name, t in zip(("scale", "B", "mean", "var"), inputs[1:]):
        want_dtype(node, t, dtypes.FLOATS)
        if t.shape != per_channel and t.shape != (x.shape[1],):
            raise ShapeInferenceError(f"{node.describe()}: {name} {t} must have shape {per_channel}")
    return [x]


def flops(node, inputs, outputs):
    return 2 * outputs[0].numel()


TEMPLATE = '''
def k_batch_normalization(x, scale, bias, mean, var, epsilon):
    shape = scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    inv = (scale / np.sqrt(var + epsilon)).astype(x.dtype)
    shift = (bias - mean * inv).astype(x.dtype)
    return x * inv.reshape(shape) + shift.reshape(shape)
'''

k_batch_normalization = template_function(TEMPLATE, "k_batch_normalization")


def _epsilon(node):
    return float(node.attr("epsilon", 1e-5))


def kernel(node, x, scale, bias, mean, var):
    return [k_batch_normalization(x, scale, bias, mean, var, _epsilon(node))]


def emit(node, args, outs):
    return f"{outs[0]} = k_batch_normalization({', '.join(args[:5])}, float({str(_epsilon(node))!r}))"
