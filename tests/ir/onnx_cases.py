"""Helpers for op tests (imported by test_ops.py): single-node ONNX models and an onnxruntime oracle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxruntime as ort  # noqa: E402


@dataclass(frozen=True)
class In:
    """A graph input; ``shape`` may hold the symbol "batch"."""

    shape: tuple
    dtype: Any = np.float32


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    args: tuple  # In (graph input) or np.ndarray (initializer), in node-input order
    attrs: dict = field(default_factory=dict)
    opset: int = 13


def case(id: str, op: str, *args: Any, opset: int = 13, **attrs: Any) -> Case:
    return Case(id, op, tuple(args), attrs, opset)


def const(*shape: int, dtype: Any = np.float32, seed: int = 7) -> np.ndarray:
    return random_array(shape, dtype, np.random.default_rng(seed + sum(shape)))


def random_array(shape: tuple, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    low = 0 if dtype.kind == "u" else -5
    return rng.integers(low, 6, size=shape).astype(dtype)


def node_inputs(args, is_feed) -> tuple[list, list, list[str]]:
    """(graph inputs, initializers, the node's input names) for a one-node model reading
    in0, in1 ...: an arg for which ``is_feed`` holds (with ``shape`` and ``dtype``) is a graph
    input, an array an initializer, None an omitted optional input ("")."""
    inputs, inits, names = [], [], []
    for i, a in enumerate(args):
        if a is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if is_feed(a):
            code = helper.np_dtype_to_tensor_dtype(np.dtype(a.dtype))
            inputs.append(helper.make_tensor_value_info(name, code, list(a.shape)))
        else:
            inits.append(numpy_helper.from_array(np.asarray(a), name))
    return inputs, inits, names


def build_model(c: Case) -> bytes:
    """One node named "n0" reading in0, in1 ... and writing "y"."""
    inputs, inits, names = node_inputs(c.args, lambda a: isinstance(a, In))
    out_dtype = c.args[0].dtype if c.args else np.float32
    node = helper.make_node(c.op, names, ["y"], name="n0", **c.attrs)
    if c.op == "Constant":
        out_dtype = np.float32 if "value_float" in c.attrs or "value_floats" in c.attrs else np.int64
        if "value" in c.attrs:
            out_dtype = numpy_helper.to_array(c.attrs["value"]).dtype
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)), None)
    graph = helper.make_graph([node], c.id, inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)  # gives "y" the shape the checker requires
    if not model.graph.output[0].type.tensor_type.HasField("shape"):
        model.graph.output[0].type.tensor_type.shape.SetInParent()  # scalar-less fallback: rank unknown
    onnx.checker.check_model(model)
    return model.SerializeToString()


def feeds_for(c: Case, batch: int | None, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i, a in enumerate(c.args):
        if isinstance(a, In):
            shape = tuple(batch if d == "batch" else d for d in a.shape)
            feeds[f"in{i}"] = random_array(shape, a.dtype, rng)
    return feeds


def batches(c: Case) -> list[int | None]:
    symbolic = any(isinstance(a, In) and "batch" in a.shape for a in c.args)
    return [1, 3] if symbolic else [None]


def run_ort(model: bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


def assert_matches(actual: np.ndarray, expected: np.ndarray) -> None:
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def run_template(module, node, env: dict, capabilities: dict) -> list:
    """Execute ``module``'s TEMPLATE with ``capabilities`` and call it as a compiled module does (a
    copy specialised for ``node``); returns the node's outputs in order (absent optional inputs
    are ``None``)."""
    from cuvil_edge.device_targets.codegen import Specialiser
    from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES

    namespace = {"np": np, **DEFAULT_CAPABILITIES, **capabilities}
    exec(compile(module.TEMPLATE, f"<template {module.OP_TYPE}>", "exec"), namespace)
    args = []
    for i, name in enumerate(node.inputs):
        namespace[f"a{i}"] = env[name] if name else None
        args.append(f"a{i}" if name else "")
    outs = [f"out{i}" for i in range(len(node.outputs))]
    specialiser = Specialiser()  # the call compiled modules make: a copy specialised for node
    call = specialiser.call(module, node, args, outs)
    exec(compile("\n".join(specialiser.functions), f"<specialised {module.OP_TYPE}>", "exec"), namespace)
    exec(compile(call, "<emit>", "exec"), namespace)
    return [namespace[o] for o in outs]
