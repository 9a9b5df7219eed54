"""What people export: torch models in the style of ViT, Swin, ConvNeXt,
EfficientNet, MobileNetV3, a GroupNorm CNN, an AlexNet-style LRN network, a U-Net at opset 9
(``Upsample``) and a BERT-style encoder with attention masks, exported by ``torch.onnx.export``
with a symbolic batch (the TorchScript exporter, ``dynamo=False``; test_dynamo_exports.py covers
the dynamo one, torch's default), random weights and randomised normalisation statistics.

Each export must contain the ops its style is about, and must run in cuvil-edge: the interpreter
on the imported and on the optimised graph, and the module compiled for x86-64 from the optimised
graph (what the coordinator ships) match onnxruntime at batch 1 and 4 (rtol 1e-4, atol 1e-5), from
one export with a symbolic batch (Swin folds it into the window count: a ``4*batch`` dim)."""

from __future__ import annotations

import collections
import hashlib
import io
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper

import export_models as models
from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.passes import optimize

RTOL, ATOL = 1e-4, 1e-5
BATCHES = (1, 4)
SEQ = 12  # BERT's sequence length


def image_feeds(shape: tuple[int, ...]) -> Callable[[int, np.random.Generator], dict[str, np.ndarray]]:
    return lambda batch, rng: {"x": rng.standard_normal((batch, *shape)).astype(np.float32)}


def text_feeds(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Token ids and a mask whose rows after the first end in padding of different lengths (PAD ids there)."""
    mask = np.ones((batch, SEQ), np.int64)
    for row in range(1, batch):
        mask[row, SEQ - 2 * row - 1:] = 0
    ids = np.where(mask == 1, rng.integers(2, 50, (batch, SEQ)), models.BertEncoder.PAD)
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


@dataclass(frozen=True)
class Export:
    make: Callable[[], torch.nn.Module]
    feeds: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    expects: frozenset[str]  # ops the export must contain: what the style is about
    opset: int = 17
    dynamic: dict[str, dict[int, str]] = field(default_factory=lambda: {"x": {0: "batch"}, "y": {0: "batch"}})
    options: dict[str, Any] = field(default_factory=dict)


# the sequence length stays static: the IR refuses slicing a buffer by a symbolic length (Slice's infer)
BERT_AXES = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "y": {0: "batch"}}

EXPORTS = {
    # patch-embedding conv, class token (Expand to the batch + Concat), attention, LayerNorm, GELU (Erf)
    "vit": Export(models.ViT, image_feeds((3, 16, 16)),
                  frozenset({"Conv", "Concat", "Expand", "MatMul", "Softmax", "LayerNormalization", "Erf"})),
    # shifted windows: torch.roll as Slice + Concat, padding arithmetic with Mod, masks as buffers (timm)
    "swin": Export(models.Swin, image_feeds((3, 24, 24)),
                   frozenset({"Mod", "Slice", "Concat", "Pad", "Softmax", "LayerNormalization", "Gather"})),
    # one stage (6x6 grid padded to 8x8) with the shifted-window masks built in forward (Hugging Face)
    "swin_runtime_mask": Export(lambda: models.Swin(image=12, stages=1, runtime_mask=True), image_feeds((3, 12, 12)),
                                frozenset({"Mod", "Slice", "Concat", "ConstantOfShape", "ScatterND", "Where",
                                           "Equal", "Range"})),
    # 7x7 depthwise, LayerNorm over channels via Transpose, the opset-20 Gelu op, layer scale (Mul)
    "convnext": Export(models.ConvNeXt, image_feeds((3, 32, 32)),
                       frozenset({"Conv", "Transpose", "LayerNormalization", "Gelu", "Mul"}), opset=20),
    # SiLU (Sigmoid * x), squeeze-excite; BatchNormalization kept in the graph (TrainingMode.PRESERVE)
    "efficientnet": Export(models.EfficientNet, image_feeds((3, 32, 32)),
                           frozenset({"Sigmoid", "Mul", "GlobalAveragePool", "BatchNormalization"}),
                           options={"training": torch.onnx.TrainingMode.PRESERVE}),
    # HardSwish, Hardsigmoid-gated squeeze-excite; BatchNorm folded into the convs by the exporter
    "mobilenetv3": Export(models.MobileNetV3, image_feeds((3, 32, 32)),
                          frozenset({"HardSwish", "HardSigmoid", "GlobalAveragePool", "Relu", "Mul"})),
    # torch writes GroupNorm as Reshape, InstanceNormalization, Reshape, Mul, Add
    "groupnorm_cnn": Export(models.GroupNormCNN, image_feeds((3, 16, 16)),
                            frozenset({"InstanceNormalization", "Reshape", "Mul", "Add", "Tanh", "AveragePool"})),
    "alexnet_lrn": Export(models.AlexNetLRN, image_feeds((3, 64, 64)), frozenset({"LRN", "MaxPool", "Gemm"})),
    # before Resize: Upsample (nearest, and linear for bilinear without corner alignment)
    "unet_opset9": Export(models.UNetUpsample, image_feeds((3, 16, 16)), frozenset({"Upsample", "Concat", "MaxPool"}),
                          opset=9),
    "bert": Export(models.BertEncoder, text_feeds,
                   frozenset({"CumSum", "Range", "Where", "Expand", "Gather", "Softmax", "LayerNormalization"}),
                   dynamic=BERT_AXES),
}

@lru_cache(maxsize=None)
def exported(name: str) -> bytes:
    """``name`` exported with a symbolic batch (traced at batch 2)."""
    spec = EXPORTS[name]
    torch.manual_seed(0)
    model = models.randomise_statistics(spec.make()).eval()
    feeds = spec.feeds(2, np.random.default_rng(0))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(a) for a in feeds.values()), buffer, dynamo=False,
                          opset_version=spec.opset, input_names=list(feeds), output_names=["y"],
                          dynamic_axes=spec.dynamic, **spec.options)
    return buffer.getvalue()


def check_against_onnxruntime(name: str, data: bytes, batches: tuple[int, ...], cache_dir,
                              target: str = "x86-64") -> None:
    graph = load_model(data)
    assert isinstance(graph.inputs[0].type.shape[0], str), "the batch must stay symbolic"
    optimized, _ = optimize(graph)
    compiled = build(_Package(optimized, data), target, cache_dir=cache_dir)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in batches:
        feeds = EXPORTS[name].feeds(batch, np.random.default_rng(batch))
        want = session.run(None, feeds)
        runs = {"interpreter": interpreter.run(graph, feeds), "interpreter (optimised graph)":
                interpreter.run(optimized, feeds), "compiled (optimised graph)": compiled.run(feeds)}
        for value, expected in zip(graph.outputs, want):
            for how, got in runs.items():
                assert got[value.name].shape == expected.shape, f"{name} {how} b={batch}"
                np.testing.assert_allclose(got[value.name], expected, rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name} {how} b={batch}")


class _Package:
    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_contains_the_ops_of_its_style(name):
    model = onnx.load_from_string(exported(name))
    ops = collections.Counter(node.op_type for node in model.graph.node)
    assert EXPORTS[name].expects <= set(ops), f"{name} export lacks {sorted(EXPORTS[name].expects - set(ops))}"
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [EXPORTS[name].opset]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":  # the running statistics are randomised
            mean, var = initializers[node.input[3]], initializers[node.input[4]]
            assert np.abs(mean).min() > 0 and np.abs(var - 1).max() > 0.1
    if name == "unet_opset9":
        assert "Resize" not in ops and {helper.get_node_attr_value(n, "mode") for n in model.graph.node
                                       if n.op_type == "Upsample"} == {b"nearest", b"linear"}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_interpreter_and_compiled_module_match_onnxruntime(name, build_cache):
    check_against_onnxruntime(name, exported(name), BATCHES, build_cache)


@pytest.mark.parametrize("target", ["rpi4", "jetson-orin-nano", "ascend-310"])
@pytest.mark.parametrize("name", list(EXPORTS))
def test_every_targets_pruned_module_matches_onnxruntime(name, target, build_cache):
    """The other targets' variants: rpi4's low-memory kernels, ascend-310's static batch of 4 and
    pure-numpy kernels (batch 3 runs one padded chunk, 5 two chunks), jetson's build at fp32."""
    check_against_onnxruntime(name, exported(name), (3, 5) if target == "ascend-310" else (1,), build_cache,
                              target)
