"""Both of torch's ONNX exporters: the dynamo one (``dynamo=True``, torch 2.13's default, built on
onnxscript) and the TorchScript one (``dynamo=False``), each exporting the same models with a
symbolic batch, which must import, build for x86-64 and match onnxruntime at batch 1 and 3.

Models: ours in the style of ResNet-18, MLP, MobileNetV3, ConvNeXt, EfficientNet, ViT, a GroupNorm
CNN and a BERT-style encoder, and GPT-2 as Hugging Face transformers writes it (random weights from
a config). A dynamic batch is ``dynamic_shapes`` with ``torch.export.Dim`` for dynamo (what torch
2.13 documents; ``dynamic_axes`` is deprecated there, though still converted) and ``dynamic_axes``
for TorchScript. Transformers' BERT builds its mask with ``torch.arange(batch)``, and the
``*_dynamic_seq`` cases leave the sequence length symbolic too (a ``Range`` and a ``Slice`` of a
longest-sequence buffer sized by a symbol). The README's export example is run here as written."""

from __future__ import annotations

import hashlib
import io
import re
import shlex
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import export_models as em
import torch_models as tm
from cuvil_edge.cli.main import main
from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter
from cuvil_edge.passes import optimize

RTOL, ATOL = 1e-4, 1e-5
BATCHES = (1, 3)  # traced at batch 2, so both differ from the trace
TORCHSCRIPT_OPSET = 17  # the dynamo exporter picks its own (18 or later)
README = Path(__file__).resolve().parents[2] / "README.md"

Feeds = Callable[[int, np.random.Generator], dict[str, np.ndarray]]


def image(*shape: int) -> Feeds:
    return lambda batch, rng: {"x": rng.standard_normal((batch, *shape)).astype(np.float32)}


def text(seq: Callable[[int], int], pad: int) -> Feeds:
    """Token ids and an attention mask whose rows after the first end in padding of different lengths."""
    def feeds(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        t = seq(batch)
        mask = np.ones((batch, t), np.int64)
        for row in range(1, batch):
            mask[row, t - 2 * row - 1:] = 0
        ids = np.where(mask == 1, rng.integers(2, 50, (batch, t)), pad)
        return {"input_ids": ids.astype(np.int64), "attention_mask": mask}
    return feeds


def tokens(seq: Callable[[int], int]) -> Feeds:
    return lambda batch, rng: {"input_ids": rng.integers(0, 50, (batch, seq(batch))).astype(np.int64)}


class HuggingFace(torch.nn.Module):
    """One tensor of a transformers model's output, called with named inputs, as people export it."""

    def __init__(self, model: torch.nn.Module, output: str) -> None:
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[self.output]


def gpt2() -> torch.nn.Module:
    import transformers  # lazily: its import alone takes seconds
    config = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=40)
    return HuggingFace(transformers.GPT2Model(config), "last_hidden_state")


def bert() -> torch.nn.Module:
    import transformers
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    return HuggingFace(transformers.BertModel(config), "last_hidden_state")


@dataclass(frozen=True)
class Case:
    make: Callable[[], torch.nn.Module]
    feeds: Feeds
    dynamic_seq: bool = False  # axis 1 of every input symbolic too


FIXED_SEQ = lambda batch: 12  # noqa: E731
VARYING_SEQ = lambda batch: 9 + batch  # noqa: E731  (11 when traced, 10 and 12 when checked)

CASES = {
    "resnet18": Case(lambda: tm.ResNet18(classes=10), image(3, 32, 32)),
    "mlp": Case(tm.MLP, image(32)),
    "mobilenetv3": Case(em.MobileNetV3, image(3, 32, 32)),
    "convnext": Case(em.ConvNeXt, image(3, 32, 32)),
    "efficientnet": Case(em.EfficientNet, image(3, 32, 32)),
    "vit": Case(em.ViT, image(3, 16, 16)),
    "groupnorm_cnn": Case(em.GroupNormCNN, image(3, 16, 16)),
    "bert": Case(em.BertEncoder, text(FIXED_SEQ, em.BertEncoder.PAD)),
    "gpt2": Case(gpt2, tokens(FIXED_SEQ)),
    # the extended attention mask is built with torch.arange(batch) (transformers' masking utilities)
    "hf_bert": Case(bert, text(FIXED_SEQ, 0)),
    "bert_dynamic_seq": Case(em.BertEncoder, text(VARYING_SEQ, em.BertEncoder.PAD), dynamic_seq=True),
    "gpt2_dynamic_seq": Case(gpt2, tokens(VARYING_SEQ), dynamic_seq=True),
}

def cases() -> list:
    params = []
    for name, case in CASES.items():
        for exporter in ("dynamo", "torchscript"):
            if case.dynamic_seq and exporter == "torchscript":
                continue  # time: a symbolic length meets the same shape inference whichever exporter wrote it
            params.append(pytest.param(name, exporter, id=f"{name}-{exporter}"))
    return params


@lru_cache(maxsize=None)
def exported(name: str, exporter: str, dynamic: bool = True) -> bytes:
    """``name`` exported by one exporter (traced at batch 2), with a symbolic batch unless not ``dynamic``."""
    case = CASES[name]
    torch.manual_seed(0)
    model = em.randomise_statistics(case.make()).eval()
    feeds = case.feeds(2, np.random.default_rng(0))
    args = tuple(torch.from_numpy(a) for a in feeds.values())
    axes = {0: "batch", 1: "seq"} if case.dynamic_seq else {0: "batch"}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {axis: torch.export.Dim(label, max=40 if label == "seq" else None) for axis, label in axes.items()}
            shapes = tuple(dims for _ in args) if dynamic else None
            torch.onnx.export(model, args, buffer, dynamo=True, input_names=list(feeds), output_names=["y"],
                              dynamic_shapes=shapes, verbose=False)
        else:
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=TORCHSCRIPT_OPSET,
                              input_names=list(feeds), output_names=["y"],
                              dynamic_axes={k: axes for k in [*feeds, "y"]} if dynamic else None)
    return buffer.getvalue()


class _Package:
    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


def check_against_onnxruntime(data: bytes, feeds: Feeds, batches: tuple[int, ...], cache_dir) -> None:
    """The interpreter on the imported and the optimised graph, and the module compiled for x86-64
    from the optimised graph, each against onnxruntime on the same export."""
    graph = load_model(data)
    optimized, _ = optimize(graph)
    compiled = build(_Package(optimized, data), "x86-64", cache_dir=cache_dir)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in batches:
        inputs = feeds(batch, np.random.default_rng(batch))
        want = session.run(None, inputs)
        runs = {"interpreter": interpreter.run(graph, inputs),
                "interpreter (optimised graph)": interpreter.run(optimized, inputs),
                "compiled (optimised graph)": compiled.run(inputs)}
        for value, expected in zip(graph.outputs, want):
            for how, got in runs.items():
                assert got[value.name].shape == expected.shape, f"{how} b={batch}"
                np.testing.assert_allclose(got[value.name], expected, rtol=RTOL, atol=ATOL, err_msg=f"{how} b={batch}")


@pytest.mark.parametrize("name, exporter", cases())
def test_export_with_a_symbolic_batch_matches_onnxruntime(name, exporter, build_cache):
    data = exported(name, exporter)
    model = onnx.load_from_string(data)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert opset >= 18 if exporter == "dynamo" else opset == TORCHSCRIPT_OPSET
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim[:1]] == ["batch"]
    graph = load_model(data)
    assert graph.inputs[0].type.shape[0] == "batch"
    check_against_onnxruntime(data, CASES[name].feeds, BATCHES, build_cache)


def test_dynamo_export_with_static_shapes_matches_onnxruntime(build_cache):
    data = exported("resnet18", "dynamo", dynamic=False)
    graph = load_model(data)
    assert graph.inputs[0].type.shape == (2, 3, 32, 32)
    check_against_onnxruntime(data, CASES["resnet18"].feeds, (2,), build_cache)


def test_dynamo_exporter_converts_dynamic_axes(build_cache):
    """Code written for the TorchScript exporter keeps its symbolic batch under torch 2.13's default."""
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tm.MLP().eval(), (torch.randn(2, 32),), buffer, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, verbose=False)
    assert load_model(buffer.getvalue()).inputs[0].type.shape == ("batch", 32)
    check_against_onnxruntime(buffer.getvalue(), CASES["mlp"].feeds, BATCHES, build_cache)


def readme_example() -> tuple[str, list[str]]:
    """The python block and the `cuvil-edge` lines of the README's section on exporting."""
    section = README.read_text(encoding="utf-8").split("## Exporting a model for cuvil-edge", 1)[1].split("\n## ")[0]
    python = re.findall(r"```python\n(.*?)```", section, re.S)
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()
                if line.startswith("cuvil-edge ")]
    assert len(python) == 1 and commands, "the section shows one python block and the cuvil-edge command"
    return python[0], commands


def test_readme_export_example_as_written(tmp_path, monkeypatch, capsys):
    code, commands = readme_example()
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(README), "exec"), {})
    assert (tmp_path / "model.onnx.data").is_file(), "the README says the weights are written beside the model"
    graph = load_model(tmp_path / "model.onnx")
    assert graph.inputs[0].type.shape[0] == "batch"
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().out
    assert (tmp_path / "model.cpkg").is_file()
