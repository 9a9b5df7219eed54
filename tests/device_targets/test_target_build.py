"""build(): generated + pruned + compiled modules match the interpreter and onnxruntime; caching."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.device_targets import build, codegen, load_target
from cuvil_edge.device_targets.build import cache_key
from cuvil_edge.device_targets.codegen import generate_source
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.errors import BuildError, ExecutionError, TargetError, UnknownTargetError
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph

TARGETS = ["ascend-310", "jetson-orin-nano", "rpi4", "x86-64"]
DIGEST = "ab" * 32


@dataclass(frozen=True)
class Package:
    """Stands in for ir_serialize's VerifiedPackage (build() only needs these two)."""

    graph: object
    payload_digest: str


def _weights():
    rng = np.random.default_rng(7)
    return {
        "W1": rng.standard_normal((8, 16)).astype(np.float32),
        "b1": rng.standard_normal(16).astype(np.float32),
        "W2": rng.standard_normal((3, 16)).astype(np.float32),
        "b2": rng.standard_normal(3).astype(np.float32),
    }


def _mlp_onnx(weights) -> bytes:
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="fc2", transB=1, alpha=0.5, beta=2.0),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(a, k) for k, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _mlp_ir(weights):
    nodes = [
        Node("fc1", "Gemm", ("x", "W1", "b1"), ("h",)),
        Node("act", "Relu", ("h",), ("r",)),
        Node("fc2", "Gemm", ("r", "W2", "b2"), ("y",), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    ]
    return build_graph("mlp", [Value("x", TensorType("float32", ("N", 8)))], ["y"], nodes, weights, 13)


@pytest.fixture(scope="module")
def mlp():
    weights = _weights()
    return _mlp_ir(weights), ort.InferenceSession(_mlp_onnx(weights), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("target", TARGETS)
def test_compiled_matches_interpreter_and_onnxruntime(tmp_path, mlp, target, batch):
    graph, session = mlp
    x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
    model = build(Package(graph, DIGEST), target, cache_dir=tmp_path)
    got = model.run({"x": x})["y"]
    assert got.shape == (batch, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, interpreter.run(graph, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_fp16_build_casts_and_stays_close(tmp_path, mlp):
    graph, session = mlp
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    model = build(Package(graph, DIGEST), "jetson-orin-nano", cache_dir=tmp_path, precision="fp16")
    got = model.run({"x": x})["y"]
    assert got.dtype == np.float32 and "float16" in model.source
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=2e-2, atol=2e-2)
    with pytest.raises(TargetError, match="rpi4"):
        build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path, precision="fp16")


def test_pruning_gives_different_smaller_sources(tmp_path, mlp):
    graph, _ = mlp
    template = generate_source(graph)
    sources = {t: build(Package(graph, DIGEST), t, cache_dir=tmp_path).source for t in ("rpi4", "x86-64", "ascend-310")}
    assert len(set(sources.values())) == 3
    for target, source in sources.items():
        assert len(source) < len(template), target
        assert "TARGET_" not in source and "COMPUTE_FP16" not in source
    assert "_run_static_batches" in sources["ascend-310"]
    assert "_run_static_batches" not in sources["rpi4"] and "_run_static_batches" not in sources["x86-64"]
    assert "def k_relu" in sources["rpi4"] and "TARGET_" in template


def test_cache_hit_reuses_source_without_codegen(tmp_path, mlp, monkeypatch):
    graph, _ = mlp
    first = build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)
    monkeypatch.setattr(codegen, "generate_source", lambda g, **_: pytest.fail("codegen ran on a cache hit"))
    second = build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.source == first.source and second.key == first.key
    x = np.ones((2, 8), np.float32)
    np.testing.assert_array_equal(second.run({"x": x})["y"], first.run({"x": x})["y"])


def test_cache_entry_holds_readable_source_and_meta(tmp_path, mlp):
    graph, _ = mlp
    model = build(Package(graph, DIGEST), "x86-64", cache_dir=tmp_path)
    entry = tmp_path / model.key
    assert model.source_path == entry / "module.py"
    assert (entry / "module.py").read_text() == model.source
    assert "# Gemm node 'fc1'" in model.source  # comments survive pruning
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["target"] == "x86-64" and meta["payload_digest"] == DIGEST and meta["precision"] == "fp32"


@pytest.mark.parametrize("change", ["target", "precision", "structure"])
def test_cache_key_changes(change):
    base = cache_key(DIGEST, load_target("jetson-orin-nano"), "fp32")
    other = {
        "target": lambda: cache_key(DIGEST, load_target("rpi4"), "fp32"),
        "precision": lambda: cache_key(DIGEST, load_target("jetson-orin-nano"), "fp16"),
        "structure": lambda: cache_key("cd" * 32, load_target("jetson-orin-nano"), "fp32"),
    }[change]()
    assert other != base


@pytest.mark.parametrize("target", TARGETS)
def test_next_rounds_weights_hit_the_cache_and_run_with_the_new_weights(tmp_path, mlp, target):
    """A federation sends the same model with new weights every round: one build, then hits, and
    each hit computes with the weights of its own package (they are not baked into the module)."""
    from cuvil_edge.ir.infer import with_initializers

    graph, _ = mlp
    first = build(Package(graph, DIGEST), target, cache_dir=tmp_path)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    for round_ in range(2):
        weights = {k: (v + rng.standard_normal(v.shape)).astype(np.float32) for k, v in graph.initializers.items()}
        nxt = with_initializers(graph, weights)
        model = build(Package(nxt, f"{round_ + 1:02x}" * 32), target, cache_dir=tmp_path)
        assert model.cache_hit and model.key == first.key
        expected = interpreter.run(nxt, {"x": x})["y"]
        np.testing.assert_allclose(model.run({"x": x})["y"], expected, rtol=1e-3, atol=1e-3)
        assert not np.allclose(model.run({"x": x})["y"], first.run({"x": x})["y"])
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1  # one entry (beside the cache's MAC key)


def test_structure_digest_covers_what_codegen_reads():
    """Anything that can change the generated source changes the digest; float weight values do not."""
    from cuvil_edge.device_targets.build import structure_digest
    from cuvil_edge.ir.infer import with_initializers

    def reshape_graph(shape, scale):
        return build_graph("r", [Value("x", TensorType("float32", ("N", 6)))], ["y"],
                           [Node("sh", "Reshape", ("x", "s"), ("t",)), Node("mul", "Mul", ("t", "k"), ("y",))],
                           {"s": np.array(shape, np.int64), "k": np.array(scale, np.float32)}, 13)

    base = reshape_graph([-1, 2, 3], 2.0)
    assert structure_digest(base) == structure_digest(with_initializers(base, {"k": np.array(5.0, np.float32)}))
    assert structure_digest(base) != structure_digest(reshape_graph([-1, 3, 2], 2.0))  # an index tensor's values
    assert structure_digest(base) != structure_digest(reshape_graph([-1, 2, 3], [2.0, 2.0, 2.0]))  # a shape
    renamed = build_graph("r", [Value("x", TensorType("float32", ("N", 6)))], ["y"],
                          [Node("sh2", "Reshape", ("x", "s"), ("t",)), Node("mul", "Mul", ("t", "k"), ("y",))],
                          {"s": np.array([-1, 2, 3], np.int64), "k": np.array(2.0, np.float32)}, 13)
    assert structure_digest(base) != structure_digest(renamed)  # node names appear in the source


def test_generated_source_does_not_depend_on_weight_values(mlp):
    """The property the structure-keyed cache rests on, over the demo CNN and the MLP."""
    from cuvil_edge.frontend import load_model
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx
    from cuvil_edge.ir.infer import with_initializers

    rng = np.random.default_rng(0)
    for graph in (mlp[0], load_model(digits_cnn_onnx(0))):
        weights = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in graph.initializers.items()
                   if v.dtype.kind == "f"}
        assert generate_source(graph) == generate_source(with_initializers(graph, weights))


def test_tampered_cache_entry_is_rebuilt(tmp_path, mlp):
    graph, _ = mlp
    first = build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)
    first.source_path.write_text(first.source + "\nraise SystemExit('tampered')\n")
    again = build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)
    assert not again.cache_hit and again.source == first.source


def test_compile_error_names_target(tmp_path, mlp, monkeypatch):
    graph, _ = mlp
    monkeypatch.setattr(codegen, "generate_source", lambda g, **_: "def run(W, feeds):\n    return undefined_name(\n")
    with pytest.raises(BuildError, match="rpi4"):
        build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)


def test_static_target_rejects_non_batch_symbols(tmp_path):
    graph = build_graph("seq", [Value("x", TensorType("float32", (2, "T")))], ["y"],
                        [Node("act", "Relu", ("x",), ("y",))], {}, 13)
    with pytest.raises(BuildError, match="axis 1"):
        build(Package(graph, DIGEST), "ascend-310", cache_dir=tmp_path)
    model = build(Package(graph, DIGEST), "rpi4", cache_dir=tmp_path)  # dynamic targets are fine
    np.testing.assert_array_equal(model.run({"x": -np.ones((2, 3), np.float32)})["y"], np.zeros((2, 3)))


@pytest.mark.parametrize("feeds, match", [
    ({}, "takes inputs"),
    ({"x": np.ones((2, 8), np.float64)}, "float32"),
    ({"x": np.ones((2, 7), np.float32)}, "axis 1"),
])
def test_bad_feeds_are_rejected(tmp_path, mlp, feeds, match):
    model = build(Package(mlp[0], DIGEST), "x86-64", cache_dir=tmp_path)
    with pytest.raises(ExecutionError, match=match):
        model.run(feeds)


def test_bad_target_and_digest(tmp_path, mlp):
    with pytest.raises(UnknownTargetError, match="rpi4"):
        build(Package(mlp[0], DIGEST), "pdp-11", cache_dir=tmp_path)
    with pytest.raises(BuildError, match="digest"):
        build(Package(mlp[0], "../../etc"), "rpi4", cache_dir=tmp_path)


def test_pruned_template_is_idempotent(mlp):
    consts = load_target("ascend-310").capabilities()
    once = prune(generate_source(mlp[0]), consts)
    assert prune(once, consts) == once


def test_build_path_imports_neither_torch_nor_onnx():
    code = (
        "import sys, numpy as np\n"
        "from cuvil_edge.device_targets import build, load_target, list_targets\n"
        "bad = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- the demo CNN against onnxruntime --------------------------------------------
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("target", TARGETS)
def test_demo_model_matches_onnxruntime(tmp_path, target, batch):
    from cuvil_edge.frontend import demo_model as demo, onnx_import

    model_proto = demo.digits_cnn_onnx()
    data = model_proto if isinstance(model_proto, bytes) else model_proto.SerializeToString()
    graph = onnx_import.load_model(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    name = graph.inputs[0].name
    shape = [batch if isinstance(d, str) else d for d in graph.inputs[0].type.shape]
    x = np.random.default_rng(batch).standard_normal(shape).astype(np.float32)
    compiled = build(Package(graph, DIGEST), target, cache_dir=tmp_path)
    got = compiled.run({name: x})
    want = session.run(None, {name: x})
    for value, expected in zip(graph.outputs, want):
        np.testing.assert_allclose(got[value.name], expected, rtol=1e-5, atol=1e-5)


def _demo_graph():
    from cuvil_edge.frontend import demo_model as demo, onnx_import

    data = demo.digits_cnn_onnx()
    return onnx_import.load_model(data), data


def test_demo_pruning_differs_in_kernels_not_only_metadata():
    graph, _ = _demo_graph()
    template = generate_source(graph)
    small, big = (prune(template, load_target(t).capabilities()) for t in ("rpi4", "x86-64"))
    strip = lambda s: [line for line in s.splitlines() if not line.startswith("BUILT_FOR")]  # noqa: E731
    assert strip(small) != strip(big)  # Conv's TARGET_LARGE_SCRATCH branch differs
    assert max(len(small), len(big)) < len(template)


def test_demo_model_fp16_on_orin_is_close(tmp_path):
    graph, data = _demo_graph()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    name = graph.inputs[0].name
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    got = build(Package(graph, DIGEST), "jetson-orin-nano", cache_dir=tmp_path, precision="fp16").run({name: x})
    out = graph.outputs[0].name
    assert got[out].dtype == np.float32
    np.testing.assert_allclose(got[out], session.run(None, {name: x})[0], rtol=5e-2, atol=5e-3)
