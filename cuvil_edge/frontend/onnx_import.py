"""ONNX -> Cuvil IR.  The only module that imports ``onnx`` for model import.

Order: read/decode -> graph and opset present -> every node in the default
domain and implemented -> initializers, input types, attributes -> structure
(cycles, dangling inputs, double producers) -> ``onnx.checker`` -> Constant
folding -> names a package refuses renamed -> :func:`~cuvil_edge.ir.infer.build_graph`
(type inference).
Every failure is a :class:`~cuvil_edge.errors.ModelError` naming the problem and the fix.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from cuvil_edge.errors import MalformedModelError, ModelFileError, UnsupportedAttributeError, UnsupportedOpError
from cuvil_edge.ir import dims as dim_exprs, dtypes, ops
from cuvil_edge.ir.graph import Dim, Graph, Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph, topological_order
from cuvil_edge.ir.ops import generator
from cuvil_edge.passes.naming import fresh_graph_name, fresh_tensor_name, is_graph_name, is_tensor_name

log = logging.getLogger(__name__)

DEFAULT_DOMAINS = ops.DEFAULT_DOMAINS


def load_model(source: str | Path | bytes | onnx.ModelProto) -> Graph:
    """Import an ONNX model (a path, serialized bytes or a ModelProto) as a checked, typed Graph.

    Raises:
        ModelFileError: the file is missing or unreadable.
        MalformedModelError: undecodable bytes, no graph, no default opset, the ONNX
            checker fails, or structural problems (cycle, dangling input, bad dims).
        UnsupportedOpError: a node outside the default domain or an op the IR lacks.
        UnsupportedAttributeError: an unsupported dtype or attribute kind.
        ShapeInferenceError: a node's input types do not fit its op.
    """
    model = _read(source)
    graph = model.graph if model.HasField("graph") else None
    if graph is None:
        raise MalformedModelError("the model has no graph; export a complete ONNX model (ModelProto with a graph)")
    opset = _default_opset(model)
    _check_ops(graph, opset)
    if len(graph.sparse_initializer):
        raise UnsupportedAttributeError("the model has sparse initializers; convert them to dense tensors")
    initializers = {t.name: _tensor(t, f"initializer {t.name!r}") for t in graph.initializer}
    symbols: dict[str, str] = {}
    inputs = [_value(vi, symbols) for vi in graph.input if vi.name not in initializers]
    all_nodes = _nodes(graph, opset)
    # our structural check first: it names the cycle / dangling input better than the checker
    topological_order(all_nodes, {v.name for v in inputs} | set(initializers))
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # checker raises ValidationError or C++ errors; both mean a broken model
        raise MalformedModelError(f"the model fails onnx.checker: {_summary(e)}; fix or re-export the model") from e
    nodes = []
    for node in all_nodes:
        if node.op_type == "Constant":
            initializers[node.outputs[0]] = generator.value_of(node)
        else:
            nodes.append(node)
    outputs = [vi.name for vi in graph.output]
    nodes, initializers = _package_names({v.name for v in inputs}, outputs, nodes, initializers, opset)
    return build_graph(graph.name or "model", inputs, outputs, nodes, initializers, opset)


def _package_names(
    inputs: set[str], outputs: list[str], nodes: list[Node], initializers: dict[str, np.ndarray], opset: int
) -> tuple[list[Node], dict[str, np.ndarray]]:
    """The graph with every name a package refuses (PACKAGE_SPEC §1.3) renamed to a valid, unused one.

    torch names the outputs of its Constant nodes like paths (``/Constant_output_0``), and they
    become initializers above, whose names may not start with ``/``; some exporters name weights
    so too.  Graph inputs and outputs keep their names, since feeds and results are keyed by them:
    an initializer that is itself a graph output is renamed and passed out through an Identity
    under the output's name (a refused input or output name is left for the package writer to
    report).  The coordinator's weights are then keyed by the new names.
    """
    kept = inputs | set(outputs)
    taken = kept | set(initializers) | {x for n in nodes for x in (n.name, *n.inputs, *n.outputs) if x}
    mapping = {k: fresh_tensor_name(taken, k) for k in initializers if not is_tensor_name(k)}
    mapping.update(
        {
            o: fresh_graph_name(taken, o)
            for n in nodes
            for o in n.outputs
            if o and o not in kept and not is_graph_name(o)
        }
    )
    bad_nodes = [n for n in nodes if not is_graph_name(n.name)]
    if not mapping and not bad_nodes:
        return nodes, initializers
    log.info(
        "renamed %d names a package refuses: %s",
        len(mapping) + len(bad_nodes),
        ", ".join(f"{k!r} -> {v!r}" for k, v in list(mapping.items())[:5]),
    )
    renamed = [
        Node(
            n.name if is_graph_name(n.name) else fresh_graph_name(taken, n.name),
            n.op_type,
            tuple(mapping.get(i, i) for i in n.inputs),
            tuple(mapping.get(o, o) for o in n.outputs),
            n.attrs,
            n.version,
        )
        for n in nodes
    ]
    renamed += [
        Node(fresh_graph_name(taken, f"{out}_identity"), "Identity", (mapping[out],), (out,), {}, opset)
        for out in dict.fromkeys(outputs)
        if out in mapping
    ]
    return renamed, {mapping.get(k, k): v for k, v in initializers.items()}


def _read(source: Any) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "the model bytes")
    if not isinstance(source, (str, Path)):
        raise TypeError(f"load_model takes a path, bytes or onnx.ModelProto, not {type(source).__name__}")
    path = Path(source)
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist or is not a file; check the path")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelFileError(f"cannot read model file {str(path)!r} ({e}); check its permissions") from e
    model = _parse(data, f"model file {str(path)!r}")
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as e:
            raise ModelFileError(
                f"cannot load external tensor data of {str(path)!r} ({e}); keep the data files next to the model"
            ) from e
    return model


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends: never leak them
        raise MalformedModelError(
            f"{where}: not an ONNX model (protobuf decoding failed: {_summary(e)}); "
            "check the file is a complete, uncorrupted .onnx export"
        ) from e
    return model


def _summary(e: Exception, limit: int = 400) -> str:
    """The exception text on one line, cut to ``limit`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise MalformedModelError(
            "the model imports no opset for the default ONNX domain; re-export it with an opset_import"
        )
    return int(max(versions))


def _check_ops(graph: onnx.GraphProto, opset: int) -> None:
    """Reject non-default domains and ops without a module: the first offending node explained
    (:func:`ops.unsupported`: close names, docs/OPS.md), the other offending op types named."""
    supported = ops.registry()
    bad = [(i, n) for i, n in enumerate(graph.node) if n.domain not in DEFAULT_DOMAINS or n.op_type not in supported]
    if not bad:
        return
    index, first = bad[0]
    others = sorted({n.op_type for _, n in bad[1:]} - {first.op_type})
    more = f" Also unsupported: {', '.join(others[:6])}{', ...' if len(others) > 6 else ''}." if others else ""
    where = f"node {first.name or f'#{index}'!r}"
    raise UnsupportedOpError(ops.unsupported(first.op_type, where, opset, first.domain) + more)


def _nodes(graph: onnx.GraphProto, opset: int) -> list[Node]:
    used = {n.name for n in graph.node if n.name}
    seen: set[str] = set()
    result = []
    for index, n in enumerate(graph.node):
        name = n.name
        if not name or name in seen:
            base, suffix = f"{n.op_type}_{index}" if not name else name, 0
            name = base
            while name in used or name in seen:
                suffix += 1
                name = f"{base}_{suffix}"
        seen.add(name)
        where = f"node {name!r} ({n.op_type})"
        attrs = {a.name: _attr(a, where) for a in n.attribute}
        result.append(Node(name, n.op_type, tuple(n.input), tuple(n.output), attrs, opset))
    return result


def _attr(attr: onnx.AttributeProto, where: str) -> Any:
    try:
        value = helper.get_attribute_value(attr)
    except Exception as e:
        raise MalformedModelError(f"{where} attribute {attr.name!r} cannot be read ({_summary(e)})") from e
    return _convert(value, f"{where} attribute {attr.name!r}")


def _convert(value: Any, where: str) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedModelError(f"{where} is not UTF-8 text; fix the exporter") from e
    if isinstance(value, onnx.TensorProto):
        return _tensor(value, where)
    if isinstance(value, list):
        return tuple(_convert(v, where) for v in value)
    raise UnsupportedAttributeError(
        f"{where} holds a {type(value).__name__} (subgraph, sparse tensor or type), which the IR does not support"
    )


def _tensor(t: onnx.TensorProto, where: str) -> np.ndarray:
    _dtype(t.data_type, where)
    try:
        array = numpy_helper.to_array(t)
    except Exception as e:
        raise MalformedModelError(f"{where} tensor data cannot be decoded ({_summary(e)}); re-export the model") from e
    dtypes.from_numpy(array.dtype)
    array = np.array(array, order="C")  # keeps 0-d scalars 0-d (ascontiguousarray would make them 1-D)
    array.flags.writeable = False
    return array


def _dtype(code: int, where: str) -> str:
    name = dtypes.FROM_ONNX_CODE.get(code)
    if name is None:
        try:
            name = onnx.TensorProto.DataType.Name(code).lower()
        except ValueError:
            name = f"onnx type {code}"
        return dtypes.check(name, where)  # raises UnsupportedAttributeError
    return name


def _symbol(param: str, symbols: dict[str, str]) -> str:
    """The IR symbol for a ``dim_param``: itself when it is a name (``batch``, ``s0``), else a name
    made from it (``batch size`` -> ``batch_size``, ``input:0_dim0`` -> ``input_0_dim0``), one per
    distinct param, so that a dim is never read as an expression it was not meant to be."""
    if param not in symbols:
        taken = set(symbols.values())
        name = param if dim_exprs.SYMBOL.match(param) else re.sub(r"[^A-Za-z0-9_]+", "_", param).strip("_") or "dim"
        if name[0].isdigit():
            name = f"d_{name}"
        base, n = name, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        if name != param:
            log.info("dynamic axis %r is named %r in the IR (a symbol is letters, digits and _)", param, name)
        symbols[param] = name
    return symbols[param]


def _value(vi: onnx.ValueInfoProto, symbols: dict[str, str]) -> Value:
    where = f"graph input {vi.name!r}"
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedAttributeError(f"{where} is a {kind or 'untyped value'}; only tensor inputs are supported")
    tt = vi.type.tensor_type
    dtype = _dtype(tt.elem_type, where)
    if not tt.HasField("shape"):
        raise MalformedModelError(f"{where} has no shape; export the model with input shapes (dynamic axes are fine)")
    dims: list[Dim] = []
    for axis, d in enumerate(tt.shape.dim):
        which = d.WhichOneof("value")
        if which == "dim_value":
            dims.append(int(d.dim_value))
        elif which == "dim_param" and d.dim_param:
            dims.append(_symbol(d.dim_param, symbols))
        else:
            dims.append(_symbol(f"{vi.name}_dim{axis}", symbols))
    return Value(vi.name, TensorType(dtype, tuple(dims)))
