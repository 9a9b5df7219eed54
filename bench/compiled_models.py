"""Torch models for bench/bench_compiled.py: full-size architectures written
out in torch (torchvision is not installed), random weights from a fixed seed, every BatchNorm's
running statistics and affine parameters randomised (and ConvNeXt's layer scale), eval mode.

Each :class:`Spec` gives the torch module, the input shape without the batch, and the ONNX opset to
export at. The digits CNN's ONNX comes from :func:`cuvil_edge.frontend.demo_model.digits_cnn_onnx`;
:class:`DigitsCNN` rebuilds the same network in torch from that model's initializers so torch eager
runs the same weights."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "architectures"))
from export_models import ConvNeXtBlock, LayerNorm2d  # noqa: E402


def randomise_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BatchNorm running statistics, random affine parameters of BatchNorm and LayerNorm,
    random layer-scale vectors (parameters named ``gamma``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm)) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.5 + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] == "gamma":
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.1)
    return model


# ---------------------------------------------------------------- small models


class MLP(nn.Sequential):
    """30-64-64-2 with ReLU."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


class DigitsCNN(nn.Module):
    """cuvil_edge.frontend.demo_model's digits CNN (8x8 input) with the weights of its ONNX:
    x * scale + shift -> Conv 3x3 pad 1 -> ReLU -> MaxPool 2 -> Flatten -> Linear -> Softmax."""

    def __init__(self, onnx_bytes: bytes) -> None:
        super().__init__()
        w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
             for t in onnx.load_from_string(onnx_bytes).graph.initializer}
        channels = w["conv.weight"].shape[0]
        self.register_buffer("scale", w["input.scale"])
        self.register_buffer("shift", w["input.shift"])
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.fc = nn.Linear(w["fc.weight"].shape[1], 10)
        with torch.no_grad():
            self.conv.weight.copy_(w["conv.weight"])
            self.conv.bias.copy_(w["conv.bias"])
            self.fc.weight.copy_(w["fc.weight"])
            self.fc.bias.copy_(w["fc.bias"])

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x * self.scale + self.shift)), 2)
        return torch.softmax(self.fc(torch.flatten(x, 1)), dim=1)


class CNN28(nn.Module):
    """A LeNet-style CNN on 28x28 greyscale: two conv 3x3 (16, 32 channels) + ReLU + max pool,
    then 1568 -> 128 -> 10."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------- ResNet-18 / ResNet-50


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
            act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, width, 3, stride), conv_bn(width, width, 3, act=None))
        self.down = conv_bn(cin, width, 1, stride, act=None) if stride != 1 or cin != width else None

    def forward(self, x):
        return F.relu(self.body(x) + (x if self.down is None else self.down(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, cout, 1, act=None))
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x):
        return F.relu(self.body(x) + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """torchvision's ResNet layout (stride in the 3x3 conv of a bottleneck, as v1.5), 1000 classes."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], depths: tuple[int, ...]) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = 64
        for stage, (width, n) in enumerate(zip((64, 128, 256, 512), depths)):
            for i in range(n):
                layers.append(block(cin, width, 2 if stage and not i else 1))
                cin = width * block.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 1000)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


# ---------------------------------------------------------------- MobileNetV2


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(
            *([conv_bn(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []),
            conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            conv_bn(hidden, cout, 1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 1.0 (t, c, n, s settings of the paper), 1000 classes."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---------------------------------------------------------------- EfficientNet-B0


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    """Expand 1x1 (SiLU), depthwise kxk (SiLU), squeeze-excite (a quarter of the block's input
    channels, sigmoid gate), project 1x1; residual when shapes allow."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(
            *([conv_bn(cin, hidden, 1, act=nn.SiLU)] if expand != 1 else []),
            conv_bn(hidden, hidden, k, stride, groups=hidden, act=nn.SiLU),
            SqueezeExcite(hidden, max(1, cin // 4)),
            conv_bn(hidden, cout, 1, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class EfficientNetB0(nn.Module):
    """EfficientNet-B0's layout (expand, kernel, stride, channels, repeats), 1000 classes."""

    SETTINGS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.SiLU)]
        cin = 32
        for expand, k, stride, cout, n in self.SETTINGS:
            for i in range(n):
                layers.append(MBConv(cin, cout, k, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---------------------------------------------------------------- ConvNeXt


# LayerNorm2d and ConvNeXtBlock: the architecture tests' own (tests/architectures/export_models.py)


class ConvNeXt(nn.Module):
    """ConvNeXt's layout (patchify stem 4x4/4 + LayerNorm, LayerNorm + 2x2/2 downsampling, blocks),
    1000 classes. Defaults are timm's ConvNeXt-pico: dims (64, 128, 256, 512), depths (2, 2, 6, 2)."""

    def __init__(self, dims: tuple[int, ...] = (64, 128, 256, 512), depths: tuple[int, ...] = (2, 2, 6, 2)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (dim, n) in enumerate(zip(dims, depths)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(n)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], 1000)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


# ---------------------------------------------------------------- transformer encoder


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer with attention written out (MatMul, Softmax, Transpose, Reshape),
    GELU feed-forward of 4x the width."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.softmax((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.norm2(x))


class TransformerEncoder(nn.Module):
    """4 pre-norm layers, width 256, 8 heads, over (batch, 128 tokens, 256) embeddings; final LayerNorm."""

    def __init__(self, dim: int = 256, heads: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(EncoderLayer(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.layers(x))


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class Spec:
    title: str
    make: Callable[[], nn.Module]
    shape: tuple[int, ...]  # input shape without the batch
    opset: int = 17
    big: bool = False  # a 224x224-class model: fewer samples at batch 16


def _digits() -> nn.Module:
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx
    return DigitsCNN(digits_cnn_onnx())


SPECS: dict[str, Spec] = {
    "mlp": Spec("MLP 30-64-64-2", MLP, (30,)),
    "digits_cnn": Spec("digits CNN 8x8", _digits, (1, 8, 8), opset=13),
    "cnn28": Spec("CNN 28x28", CNN28, (1, 28, 28)),
    "resnet18": Spec("ResNet-18 224", lambda: ResNet(BasicBlock, (2, 2, 2, 2)), (3, 224, 224), big=True),
    "resnet50": Spec("ResNet-50 224", lambda: ResNet(Bottleneck, (3, 4, 6, 3)), (3, 224, 224), big=True),
    "mobilenetv2": Spec("MobileNetV2 224", MobileNetV2, (3, 224, 224), big=True),
    "efficientnet": Spec("EfficientNet-B0 224", EfficientNetB0, (3, 224, 224), big=True),
    "convnext": Spec("ConvNeXt-pico 224", ConvNeXt, (3, 224, 224), big=True),
    "transformer": Spec("Transformer 4x256, 8 heads, 128 tokens", TransformerEncoder, (128, 256), big=True),
}


def make(name: str, seed: int = 0) -> nn.Module:
    """The model ``name`` with random weights from ``seed``, statistics randomised, in eval mode."""
    torch.manual_seed(seed)
    return randomise_statistics(SPECS[name].make(), seed).eval()


def example(name: str, batch: int, seed: int = 0) -> np.ndarray:
    """A float32 input for ``name`` at ``batch`` (uniform [0, 1) for the digits CNN's raw pixels)."""
    rng = np.random.default_rng(seed)
    shape = (batch, *SPECS[name].shape)
    if name == "digits_cnn":
        return rng.random(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32)
