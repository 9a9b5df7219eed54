"""Shapes computed the way the model libraries compute them, with a dynamic batch *and* a dynamic
sequence or image size: the symbolic shape engine evaluates ``Shape``/``Gather``/arithmetic/
``Concat``/``Range``/``Expand``/``Pad``/``Slice`` on integer expressions at build time, and the
interpreter and the compiled module match onnxruntime at batch 1 and 3 and two sizes of the other
axis, from one export (``torch.onnx.export``, TorchScript exporter, traced at batch 2)."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import shape_patterns as patterns
import test_site_path as site_path
from test_exports import _Package
from test_site_path import coordinator  # noqa: F401 (a fixture)
from cuvil_edge.device_targets import build, load_target
from cuvil_edge.errors import BuildError, ExecutionError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.passes import optimize

RTOL, ATOL = 1e-4, 1e-5
BATCHES = (1, 3)


def tokens(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, 40, (batch, seq)).astype(np.int64)}


def tokens_and_mask(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rows after the first end in padding of different lengths."""
    mask = np.ones((batch, seq), np.int64)
    for row in range(1, batch):
        mask[row, max(1, seq - 2 * row):] = 0
    return {**tokens(batch, seq, rng), "attention_mask": mask}


def images(channels: int, channels_last: bool = False) -> Callable:
    def feeds(batch: int, size: tuple[int, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (batch, *size, channels) if channels_last else (batch, channels, *size)
        return {"x": rng.standard_normal(shape).astype(np.float32)}
    return feeds


@dataclass(frozen=True)
class Case:
    make: Callable[[], torch.nn.Module]
    feeds: Callable
    trace: object  # the other axis' size the export is traced at
    sizes: tuple  # the two sizes it runs at
    dynamic: dict[str, dict[int, str]]
    expects: frozenset[str]  # ops the export must hold: what the pattern is about


TEXT = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}}
CASES = {
    "bert_arange_mask": Case(patterns.BertMask, tokens_and_mask, 8, (5, 11), TEXT,
                             frozenset({"Range", "Shape", "Expand", "Where", "Softmax"})),
    "gpt2_causal_mask": Case(patterns.GPT2Causal, tokens, 8, (3, 12),
                             {"input_ids": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
                             frozenset({"Range", "Slice", "Where", "Shape"})),
    "vit_class_token": Case(patterns.ViTShape, images(3), (16, 24), ((16, 16), (24, 32)),
                            {"x": {0: "batch", 2: "height", 3: "width"}, "y": {0: "batch"}},
                            frozenset({"Conv", "Expand", "Concat", "Slice", "Div", "Reshape"})),
    "swin_window_mask": Case(patterns.SwinShape, images(16, channels_last=True), (8, 8), ((8, 8), (6, 10)),
                             {"x": {0: "batch", 1: "height", 2: "width"}, "y": {0: "batch", 1: "height", 2: "width"}},
                             frozenset({"Mod", "Pad", "Reshape", "Slice", "Concat"})),
    "mobilevit_unfold": Case(patterns.UnfoldShape, images(8), (8, 8), ((4, 6), (8, 10)),
                             {"x": {0: "batch", 2: "height", 3: "width"}, "y": {0: "batch", 2: "height", 3: "width"}},
                             frozenset({"Shape", "Gather", "Div", "Mul", "Reshape"})),
}


def feeds_for(name: str, batch: int, size, seed: int) -> dict[str, np.ndarray]:
    return CASES[name].feeds(batch, size, np.random.default_rng(seed))


@lru_cache(maxsize=None)
def exported(name: str) -> bytes:
    case = CASES[name]
    torch.manual_seed(0)
    model = case.make().eval()
    feeds = feeds_for(name, 2, case.trace, 0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(a) for a in feeds.values()), buffer, dynamo=False,
                          opset_version=17, input_names=list(feeds), output_names=["y"], dynamic_axes=case.dynamic)
    return buffer.getvalue()


@pytest.mark.parametrize("name", list(CASES))
def test_the_export_computes_its_shapes_at_run_time(name):
    """Each export holds the shape computation of its pattern and keeps both axes symbolic."""
    model = onnx.load_from_string(exported(name))
    ops = {node.op_type for node in model.graph.node}
    assert CASES[name].expects <= ops, f"{name} lacks {sorted(CASES[name].expects - ops)}"
    graph = load_model(exported(name))
    symbolic = {d for v in graph.inputs for d in v.type.shape if isinstance(d, str)}
    assert len(symbolic) >= 2, f"{name}: inputs {[str(v.type) for v in graph.inputs]}"


def match_onnxruntime(name: str, data: bytes, feeds_of: Callable, sizes, cache_dir) -> None:
    """The interpreter (imported and optimised graph) and the x86-64 module built from the optimised
    graph match onnxruntime at every batch of BATCHES and every size: ``feeds_of(batch, size, seed)``."""
    graph = load_model(data)
    optimized, _ = optimize(graph)
    compiled = build(_Package(optimized, data), "x86-64", cache_dir=cache_dir)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for size in sizes:
        for batch in BATCHES:
            feeds = feeds_of(batch, size, batch)
            want = session.run(None, feeds)
            runs = {"interpreter": interpreter.run(graph, feeds), "interpreter (optimised)": interpreter.run(optimized, feeds),
                    "compiled": compiled.run(feeds)}
            for value, expected in zip(graph.outputs, want):
                for how, got in runs.items():
                    where = f"{name} {how} batch={batch} size={size}"
                    assert got[value.name].shape == expected.shape, where
                    np.testing.assert_allclose(got[value.name], expected, rtol=RTOL, atol=ATOL, err_msg=where)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_and_compiled_module_match_onnxruntime(name, build_cache):
    match_onnxruntime(name, exported(name), lambda batch, size, seed: feeds_for(name, batch, size, seed),
                      CASES[name].sizes, build_cache)


def _buffer_sliced_to_the_sequence() -> bytes:
    """y = x + table[:seq] where seq is x's second axis and the table holds 8 rows."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Slice", ["table", "zero", "seq", "zero"], ["rows"], name="slice_table"),
             helper.make_node("Add", ["x", "rows"], ["y"])]
    inits = [numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(8, 1) * np.ones((1, 4), np.float32),
                                     "table"),
             numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64),
                                                                                              "zero")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_run_that_breaks_a_shape_the_build_took_on_trust_names_the_node():
    """A bound sliced to the sequence is taken to lie within the table (GPT-2's causal mask): at
    seq 6 the model runs; at seq 10 the table is too short, and the interpreter says where,
    instead of broadcasting 8 rows somewhere or failing deep in numpy."""
    graph = load_model(_buffer_sliced_to_the_sequence())
    assert graph.types["rows"].shape == ("seq", 4)
    x = np.zeros((2, 6, 4), np.float32)
    np.testing.assert_array_equal(interpreter.run(graph, {"x": x})["y"][0, :, 0], np.arange(6))
    with pytest.raises(ExecutionError, match=r"'slice_table'.*seq=10"):
        interpreter.run(graph, {"x": np.zeros((2, 10, 4), np.float32)})


def test_the_compiled_module_computes_no_shape_per_call(build_cache):
    """Shape arithmetic the build evaluated is not recomputed per call: the module reads the sizes
    of its inputs and writes the shapes as expressions of them."""
    data = exported("vit_class_token")
    optimized, _ = optimize(load_model(data))
    compiled = build(_Package(optimized, data), "x86-64", cache_dir=build_cache)
    forward = compiled.source[compiled.source.index("def _forward"):].split("\ndef ")[0]
    assert "d_batch = v0.shape[0]" in forward and "d_height = v0.shape[2]" in forward
    assert "np.array([d_batch, 32, (d_height//8)*(d_width//8)], dtype=np.int64)" in forward
    for kernel in ("k_shape", "k_unsqueeze", "k_cast", "k_where"):
        assert kernel not in forward, f"{kernel} still runs per call"
    assert forward.count("k_gather") == 1  # x[:, 0], the class token's output: data, not a shape


DYNAMIC_TARGETS = [t for t in site_path.TARGETS if not load_target(t).static_shapes]


@pytest.mark.parametrize("target", site_path.TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_site_runs_each_pattern_from_its_package(name, target, coordinator, build_cache, tmp_path):
    """The whole path a site takes: packaged and signed, verified and accepted, built for its target,
    run at a size other than the trace's. A static-shape target (the NPU) takes a dynamic batch
    only, and says so when it is given more."""
    data = exported(name)
    package = coordinator.package(name, data, target)
    if target not in DYNAMIC_TARGETS:
        with pytest.raises(BuildError, match="static-shape targets support only a leading batch dim"):
            site_path.site_runs(coordinator, package, target, tmp_path / "state", build_cache)
        return
    _, model = site_path.site_runs(coordinator, package, target, tmp_path / "state", build_cache)
    feeds = feeds_for(name, 3, CASES[name].sizes[1], 5)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = model.run(feeds)
    for value, expected in zip(model.graph.outputs, want):
        np.testing.assert_allclose(got[value.name], expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} on {target}")
