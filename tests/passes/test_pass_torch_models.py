"""Property: every pass, and the whole pipeline, keeps the outputs of real exported models
(torch.onnx.export, legacy exporter, dynamic batch) at batch 1 and 4."""

from __future__ import annotations

import io

import numpy as np
import pytest

from cuvil_edge.frontend import load_model
from cuvil_edge.passes import default_passes, optimize

from pass_helpers import assert_same_outputs

import torch  # noqa: E402  (after the helpers: pass_helpers sits beside this file)
nn = torch.nn


class ConvBnReluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.relu6(self.bn2(self.conv2(x)))
        return self.fc(x.view(x.size(0), -1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 16), nn.Sigmoid(),
                                  nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def _export(module, shape):
    torch.manual_seed(0)
    module.eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding has something to fold
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    buffer = io.BytesIO()
    torch.onnx.export(module, torch.randn(*shape), buffer, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=13,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL)
    return load_model(buffer.getvalue())  # a model that stops importing fails here, never skips


@pytest.fixture(scope="module", params=["cnn", "mlp"])
def model(request):
    if request.param == "cnn":
        return _export(ConvBnReluNet(), (2, 3, 8, 8))
    return _export(Mlp(), (2, 6))


@pytest.mark.parametrize("pass_", default_passes(), ids=lambda p: p.name)
def test_each_pass_keeps_outputs(model, pass_):
    result = pass_(model)
    assert_same_outputs(model, result.graph, batches=(1, 4), rtol=1e-5, atol=1e-5)


def test_pipeline_keeps_outputs_and_matches_torch_structure(model):
    out, report = optimize(model)
    assert_same_outputs(model, out, batches=(1, 4), rtol=1e-5, atol=1e-5)
    ops = {n.op_type for n in out.nodes}
    assert not ops & {"Identity", "Dropout", "BatchNormalization", "Shape", "Gather", "Unsqueeze", "Concat"}
    assert len(out.nodes) < len(model.nodes) and report.nodes_after == len(out.nodes)
