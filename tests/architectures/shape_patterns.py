"""Torch modules that compute shapes the way the big model libraries do, from ``x.shape`` at run
time, so an export with dynamic axes holds ``Shape -> Gather -> Div/Mul -> Concat -> Reshape``,
``Range`` over the batch or the sequence, ``Expand`` to a computed shape, ``Pad`` by computed pads
and slices to a computed length. Written after (not copied from) transformers' mask builders and
attention layers, torchvision's ViT and Swin, and MobileViT's unfold; tiny sizes, random weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

NEG = torch.finfo(torch.float32).min


def heads_attention(x: torch.Tensor, qkv: nn.Linear, out: nn.Linear, heads: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head self-attention with the head split read from ``x.shape`` (ViT / BERT style)."""
    batch, tokens, channels = x.shape
    q, k, v = qkv(x).reshape(batch, tokens, 3, heads, channels // heads).permute(2, 0, 3, 1, 4).unbind(0)
    scores = q @ k.transpose(-2, -1) / math.sqrt(channels // heads)
    if bias is not None:
        scores = scores + bias
    attended = scores.softmax(-1) @ v
    return out(attended.transpose(1, 2).reshape(batch, tokens, channels))


class BertMask(nn.Module):
    """A text encoder whose padding mask is indexed with ``torch.arange(batch)`` and
    ``torch.arange(seq)`` (transformers' shared mask builder) and whose positions are
    ``arange(seq)`` expanded to the batch."""

    def __init__(self, vocab: int = 40, dim: int = 32, heads: int = 4, max_positions: int = 64) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_positions, dim)
        self.qkv, self.out, self.norm, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.LayerNorm(dim), heads

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, seq = input_ids.shape
        positions = torch.arange(seq).unsqueeze(0).expand(batch, -1)
        x = self.tokens(input_ids) + self.positions(positions)
        batch_index = torch.arange(batch)[:, None, None, None]
        kv_index = torch.arange(seq)[None, None, None, :]
        allowed = attention_mask.bool()[batch_index, kv_index]  # (batch, 1, 1, seq)
        bias = torch.where(allowed, 0.0, NEG)
        return self.norm(x + heads_attention(x, self.qkv, self.out, self.heads, bias))


class GPT2Causal(nn.Module):
    """A decoder block with GPT-2's causal mask: a lower-triangular buffer of the longest sequence
    sliced to ``[k_len - q_len : k_len, :k_len]``, positions from ``arange(seq)``."""

    def __init__(self, vocab: int = 40, dim: int = 32, heads: int = 4, max_positions: int = 64) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(max_positions, dim)
        self.qkv, self.out, self.norm, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.LayerNorm(dim), heads
        causal = torch.tril(torch.ones(max_positions, max_positions, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, max_positions, max_positions), persistent=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        batch, seq = input_ids.shape
        x = self.tokens(input_ids) + self.positions(torch.arange(0, seq, dtype=torch.long).unsqueeze(0))
        h = self.norm(x)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=2)
        split = lambda t: t.view(batch, seq, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        q_len, k_len = q.size(-2), k.size(-2)
        mask = self.bias[:, :, k_len - q_len: k_len, :k_len]
        scores = torch.where(mask, scores, torch.tensor(NEG, dtype=scores.dtype))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).contiguous()
        return self.head(x + self.out(attended.view(batch, seq, -1)))


class ViTShape(nn.Module):
    """torchvision's ViT input path: ``n, c, h, w = x.shape``, the patch grid ``h // p`` and
    ``w // p`` reshaped from the convolution, the class token expanded to ``n``, position
    embeddings sliced to the token count (any image size that is a multiple of the patch)."""

    def __init__(self, patch: int = 8, dim: int = 32, heads: int = 4, max_tokens: int = 65) -> None:
        super().__init__()
        self.patch, self.dim, self.heads = patch, dim, heads
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embedding = nn.Parameter(torch.randn(1, max_tokens, dim) * 0.02)
        self.qkv, self.out, self.norm = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        n_h, n_w = h // self.patch, w // self.patch
        x = self.conv_proj(x).reshape(n, self.dim, n_h * n_w).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = x + self.pos_embedding[:, : x.shape[1]]
        x = x + heads_attention(self.norm(x), self.qkv, self.out, self.heads)
        return x[:, 0]


class SwinShape(nn.Module):
    """torchvision's shifted-window attention on ``(B, H, W, C)``: pads to a window multiple
    computed from ``x.shape``, window partition ``view(B, pH // ws, ws, pW // ws, ws, C)``, the
    shift mask built in forward on a ``new_zeros((pH, pW))`` by slice assignment, the windows'
    attention viewed as ``(B·nW) // nW``, then the padding cropped to ``x[:, :H, :W]``."""

    def __init__(self, dim: int = 16, heads: int = 2, window: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.ws, self.shift, self.heads = window, shift, heads
        self.qkv, self.proj, self.norm = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        ws, shift = self.ws, self.shift
        h = self.norm(x)
        pad_r, pad_b = (ws - W % ws) % ws, (ws - H % ws) % ws
        h = F.pad(h, (0, 0, 0, pad_r, 0, pad_b))
        _, pH, pW, _ = h.shape
        h = torch.roll(h, shifts=(-shift, -shift), dims=(1, 2))
        windows = h.view(B, pH // ws, ws, pW // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(
            B * (pH // ws) * (pW // ws), ws * ws, C)
        q, k, v = self.qkv(windows).reshape(windows.size(0), ws * ws, 3, self.heads, C // self.heads).permute(
            2, 0, 3, 1, 4)
        attn = (q * (C // self.heads) ** -0.5) @ k.transpose(-2, -1)
        mask = h.new_zeros((pH, pW))
        slices = ((0, -ws), (-ws, -shift), (-shift, None))
        count = 0
        for hs in slices:
            for wsl in slices:
                mask[hs[0]:hs[1], wsl[0]:wsl[1]] = count
                count += 1
        mask = mask.view(pH // ws, ws, pW // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        windows_count = mask.size(0)
        attn = attn.view(windows.size(0) // windows_count, windows_count, self.heads, ws * ws, ws * ws)
        attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, self.heads, ws * ws, ws * ws)
        y = (attn.softmax(-1) @ v).transpose(1, 2).reshape(windows.size(0), ws * ws, C)
        y = self.proj(y).view(B, pH // ws, pW // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, pH, pW, C)
        y = torch.roll(y, shifts=(shift, shift), dims=(1, 2))
        return x + y[:, :H, :W, :].contiguous()


class UnfoldShape(nn.Module):
    """MobileViT's unfold and fold: ``reshape(batch * channels * patches_h, ph, patches_w, pw)``
    and back, with the patch counts read from ``features.shape``."""

    def __init__(self, channels: int = 8, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.local = nn.Conv2d(channels, channels, 3, padding=1)
        self.mix = nn.Linear(channels, channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features = self.local(features)
        batch, channels, height, width = features.shape
        ph = pw = self.patch
        nph, npw = height // ph, width // pw
        patches = features.reshape(batch * channels * nph, ph, npw, pw).transpose(1, 2)
        patches = patches.reshape(batch, channels, nph * npw, ph * pw).transpose(1, 3)
        patches = patches.reshape(batch * ph * pw, nph * npw, -1)
        patches = self.mix(patches)
        folded = patches.contiguous().view(batch, ph * pw, nph * npw, -1).transpose(1, 3)
        folded = folded.reshape(batch * channels * nph, npw, ph, pw).transpose(1, 2)
        return folded.reshape(batch, channels, nph * ph, npw * pw)
