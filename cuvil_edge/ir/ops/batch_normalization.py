"""BatchNormalization: y = (x - mean) / sqrt(var + epsilon) * scale + B.

Inference form (every version): mean/var are the running mean/var inputs.  Opset 14+
training_mode=1: mean/var are the batch statistics over every axis but 1 (population
variance), and the optional outputs running_mean / running_var are
``input * momentum + batch statistic * (1 - momentum)`` (momentum default 0.9).  The
training outputs of opsets 7-9 (saved mean/var) and extra outputs without training_mode are
rejected.  Opset 7 ``spatial=0`` takes per-(C, *spatial) parameters."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._util import FLOAT, INT, need, template_function, want_dtype

OP_TYPE = "BatchNormalization"
VERSIONS = (7, 9, 14, 15)
ATTRS = {"epsilon": FLOAT, "momentum": FLOAT, "spatial": INT, "training_mode": INT}


def infer(node, inputs):
    need(node, inputs, 5)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    training = _training(node)
    if len([o for o in node.outputs if o]) > 1 and not training:
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
    if training:
        if len(node.outputs) > 3:
            raise ShapeInferenceError(f"{node.describe()} declares {len(node.outputs)} outputs; training mode has 3")
        return [x, TensorType(inputs[3].dtype, inputs[3].shape), TensorType(inputs[4].dtype, inputs[4].shape)]
    return [x]


def _training(node) -> bool:
    return node.version >= 14 and bool(int(node.attr("training_mode", 0)))


def _momentum(node):
    return float(node.attr("momentum", 0.9))


def flops(node, inputs, outputs):
    return 2 * outputs[0].numel()


TEMPLATE = '''
def k_batch_normalization(x, scale, bias, mean, var, epsilon):
    shape = scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    inv = (scale / np.sqrt(var + epsilon)).astype(x.dtype)
    shift = (bias - mean * inv).astype(x.dtype)
    return x * inv.reshape(shape) + shift.reshape(shape)


def k_batch_normalization_training(x, scale, bias, mean, var, epsilon, momentum):
    """(Y, running_mean, running_var) normalising with the batch statistics."""
    axes = (0,) + tuple(range(2, x.ndim))
    wide = x.astype(np.float64)
    batch_mean = wide.mean(axis=axes)
    batch_var = wide.var(axis=axes)
    y = k_batch_normalization(x, scale, bias, batch_mean.astype(mean.dtype), batch_var.astype(var.dtype), epsilon)
    running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype)
    running_var = (var * momentum + batch_var * (1 - momentum)).astype(var.dtype)
    return y.astype(x.dtype, copy=False), running_mean, running_var
'''

k_batch_normalization = template_function(TEMPLATE, "k_batch_normalization")
k_batch_normalization_training = template_function(TEMPLATE, "k_batch_normalization_training")


def _epsilon(node):
    return float(node.attr("epsilon", 1e-5))


def kernel(node, x, scale, bias, mean, var):
    if _training(node):
        return list(k_batch_normalization_training(x, scale, bias, mean, var, _epsilon(node), _momentum(node)))
    return [k_batch_normalization(x, scale, bias, mean, var, _epsilon(node))]


def emit(node, args, outs):
    if _training(node):
        targets = ", ".join((list(outs) + ["_", "_"])[:3])
        return (f"{targets} = k_batch_normalization_training({', '.join(args[:5])}, float({str(_epsilon(node))!r}), "
                f"float({str(_momentum(node))!r}))")
    return f"{outs[0]} = k_batch_normalization({', '.join(args[:5])}, float({str(_epsilon(node))!r}))"
