"""Weight storage in a package and its fold at load: fp16 weights behind a Cast, and the agent's
expansion of constant DequantizeLinear/Cast nodes into float initializers.

    W float32 initializer of >= FP16_MIN_ELEMENTS elements  =>  W16 float16 -> Cast(to=float32) -> W

The coordinator stores weights this way (:func:`store_fp16`, or int8 by :mod:`.quantize`); a target
whose kernels compute in fp32 expands them once, when the package is loaded
(:func:`dequantize_at_load`), instead of on every run.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import CuvilError, PassError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.passes._infra import (
    all_names,
    check_names_created,
    check_outputs_kept,
    fresh_graph_name,
    fresh_tensor_name,
    rebuild,
)

#: Smaller float32 initializers stay float32 under fp16 storage: they save nothing worth a Cast, and
#: small constants (epsilons, shifts, scales) are where fp16 rounding would hurt.
FP16_MIN_ELEMENTS = 16
FP16_MAX = float(np.finfo(np.float16).max)
#: ONNX TensorProto code of float32 (Cast's ``to``).
FLOAT32_CODE = 1


def store_fp16(graph: Graph) -> Graph:
    """``graph`` with its float32 weights stored as float16, each followed by a Cast to float32.

    Initializers under FP16_MIN_ELEMENTS elements, with values beyond float16's range, or that are
    also graph inputs stay float32.

    Raises:
        PassError: the result does not type-check or changed the graph's inputs or outputs.
    """
    inputs = {v.name for v in graph.inputs}
    taken, inits = all_names(graph), dict(graph.initializers)
    casts = []
    for name, array in graph.initializers.items():
        if (
            array.dtype != np.float32
            or array.size < FP16_MIN_ELEMENTS
            or name in inputs
            or not np.isfinite(array).all()
            or float(np.abs(array).max()) > FP16_MAX
        ):
            continue
        half = fresh_tensor_name(taken, f"{name}.fp16")
        inits[half] = inits.pop(name).astype(np.float16)
        casts.append(Node(fresh_graph_name(taken, f"{name}.cast"), "Cast", (half,), (name,), {"to": FLOAT32_CODE}, 13))
    if not casts:
        return graph
    return finish_graph(graph, casts + list(graph.nodes), inits, packaged=True)


#: Ops whose output is a function of constants only, folded by :func:`dequantize_at_load`.
LOAD_FOLDS = ("DequantizeLinear", "Cast")


def dequantize_at_load(graph: Graph, int8: bool = False) -> Graph:
    """The agent-side fold for targets whose kernels compute in fp32: every DequantizeLinear or Cast
    that reads only initializers becomes the float initializer it computes (once, at load), so runs
    do not expand the weights again. Activation QuantizeLinear/DequantizeLinear pairs stay, so the
    result computes what the int8 graph does.

    With ``int8`` (a target whose native kernels have an int8 dot product: ``TargetSpec.int8_kernels``)
    the QDQ-wrapped Conv/MatMul first become QLinearConv/QLinearMatMul (:mod:`.fuse_qdq`), whose
    weights stay int8; only what is left is folded.

    Raises:
        PassError: a fold failed, or the result does not type-check.
    """
    if int8:
        from cuvil_edge.passes.fuse_qdq import fuse_qdq

        graph = fuse_qdq(graph)
    inits = dict(graph.initializers)
    nodes = []
    for node in graph.nodes:
        args = [n for n in node.inputs if n]
        if node.op_type in LOAD_FOLDS and args and all(n in inits for n in args):
            try:
                result = ops.get(node.op_type, node.describe()).kernel(
                    node, *[inits[n] if n else None for n in node.inputs]
                )[0]
            except Exception as e:
                raise PassError(f"dequantize at load: {node.describe()} failed: {type(e).__name__}: {e}") from e
            inits[node.outputs[0]] = np.ascontiguousarray(result)
            continue
        nodes.append(node)
    if len(nodes) == len(graph.nodes):
        return graph
    return finish_graph(graph, nodes, inits)


def finish_graph(graph: Graph, nodes: list[Node], inits: dict[str, np.ndarray], packaged: bool = False) -> Graph:
    """Rebuild with only the initializers still read (the package must not carry the old weights);
    a ``packaged`` result (what the coordinator ships, not the agent's load fold) creates only
    names the package accepts."""
    read = {n for node in nodes for n in node.inputs} | {v.name for v in graph.outputs}
    try:
        out = rebuild(graph, nodes, {k: v for k, v in inits.items() if k in read})
        check_outputs_kept(graph, out)
        if packaged:
            check_names_created(graph, out)
    except CuvilError as e:
        raise PassError(f"quantization of graph {graph.name!r} produced an invalid graph: {e}") from e
    return out
