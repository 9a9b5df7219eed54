"""Small torch models in the style of the architectures people export: ViT,
Swin, ConvNeXt, EfficientNet, MobileNetV3, a GroupNorm CNN, an AlexNet-style LRN network, a
U-Net for an old opset (``Upsample``) and a BERT-style encoder with attention masks.

Each is a few layers at small sizes so that exporting, importing and running it takes well under
a second; the ops each style is about are kept (see ``test_exports.EXPECTED_OPS``). Weights are
random from a fixed seed, and :func:`randomise_statistics` randomises every normalisation's
statistics and affine parameters (and ConvNeXt's layer scale), so an importer or pass that dropped
or mis-ordered any of them would change the outputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def randomise_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BatchNorm running statistics, random affine parameters of BatchNorm, GroupNorm,
    LayerNorm and InstanceNorm, and random layer-scale vectors (parameters named ``gamma``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                              nn.modules.instancenorm._InstanceNorm)) and getattr(m, "weight", None) is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] == "gamma":
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.1)
    return model


# ---------------------------------------------------------------- attention shared by ViT / BERT


class Attention(nn.Module):
    """Multi-head self-attention written out (MatMul, Softmax, Transpose, Reshape); an optional
    additive mask broadcast over heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5
        if mask is not None:
            scores = scores + mask
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Mlp(nn.Sequential):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=1e-6), Mlp(dim, 2 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch-embedding conv, class token (expanded to the batch and concatenated), learned
    positional embedding, pre-norm blocks, LayerNorm, the class token's head."""

    def __init__(self, image: int = 16, patch: int = 4, dim: int = 32, depth: int = 2, heads: int = 4,
                 classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.5)
        self.blocks = nn.Sequential(*(ViTBlock(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


# ---------------------------------------------------------------- Swin


def shifted_window_mask(img_mask: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """(windows, N, N) additive mask from a (1, Hp, Wp, 1) zero tensor: -100 between tokens of one
    shifted window that came from different regions of the unrolled image (Swin's own code)."""
    slices = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    count = 0
    for hs in slices:
        for ws in slices:
            img_mask[:, hs, ws, :] = count
            count += 1
    windows = window_partition(img_mask, window).reshape(-1, window * window)
    mask = windows[:, None, :] - windows[:, :, None]
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * H/window * W/window, window * window, C)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


class SwinBlock(nn.Module):
    """Windowed attention over (B, H, W, C) tokens with relative position bias; every other block
    shifts its windows by half a window (a cyclic ``torch.roll``, which the exporter writes as
    Slice + Concat) and masks attention across the seams.

    The padding that makes H and W multiples of the window is computed from the runtime shape with
    ``%`` (as Hugging Face's Swin does), so the export has ``Mod`` on shape values. The shifted
    window mask is either a buffer computed for the padded grid (timm: ``grid`` given) or
    computed in ``forward`` from the runtime shape (Hugging Face: ``grid=None``), which exports
    ConstantOfShape, ScatterND, Equal and Where."""

    def __init__(self, dim: int, heads: int, window: int, shift: int, grid: tuple[int, int] | None) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = Mlp(dim, 2 * dim)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.5)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("rel_index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)
        mask = None
        if shift and grid is not None:
            hp, wp = (-(-g // window) * window for g in grid)
            mask = shifted_window_mask(torch.zeros(1, hp, wp, 1), window, shift)
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x):
        b, h, w, c = x.shape
        ws, n = self.window, self.window * self.window
        shortcut = x
        x = self.norm1(x)
        pad_b = (ws - h % ws) % ws  # Mod on the runtime shape, as in Hugging Face's Swin
        pad_r = (ws - w % ws) % ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        hp, wp = x.shape[1], x.shape[2]
        if self.shift:
            x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
        qkv = self.qkv(window_partition(x, ws)).reshape(-1, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        bias = self.bias_table[self.rel_index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
        attn = attn + bias[None]
        if self.shift:
            mask = self.attn_mask
            if mask is None:
                mask = shifted_window_mask(x.new_zeros((1, hp, wp, 1)), ws, self.shift)
            attn = attn.reshape(-1, mask.shape[0], self.heads, n, n) + mask[None, :, None]
            attn = attn.reshape(-1, self.heads, n, n)
        y = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, n, c)
        y = self.proj(y).reshape(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        x = shortcut + y[:, :h, :w, :]
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm, self.reduction = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x))


class Swin(nn.Module):
    """Patch embedding, then per stage a (regular, shifted) pair of window blocks, with patch
    merging between stages; mean-pooled head. At the default sizes the second stage's 6x6 grid is
    padded to the 4x4 windows. ``runtime_mask``: compute the shifted-window masks in ``forward``
    (Hugging Face) instead of as buffers (timm)."""

    def __init__(self, image: int = 24, patch: int = 2, dim: int = 16, window: int = 4, heads: int = 2,
                 stages: int = 2, classes: int = 10, runtime_mask: bool = False) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.norm0 = nn.LayerNorm(dim)
        layers: list[nn.Module] = []
        size = image // patch
        for stage in range(stages):
            if stage:
                layers.append(PatchMerging(dim))
                dim, heads, size = 2 * dim, 2 * heads, size // 2
            grid = None if runtime_mask else (size, size)
            layers += [SwinBlock(dim, heads, window, 0, grid), SwinBlock(dim, heads, window, window // 2, grid)]
        self.layers = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.layers(self.norm0(self.patch_embed(x).permute(0, 2, 3, 1)))
        return self.head(self.norm(x).mean((1, 2)))


# ---------------------------------------------------------------- ConvNeXt


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor: permute to NHWC, normalise, permute back."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))  # layer scale (randomised by the tests)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims: tuple[int, ...] = (16, 32), classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, dim in enumerate(dims):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim), ConvNeXtBlock(dim)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


# ---------------------------------------------------------------- EfficientNet / MobileNetV3


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, act: type[nn.Module], gate: type[nn.Module]) -> None:
        super().__init__()
        self.reduce, self.act = nn.Conv2d(channels, squeezed, 1), act()
        self.expand, self.gate = nn.Conv2d(squeezed, channels, 1), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


def conv_bn(cin: int, cout: int, k: int, stride: int, act: type[nn.Module] | None, groups: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class MBConv(nn.Module):
    """Inverted residual: expand 1x1, depthwise kxk, squeeze-excite, project 1x1 (no activation)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int, act: type[nn.Module],
                 se_act: type[nn.Module], gate: type[nn.Module], se_ratio: float) -> None:
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(
            *([conv_bn(cin, hidden, 1, 1, act)] if expand != 1 else []),
            conv_bn(hidden, hidden, k, stride, act, groups=hidden),
            SqueezeExcite(hidden, max(4, int(hidden * se_ratio)), se_act, gate),
            conv_bn(hidden, cout, 1, 1, None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class EfficientNet(nn.Module):
    """EfficientNet-B0's layout, shortened: SiLU everywhere, squeeze-excite gated by a sigmoid."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        cfg = ((1, 3, 1, 8), (4, 3, 2, 16), (4, 5, 2, 24), (4, 3, 1, 24))  # expand, kernel, stride, channels
        layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, nn.SiLU)]
        cin = 16
        for expand, k, stride, cout in cfg:
            layers.append(MBConv(cin, cout, k, stride, expand, nn.SiLU, nn.SiLU, nn.Sigmoid, 0.25 / expand))
            cin = cout
        layers.append(conv_bn(cin, 64, 1, 1, nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class MobileNetV3(nn.Module):
    """MobileNetV3-Small's layout, shortened: HardSwish, ReLU, squeeze-excite gated by a
    Hardsigmoid, Hardswish in the classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        cfg = ((16, 3, 1, 2, True, nn.ReLU), (24, 3, 4, 2, False, nn.ReLU), (24, 5, 3, 1, True, nn.Hardswish),
               (40, 5, 3, 2, True, nn.Hardswish))  # channels, kernel, expand, stride, se, activation
        layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, nn.Hardswish)]
        cin = 16
        for cout, k, expand, stride, se, act in cfg:
            hidden = cin * expand
            block = [conv_bn(cin, hidden, 1, 1, act)] if expand != 1 else []
            block.append(conv_bn(hidden, hidden, k, stride, act, groups=hidden))
            if se:
                block.append(SqueezeExcite(hidden, max(8, hidden // 4), nn.ReLU, nn.Hardsigmoid))
            block.append(conv_bn(hidden, cout, 1, 1, None))
            layers.append(_Residual(nn.Sequential(*block)) if stride == 1 and cin == cout else nn.Sequential(*block))
            cin = cout
        layers.append(conv_bn(cin, 96, 1, 1, nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class _Residual(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return x + self.block(x)


# ---------------------------------------------------------------- GroupNorm CNN, LRN network


class GroupNormCNN(nn.Module):
    """What DP-SGD trains (Opacus refuses BatchNorm): conv + GroupNorm + ReLU, one GroupNorm per
    channel (= InstanceNorm) and a LayerNorm-like GroupNorm(1, C) among them."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(32, 32, eps=1e-3), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(1, 32), nn.Tanh(),
            nn.AvgPool2d(2))
        self.classifier = nn.Linear(32 * 2 * 2, classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class _LRNFunction(torch.autograd.Function):
    """``F.local_response_norm`` in torch, the ONNX ``LRN`` op in the export (torch writes the
    functional form as Pad/AvgPool/Pow, and an ``If``, instead; Caffe-era AlexNet exports have LRN)."""

    @staticmethod
    def forward(ctx, x, size: int, alpha: float, beta: float, k: float):
        return F.local_response_norm(x, size, alpha, beta, k)

    @staticmethod
    def symbolic(g, x, size: int, alpha: float, beta: float, k: float):
        return g.op("LRN", x, size_i=size, alpha_f=alpha, beta_f=beta, bias_f=k)


class LRN(nn.LocalResponseNorm):
    def forward(self, x):
        return _LRNFunction.apply(x, self.size, self.alpha, self.beta, self.k)


class AlexNetLRN(nn.Module):
    """AlexNet / ZFNet style: large strided first conv, ReLU, LocalResponseNorm, overlapping
    max pooling, dropout classifier (identity in eval)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 7, 2, 2), nn.ReLU(), LRN(5, alpha=1e-2, beta=0.75, k=2.0),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(16, 24, 5, padding=2), nn.ReLU(), LRN(3, alpha=5e-2, beta=0.5, k=1.0),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(24, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(32 * 3 * 3, 64), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------- U-Net for an old opset


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNetUpsample(nn.Module):
    """The original U-Net's shape at small size, decoding with ``nn.Upsample`` (nearest, and
    bilinear without corner alignment) as exports from before Resize (opset 9) wrote it."""

    def __init__(self, cin: int = 3, classes: int = 2) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = double_conv(cin, 8), double_conv(8, 16), double_conv(16, 32)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec2 = double_conv(32 + 16, 16)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec1 = double_conv(16 + 8, 8)
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


# ---------------------------------------------------------------- BERT-style encoder


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn, self.norm1 = Attention(dim, heads), nn.LayerNorm(dim, eps=1e-12)
        self.mlp, self.norm2 = Mlp(dim, 4 * dim), nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x, mask):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.mlp(x))


class BertEncoder(nn.Module):
    """BERT/RoBERTa-style encoder over ``(input_ids, attention_mask)``: position ids from a
    cumulative sum of the mask (RoBERTa's padding-aware positions: CumSum), token types sliced from
    a buffer and expanded to the batch (Hugging Face BERT: Slice, Expand), an ALiBi distance bias
    per head from ``arange`` over the runtime sequence length (Range), padding masked out of
    attention by ``Where`` on the mask expanded to heads and query positions (Expand); the output
    is the sequence and a pooled first token."""

    PAD = 1

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, depth: int = 2, positions: int = 40) -> None:
        super().__init__()
        self.heads = heads
        self.word = nn.Embedding(vocab, dim, padding_idx=self.PAD)
        self.position = nn.Embedding(positions, dim, padding_idx=self.PAD)
        self.token_type = nn.Embedding(2, dim)
        self.register_buffer("token_type_ids", (torch.arange(positions) >= 6).long()[None], persistent=False)
        self.register_buffer("slopes", 2.0 ** -torch.arange(1, heads + 1, dtype=torch.float32), persistent=False)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(dim, heads) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask):
        b, t = input_ids.shape
        mask = attention_mask.to(torch.int64)
        position_ids = torch.cumsum(mask, dim=1) * mask + self.PAD  # padding keeps PAD's position
        token_type = self.token_type_ids[:, :t].expand(b, t)
        x = self.norm(self.word(input_ids) + self.position(position_ids) + self.token_type(token_type))
        steps = torch.arange(t, device=input_ids.device)
        distance = (steps[None, :] - steps[:, None]).abs().to(x.dtype)
        alibi = -self.slopes[:, None, None] * distance  # (heads, t, t)
        keep = attention_mask[:, None, None, :].to(torch.bool).expand(b, self.heads, t, t)
        additive = torch.where(keep, alibi, torch.tensor(torch.finfo(x.dtype).min))
        for layer in self.layers:
            x = layer(x, additive)
        return torch.cat([x, torch.tanh(self.pool(x[:, :1]))], dim=1)
