"""Real architectures exported with torch.onnx.export: the interpreter and one compiled
module (symbolic batch) both match torch at batch 1 and 4."""

from __future__ import annotations

import hashlib
import io
import warnings

import numpy as np
import pytest
import torch

from torch_models import MLP, EncoderBlock, MobileNetV2, ResNet18, SmallUNet, randomise_batchnorm

from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.ir.cost import total_macs
from cuvil_edge.passes import default_passes, optimize

RTOL, ATOL = 1e-4, 1e-5

ARCHITECTURES = {
    "mlp": (lambda: MLP(), (32,)),
    "resnet18": (lambda: ResNet18(classes=10), (3, 64, 64)),
    "mobilenetv2": (lambda: MobileNetV2(width=0.5, classes=10), (3, 64, 64)),
    "unet": (lambda: SmallUNet(), (3, 32, 32)),
    "transformer": (lambda: EncoderBlock(), (16, 32)),
}


def export(model: torch.nn.Module, sample: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (sample,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue()


class _Package:
    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def exported(request):
    torch.manual_seed(0)
    make, shape = ARCHITECTURES[request.param]
    model = randomise_batchnorm(make()).eval()
    data = export(model, torch.randn(2, *shape))
    return request.param, model, shape, data


def test_interpreter_and_compiled_module_match_torch(exported, build_cache):
    name, model, shape, data = exported
    graph = load_model(data)
    assert isinstance(graph.inputs[0].type.shape[0], str), "batch must stay symbolic"
    compiled = build(_Package(graph, data), "x86-64", cache_dir=build_cache)
    for batch in (1, 4):
        x = torch.randn(batch, *shape, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            want = model(x).numpy()
        feeds = {graph.inputs[0].name: x.numpy()}
        got_interp = interpreter.run(graph, feeds)[graph.outputs[0].name]
        got_compiled = compiled.run(feeds)[graph.outputs[0].name]
        np.testing.assert_allclose(got_interp, want, rtol=RTOL, atol=ATOL, err_msg=f"{name} interpreter b={batch}")
        np.testing.assert_allclose(got_compiled, want, rtol=RTOL, atol=ATOL, err_msg=f"{name} compiled b={batch}")


@pytest.mark.parametrize("single", [p.name for p in default_passes()] + ["optimize"])
def test_every_pass_keeps_outputs(exported, single):
    name, _, shape, data = exported
    graph = load_model(data)
    passes = None if single == "optimize" else [p for p in default_passes() if p.name == single][:1]
    optimized, _ = optimize(graph, passes)
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
        feeds = {graph.inputs[0].name: x}
        before = interpreter.run(graph, feeds)[graph.outputs[0].name]
        after = interpreter.run(optimized, feeds)[graph.outputs[0].name]
        np.testing.assert_allclose(after, before, rtol=RTOL, atol=ATOL, err_msg=f"{name} after {single} b={batch}")


def test_optimize_folds_resnet_batchnorms_and_fuses_activations(exported):
    name, _, _, data = exported
    graph = load_model(data)
    optimized, _ = optimize(graph)
    ops = optimized.op_counts()
    assert "BatchNormalization" not in ops
    if name == "resnet18":  # conv-bn-relu fused; each block's last conv takes its residual Add and Relu
        assert ops["CuvilFusedConv"] == 9 and ops["CuvilConvAdd"] == 8 and "Relu" not in ops and "Add" not in ops
    if name == "mobilenetv2":  # every ReLU6 (Clip 0..6) follows a conv and is fused into it
        assert ops["CuvilFusedConv"] > 0 and "Clip" not in ops


def test_resnet18_at_224_is_1_82_gmac():
    torch.manual_seed(0)
    graph = load_model(export(ResNet18(classes=1000).eval(), torch.randn(1, 3, 224, 224)))
    macs = total_macs(graph, {"batch": 1})
    assert macs == pytest.approx(1.82e9, rel=0.01)
    assert total_macs(optimize(graph)[0], {"batch": 1}) == macs  # folding BN adds no multiply-adds
