"""FuseGelu: the erf formula torch exports before opset 20 becomes one Gelu node, and nothing that
only resembles it does."""

from __future__ import annotations

import io
import math
import time

import numpy as np
import onnxruntime as ort
import pytest
import torch

from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir_serialize import AntiRollbackState, verify_and_accept, write_package
from cuvil_edge.passes import FuseGelu, optimize
from pass_helpers import assert_same_outputs, graph_from_text

SQRT2, HALF_SQRT2 = math.sqrt(2), 1 / math.sqrt(2)


def _ops(graph):
    return [n.op_type for n in graph.nodes]


def test_torch_gelu_export_becomes_one_gelu_node(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 8),), buffer, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    before = load_model(buffer.getvalue())
    assert "Erf" in _ops(before)
    fused = FuseGelu()(before).graph
    assert _ops(fused) == ["Gemm", "Gelu", "Gemm"] and fused.nodes[1].version == 20
    after, _ = optimize(before)  # the pipeline then folds the Gelu into the Gemm before it
    assert _ops(after) == ["CuvilFusedGemm", "Gemm"] and after.nodes[0].attr("activation") == "gelu"
    assert_same_outputs(before, after, rtol=1e-6, atol=1e-6)
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32) * 3
    want = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with torch.no_grad():
        np.testing.assert_allclose(want, model(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(interpreter.run(after, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)

    # the fused graph survives the package format and builds for every kind of target
    keys_dir = tmp_path / "keys"
    private, _ = init_keys(keys_dir)
    keys = load_signing_keys(private)
    now = int(time.time())
    data = write_package(after, site="s1", target="x86-64", version=1, signing_key=keys.coordinator,
                         release_key=keys.release, issued_at=now, expires=now + 600)
    state = AntiRollbackState(tmp_path / "state")
    state.initialise((keys_dir / "root.json").read_bytes())
    package = verify_and_accept(data, state, site="s1", target="x86-64", now=now, max_package_bytes=1 << 20)
    for target in ("x86-64", "ascend-310"):
        got = build(package, target, cache_dir=tmp_path / "cache").run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


HALF_FIRST = """
g (float[N, 6] x) => (float[N, 6] y) {
    h = Mul(x, half)
    s = Mul(scale, x)
    e = Erf(s)
    a = Add(one, e)
    y = Mul(a, h)
}
"""

TORCH_ORDER = """
g (float[N, 6] x) => (float[N, 6] y) {
    s = Div(x, root2)
    e = Erf(s)
    a = Add(e, one)
    m = Mul(x, a)
    y = Mul(m, half)
}
"""


def _constants(**override):
    values = {"half": np.float32(0.5), "scale": np.float32(HALF_SQRT2), "root2": np.float32(SQRT2),
              "one": np.float32(1.0)}
    values.update(override)
    return {k: np.asarray(v) for k, v in values.items()}


@pytest.mark.parametrize("text", [HALF_FIRST, TORCH_ORDER], ids=["half-first", "torch-order"])
def test_both_operand_orders_fuse(text):
    before = graph_from_text(text, 17, **_constants())
    after = FuseGelu()(before).graph
    assert _ops(after) == ["Gelu"]
    assert_same_outputs(before, after, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("override", [{"root2": np.float32(math.sqrt(3))}, {"half": np.float32(0.25)},
                                      {"one": np.float32(2.0)}, {"root2": np.full(6, SQRT2, np.float32)}],
                         ids=["not-sqrt2", "not-half", "not-one", "vector-constant"])
def test_look_alikes_are_left_alone(override):
    before = graph_from_text(TORCH_ORDER, 17, **_constants(**override))
    assert not FuseGelu()(before).modified


def test_an_intermediate_read_elsewhere_blocks_the_fusion():
    text = TORCH_ORDER.replace("(float[N, 6] y)", "(float[N, 6] y, float[N, 6] e)")
    before = graph_from_text(text, 17, **_constants())
    assert not FuseGelu()(before).modified  # erf(x/√2) is also an output: it must still be computed
    shared = TORCH_ORDER.replace("y = Mul(m, half)", "y0 = Mul(m, half)\n    y = Add(y0, a)")
    before = graph_from_text(shared, 17, **_constants())
    assert not FuseGelu()(before).modified  # 1 + erf is read twice


def test_a_different_x_in_the_product_blocks_the_fusion():
    text = TORCH_ORDER.replace("(float[N, 6] x)", "(float[N, 6] x, float[N, 6] z)").replace("m = Mul(x, a)",
                                                                                            "m = Mul(z, a)")
    before = graph_from_text(text, 17, **_constants())
    assert not FuseGelu()(before).modified
