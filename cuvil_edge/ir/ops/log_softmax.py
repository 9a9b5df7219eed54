"""LogSoftmax: opset < 13 works on the 2-D flattening at ``axis`` (default 1);
opset >= 13 along ``axis`` alone (default -1).  x - max - log(sum(exp(x - max)))."""

from __future__ import annotations

from cuvil_edge.ir.ops._util import INT, template_function
from cuvil_edge.ir.ops import softmax as _softmax

OP_TYPE = "LogSoftmax"
VERSIONS = (1, 11, 13)
ATTRS = {"axis": INT}

# Same axis rules and type inference as Softmax.
_axis = _softmax._axis
infer = _softmax.infer


def flops(node, inputs, outputs):
    return 4 * outputs[0].numel()  # subtract max, exp, sum, subtract log


TEMPLATE = '''
def k_log_softmax(x, axis, legacy):
    if axis < 0:
        axis += x.ndim
    if legacy:
        rows = 1
        for d in x.shape[:axis]:
            rows *= d
        return k_log_softmax(x.reshape(rows, -1) if x.size else x, 1, 0).reshape(x.shape)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
'''

k_log_softmax = template_function(TEMPLATE, "k_log_softmax")


def kernel(node, x):
    return [k_log_softmax(x, _axis(node), int(node.version < 13))]


def emit(node, args, outs):
    return f"{outs[0]} = k_log_softmax({args[0]}, {_axis(node)}, {int(node.version < 13)})"
