"""FuseSwish: x * sigmoid(x), as torch exports nn.SiLU, becomes one Swish node that FuseActivation
then folds into the convolution before it; look-alikes stay as they are."""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
import torch

from cuvil_edge.agent.torch_model import IRTorchModule
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.passes import FuseSwish, optimize
from pass_helpers import assert_same_outputs, graph_from_text


def _ops(graph):
    return [n.op_type for n in graph.nodes]


def test_torch_silu_is_fused_into_the_convolution():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 4), torch.nn.SiLU()).eval()
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 3, 6, 6),), buffer, dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    before = load_model(buffer.getvalue())
    assert _ops(before).count("Sigmoid") == 2
    fused = FuseSwish()(before).graph
    assert _ops(fused).count("Swish") == 2 and "Sigmoid" not in _ops(fused)
    assert {n.version for n in fused.nodes if n.op_type == "Swish"} == {24}
    after, _ = optimize(before)
    assert [(n.op_type, n.attr("activation")) for n in after.nodes if n.op_type.startswith("Cuvil")] == [
        ("CuvilFusedConv", "swish"), ("CuvilFusedGemm", "swish")]
    assert_same_outputs(before, after, rtol=1e-5, atol=1e-6)
    x = np.random.default_rng(0).standard_normal((3, 3, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(interpreter.run(after, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the training side lowers the fused activation to torch's SiLU
        np.testing.assert_allclose(IRTorchModule(after)(torch.from_numpy(x)).numpy(), want, rtol=1e-4, atol=1e-5)


SILU = """
g (float[N, 6] x, float[N, 6] z) => (float[N, 6] y) {
    s = Sigmoid(x)
    y = Mul(s, x)
}
"""


def test_either_operand_order_fuses():
    before = graph_from_text(SILU, 17)
    after = FuseSwish()(before).graph
    assert _ops(after) == ["Swish"]
    assert_same_outputs(before, after, rtol=1e-6, atol=1e-6)


def test_look_alikes_are_left_alone():
    other_operand = graph_from_text(SILU.replace("y = Mul(s, x)", "y = Mul(s, z)"), 17)
    assert not FuseSwish()(other_operand).modified  # z * sigmoid(x) is a gate, not a swish
    gate_read_twice = graph_from_text(SILU.replace("y = Mul(s, x)", "m = Mul(s, x)\n    y = Add(m, s)"), 17)
    assert not FuseSwish()(gate_read_twice).modified
    squared = graph_from_text(SILU.replace("y = Mul(s, x)", "y = Mul(s, s)"), 17)
    assert not FuseSwish()(squared).modified
