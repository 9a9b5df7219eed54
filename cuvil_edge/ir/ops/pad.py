"""Pad: ``pads`` (begin..., end...) as attribute before opset 11, else constant input 1; the
constant ``value`` is an attribute (< 11) or optional input 2; ``axes`` input 3 from opset 18;
modes constant, reflect, edge and wrap (opset 19).  Negative pads crop."""

from __future__ import annotations

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._shape import arg, attr_or_input, axes as norm_axes, vector
from cuvil_edge.ir.ops._util import FLOAT, INTS, STR, need, template_function, text

OP_TYPE = "Pad"
VERSIONS = (2, 11, 13, 18, 19, 21, 23, 24, 25)
ATTRS = {"mode": STR, "pads": INTS, "value": FLOAT}
CONST_INPUTS = (1, 3)


def _mode(node):
    mode = text(node, "mode", "constant")
    allowed = ("constant", "reflect", "edge") + (("wrap",) if node.version >= 19 else ())
    if mode not in allowed:
        raise UnsupportedAttributeError(f"{node.describe()}: mode {mode!r} is not supported at opset {node.version}; "
                                        f"supported: {', '.join(allowed)}")
    return mode


def infer(node, inputs, consts=None):
    need(node, inputs, 1, optional=0 if node.version < 11 else (2 if node.version < 18 else 3))
    x, mode = inputs[0], _mode(node)
    value = inputs[2] if len(inputs) > 2 else None
    if value is not None and (value.dtype != x.dtype or not (value.is_static and value.numel() <= 1)):
        raise ShapeInferenceError(f"{node.describe()}: constant_value {value} must be a {x.dtype} scalar like the data")
    pads = attr_or_input(node, consts, "pads", 1, 11, required=True)
    axes = vector(node, consts, 3, "axes", required=False) if node.version >= 18 else None
    axes = list(range(x.rank)) if axes is None else norm_axes(node, axes, x.rank)
    if pads is None or len(pads) != 2 * len(axes):
        raise ShapeInferenceError(f"{node.describe()}: pads {pads} must have 2 x {len(axes)} entries for {x}")
    out = list(x.shape)
    for i, axis in enumerate(axes):
        begin, end, dim = pads[i], pads[i + len(axes)], x.shape[axis]
        if begin == end == 0:
            continue
        if isinstance(dim, str):
            raise ShapeInferenceError(f"{node.describe()}: cannot pad symbolic axis {axis} ({dim!r}) of {x}")
        if dim + min(begin, 0) + min(end, 0) < 0 or (mode == "reflect" and max(begin, end) >= dim) or (mode != "constant" and dim == 0):
            raise ShapeInferenceError(f"{node.describe()}: pads {begin}, {end} do not fit axis {axis} of size {dim} in mode {mode}")
        out[axis] = dim + begin + end
    return [TensorType(x.dtype, tuple(out))]


def flops(node, inputs, outputs):
    return 0


TEMPLATE = '''
def k_pad(x, pads, value, axes, mode):
    pads = [int(p) for p in pads]
    axes = range(x.ndim) if axes is None or len(axes) == 0 else [int(a) + x.ndim if int(a) < 0 else int(a) for a in axes]
    widths, crop, k = [(0, 0)] * x.ndim, [slice(None)] * x.ndim, len(pads) // 2
    for i, axis in enumerate(axes):
        begin, end = pads[i], pads[i + k]
        widths[axis] = (max(begin, 0), max(end, 0))
        crop[axis] = slice(-min(begin, 0), x.shape[axis] + min(end, 0))
    x = x[tuple(crop)]
    if mode == "constant":
        value = 0 if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]
        return np.pad(x, widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode=mode)
'''

k_pad = template_function(TEMPLATE, "k_pad")


def _static(node):
    return tuple(int(p) for p in node.attr("pads", ())), float(node.attr("value", 0.0))


def kernel(node, x, pads=None, value=None, axes=None):
    if node.version < 11:
        pads, value = _static(node)
    return [k_pad(x, pads, value, axes, _mode(node))]


def emit(node, args, outs):
    if node.version < 11:
        pads, value = _static(node)
        params = f"{pads!r}, float({str(value)!r}), None"
    else:
        params = f"{args[1]}, {arg(args, 2)}, {arg(args, 3)}"
    return f"{outs[0]} = k_pad({args[0]}, {params}, {_mode(node)!r})"
