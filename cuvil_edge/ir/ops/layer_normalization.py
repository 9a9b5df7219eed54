"""LayerNormalization (opset 17): normalise over axes axis..rank-1, then Y = norm * Scale + B.
``stash_type`` 1 computes in float32 (otherwise the input dtype); the optional Mean and
InvStdDev outputs have the reduced shape (size-1 normalised axes) in the stash dtype."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import arg
from cuvil_edge.ir.ops._util import FLOAT, INT, axis_index, broadcast, need, template_function, want_dtype

OP_TYPE = "LayerNormalization"
VERSIONS = (17,)
ATTRS = {"axis": INT, "epsilon": FLOAT, "stash_type": INT}


def _attrs(node):
    stash = int(node.attr("stash_type", 1))
    if stash not in (1, 0) and stash != dtypes.ONNX_CODE.get("float64"):
        raise UnsupportedAttributeError(f"{node.describe()}: stash_type {stash} is not supported (1 = float32)")
    return int(node.attr("axis", -1)), float(node.attr("epsilon", 1e-5)), stash


def infer(node, inputs):
    need(node, inputs, 2, optional=1)
    x = inputs[0]
    want_dtype(node, x, dtypes.FLOATS)
    axis, _, stash = _attrs(node)
    axis = axis_index(node, axis, x.rank)
    for what, t in zip(("Scale", "B"), inputs[1:]):
        if t is not None and (t.dtype != x.dtype or broadcast(node, x.shape, t.shape) != x.shape):
            raise ShapeInferenceError(f"{node.describe()}: {what} {t} must be {x.dtype} and broadcast to X {x}")
    stat_dtype = dtypes.FROM_ONNX_CODE[stash] if stash else x.dtype
    stats = TensorType(stat_dtype, x.shape[:axis] + (1,) * (x.rank - axis))
    return [x, stats, stats][:max(1, len(node.outputs))]


def flops(node, inputs, outputs):
    return 8 * inputs[0].numel()  # mean, centre, square, mean, scale, shift


TEMPLATE = '''
def k_layer_normalization(x, scale, bias, axis, epsilon, stash):
    if axis < 0:
        axis += x.ndim
    work = x.astype(stash) if stash is not None else x
    axes = tuple(range(axis, x.ndim))
    mean = work.mean(axis=axes, keepdims=True)
    centred = work - mean
    inv = 1 / np.sqrt((centred * centred).mean(axis=axes, keepdims=True) + epsilon)
    y = (centred * inv).astype(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv
'''

k_layer_normalization = template_function(TEMPLATE, "k_layer_normalization")


def _stash(node):
    stash = _attrs(node)[2]
    return dtypes.FROM_ONNX_CODE[stash] if stash else None


def kernel(node, x, scale, bias=None):
    axis, epsilon, _ = _attrs(node)
    return list(k_layer_normalization(x, scale, bias, axis, epsilon, _stash(node)))[:max(1, len(node.outputs))]


def emit(node, args, outs):
    axis, epsilon, _ = _attrs(node)
    targets = ", ".join(list(outs) + ["_"] * (3 - len(outs)))
    return (f"{targets} = k_layer_normalization({args[0]}, {args[1]}, {arg(args, 2)}, {axis}, "
            f"float({str(epsilon)!r}), {_stash(node)!r})")
