"""CuvilFusedMatMul: torch's export of a Linear on a batch of sequences (MatMul, then Add of the
bias) becomes one node that also takes the activation after it; it computes what the two or three
nodes did (interpreter, compiled with and without native kernels, onnxruntime) and trains."""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
import torch

from cuvil_edge.agent.torch_model import IRTorchModule
from cuvil_edge.device_targets import build, load_target
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.ops import _native
from cuvil_edge.passes import FuseBias, optimize
from pass_helpers import graph_from_text


class Package:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "ef" * 32


def _export(model, shape):
    buffer = io.BytesIO()
    torch.onnx.export(model.eval(), (torch.randn(*shape),), buffer, dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue()


def test_linear_gelu_linear_on_sequences_fuses_computes_and_trains(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 24))
    data = _export(model, (2, 400, 32))  # 400 x 96 outputs per sample: over the native epilogue's floor
    before = load_model(data)
    after, _ = optimize(before)
    assert [(n.op_type, n.attr("activation", "none")) for n in after.nodes] == [
        ("CuvilFusedMatMul", "gelu"), ("CuvilFusedMatMul", "none")]
    x = np.random.default_rng(1).standard_normal((2, 400, 32)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(interpreter.run(after, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)

    class Spy:
        def __init__(self, lib):
            self.lib, self.called = lib, set()

        def __getattr__(self, name):
            self.called.add(name)
            return getattr(self.lib, name)

    spy = Spy(_native.library()) if _native.library() is not None else None
    if spy is not None:
        monkeypatch.setitem(_native._state, "lib", spy)
    native = load_target("x86-64")
    for spec in (native, native.model_copy(update={"native_kernels": False})):
        got = build(Package(after), spec, cache_dir=tmp_path).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert spy is None or "cuvil_epilogue_f32" in spy.called

    module = IRTorchModule(after)
    with torch.no_grad():
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=1e-4, atol=1e-5)
    loss = module(torch.from_numpy(x)).square().mean()
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    assert len(grads) == 4 and all(g is not None and float(g.abs().sum()) > 0 for g in grads)  # 2 weights, 2 biases


LINEAR = """
g (float[N, 5, 8] x, float[8, 6] k) => (float[N, 5, 6] y) {
    m = MatMul(x, WEIGHT)
    y = Add(m, b)
}
"""


def test_look_alikes_stay_a_matmul_and_an_add():
    w = np.random.default_rng(2).standard_normal((8, 6)).astype(np.float32)
    per_row = graph_from_text(LINEAR.replace("WEIGHT", "w"), 17, w=w, b=np.ones((5, 6), np.float32))
    assert not FuseBias()(per_row).modified  # the bias varies along the sequence: not a Linear's
    computed = graph_from_text(LINEAR.replace("WEIGHT", "k"), 17, b=np.ones(6, np.float32))
    assert not FuseBias()(computed).modified  # B is an input (attention's), not a weight
    linear = graph_from_text(LINEAR.replace("WEIGHT", "w"), 17, w=w, b=np.arange(6, dtype=np.float32))
    fused = FuseBias()(linear).graph
    assert [n.op_type for n in fused.nodes] == ["CuvilFusedMatMul"]
    x = np.random.default_rng(3).standard_normal((3, 5, 8)).astype(np.float32)
    feeds = {"x": x, "k": w}
    np.testing.assert_allclose(interpreter.run(fused, feeds)["y"], interpreter.run(linear, feeds)["y"], rtol=1e-6)
