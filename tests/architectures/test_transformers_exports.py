"""Real Hugging Face ``transformers`` models, not shapes written for this project: tiny configs,
random weights, exported with the TorchScript exporter (``torch.onnx.export(dynamo=False)``,
opset 17) with a dynamic batch and, for text, a dynamic sequence length. The shape code in these
graphs is the libraries' own (BERT's extended mask, GPT-2's causal slice, Swin's window mask built
in ``forward``, MobileViT's unfold reshapes), so this is where the symbolic shape engine meets
exports it was not written against. Each model is imported, optimised and built for x86-64, and the
interpreter and the compiled module match onnxruntime at batch 1 and 3 and, for text, at sequence
lengths other than the trace's. Nothing is downloaded: every model is built from a config object."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never reach the hub

import io
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from test_symbolic_shapes import BATCHES, match_onnxruntime

RTOL, ATOL = 1e-4, 1e-5
TRACE_BATCH, TRACE_SEQ = 2, 8
SEQS = (5, 11)
VOCAB = 64


class WithMask(torch.nn.Module):
    """One output for the export: the last hidden state. The models keep their default attention
    (sdpa), which the TorchScript exporter writes as MatMul/Softmax with the mask added."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Pixels(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state


def tokens(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)}


def tokens_and_mask(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rows after the first end in padding of different lengths (every row keeps one token)."""
    mask = np.ones((batch, seq), np.int64)
    for row in range(1, batch):
        mask[row, max(1, seq - 2 * row):] = 0
    return {**tokens(batch, seq, rng), "attention_mask": mask}


def pixels(batch: int, size: tuple[int, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal((batch, 3, *size)).astype(np.float32)}


TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)


def bert():
    config = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **TINY)
    return WithMask(transformers.BertModel(config))


def distilbert():
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=1, n_heads=4, hidden_dim=64,
                                           max_position_embeddings=64)
    return WithMask(transformers.DistilBertModel(config))


def roberta():
    # RoBERTa's positions start after padding_idx (1): the table needs seq + 2 rows.
    config = transformers.RobertaConfig(vocab_size=VOCAB, max_position_embeddings=66, **TINY)
    return WithMask(transformers.RobertaModel(config))


def gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=1, n_head=4,
                                     use_cache=False, bos_token_id=0, eos_token_id=0)
    return WithMask(transformers.GPT2Model(config))


def t5_encoder():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                   use_cache=False)
    return WithMask(transformers.T5EncoderModel(config))


def vit():
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, **TINY)
    return Pixels(transformers.ViTModel(config, add_pooling_layer=False))


def swin():
    config = transformers.SwinConfig(image_size=16, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 1],
                                     num_heads=[2, 4], window_size=2, mlp_ratio=2.0)
    return Pixels(transformers.SwinModel(config, add_pooling_layer=False))


def mobilevit():
    config = transformers.MobileViTConfig(image_size=64, num_channels=3, neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                          hidden_sizes=[16, 24, 32], num_attention_heads=2, patch_size=2,
                                          mlp_ratio=2.0, expand_ratio=2.0)
    model = transformers.MobileViTModel(config, expand_output=False)
    # Its initialisation draws the BatchNorm scales near zero: after a few blocks every activation
    # is exactly 0 and any implementation would "match". Scales and statistics of order 1 instead.
    draw = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=draw)
                module.bias.uniform_(-0.2, 0.2, generator=draw)
                module.running_mean.uniform_(-0.2, 0.2, generator=draw)
                module.running_var.uniform_(0.5, 2.0, generator=draw)
            elif isinstance(module, torch.nn.Conv2d):
                module.reset_parameters()
    return Pixels(model)


@dataclass(frozen=True)
class Case:
    make: Callable[[], torch.nn.Module]
    feeds: Callable
    trace: object  # the second axis (or image size) the export is traced at
    sizes: tuple  # the sizes it runs at
    dynamic: dict[str, dict[int, str]]


TEXT = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}}
BATCH_ONLY = {"pixel_values": {0: "batch"}, "y": {0: "batch"}}
IMAGE = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}
TOKENS_OUT = {**IMAGE, "y": {0: "batch", 1: "tokens"}}  # (batch, tokens, channels)
MAP_OUT = {**IMAGE, "y": {0: "batch", 2: "out_height", 3: "out_width"}}  # (batch, channels, h, w)

CASES = {
    "bert": Case(bert, tokens_and_mask, TRACE_SEQ, SEQS, TEXT),
    "distilbert": Case(distilbert, tokens_and_mask, TRACE_SEQ, SEQS, TEXT),
    "roberta": Case(roberta, tokens_and_mask, TRACE_SEQ, SEQS, TEXT),
    "gpt2": Case(gpt2, tokens_and_mask, TRACE_SEQ, SEQS, TEXT),
    "t5_encoder": Case(t5_encoder, tokens_and_mask, TRACE_SEQ, SEQS, TEXT),
    # ViT takes other image sizes only with interpolate_pos_encoding: batch only.
    "vit": Case(vit, pixels, (16, 16), ((16, 16),), BATCH_ONLY),
    # Swin pads to its patches and windows and builds the shifted-window mask from the size in
    # forward; MobileViT's unfold reshapes from the shape. Both take other sizes as long as the
    # branches the trace took (no padding, shifted windows, no interpolation in unfold) hold.
    "swin": Case(swin, pixels, (16, 16), ((16, 24), (24, 16)), TOKENS_OUT),
    "mobilevit": Case(mobilevit, pixels, (64, 64), ((64, 128), (128, 64)), MAP_OUT),
    # The same two exported with only the batch dynamic, as most exports are.
    "swin_batch": Case(swin, pixels, (16, 16), ((16, 16),), BATCH_ONLY),
    "mobilevit_batch": Case(mobilevit, pixels, (64, 64), ((64, 64),), BATCH_ONLY),
}

def feeds_for(name: str, batch: int, size, seed: int) -> dict[str, np.ndarray]:
    return CASES[name].feeds(batch, size, np.random.default_rng(seed))


@lru_cache(maxsize=None)
def model_of(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return CASES[name].make().eval()


@lru_cache(maxsize=None)
def exported(name: str) -> bytes:
    case, model = CASES[name], model_of(name)
    feeds = feeds_for(name, TRACE_BATCH, case.trace, 0)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(a) for a in feeds.values()), buffer, dynamo=False,
                          opset_version=17, input_names=list(feeds), output_names=["y"],
                          dynamic_axes={k: v for k, v in case.dynamic.items() if k in feeds or k == "y"})
    return buffer.getvalue()


@pytest.mark.parametrize("name", list(CASES))
def test_onnxruntime_runs_the_export_as_torch_runs_the_model(name):
    """The reference is right at the sizes the tests run: the trace baked none of its own sizes in
    (an export that did would make every comparison below a comparison against the wrong answer),
    and the output is not degenerate (all zeros would match anything)."""
    session = ort.InferenceSession(exported(name), providers=["CPUExecutionProvider"])
    for size in CASES[name].sizes:
        for batch in BATCHES:
            feeds = feeds_for(name, batch, size, batch)
            with torch.no_grad():
                want = model_of(name)(*(torch.from_numpy(a) for a in feeds.values())).numpy()
            got = session.run(None, feeds)[0]
            assert got.shape == want.shape and want.std() > 1e-2, f"{name} batch={batch} size={size}"
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{name} batch={batch} size={size}")


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_and_compiled_module_match_onnxruntime(name, build_cache):
    match_onnxruntime(name, exported(name), lambda batch, size, seed: feeds_for(name, batch, size, seed),
                      CASES[name].sizes, build_cache)
