"""PyTorch modules of the transformer records (`hpcbench.workloads.blocks`), on PyTorch's
fast paths: attention is `torch.nn.functional.scaled_dot_product_attention` (fused: flash or
memory-efficient kernels on CUDA, the fused CPU kernel on the CPU; grouped-query heads by
`enable_gqa`), norms are `nn.LayerNorm` and `nn.RMSNorm`, every matrix an `nn.Linear`.

Weights start as GPT-2's and Llama's do: matrices and tables normal(0, 0.02), biases zero,
norm scales one; torch's seed makes them equal on every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hpcbench.workloads import zoo
from hpcbench.workloads.shapes import kv_width

INIT_STD = 0.02


def _linear(fan_in: int, fan_out: int, bias: bool) -> nn.Linear:
    layer = nn.Linear(fan_in, fan_out, bias=bias)
    nn.init.normal_(layer.weight, std=INIT_STD)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class Embedding(nn.Module):
    def __init__(self, record: zoo.Embedding) -> None:
        super().__init__()
        self.table = nn.Embedding(record.vocab, record.dim)
        nn.init.normal_(self.table.weight, std=INIT_STD)
        self.types = nn.Embedding(record.types, record.dim) if record.types else None
        if self.types is not None:
            nn.init.normal_(self.types.weight, std=INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.table(ids)
        if self.types is not None:
            out = out + self.types.weight[0]  # every token of type 0 (one segment)
        return out


class Positions(nn.Module):
    def __init__(self, record: zoo.Positions, dim: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(record.max_len, dim) * INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[1]]


class Patches(nn.Module):
    def __init__(self, record: zoo.Patches, shape: zoo.Shape) -> None:
        super().__init__()
        channels, height, width = shape
        tokens = (height // record.patch) * (width // record.patch) + 1
        self.project = nn.Conv2d(channels, record.dim, record.patch, record.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, record.dim))
        self.positions = nn.Parameter(torch.randn(1, tokens, record.dim) * INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.project(x).flatten(2).transpose(1, 2)  # (B, N, D)
        return torch.cat([self.cls.expand(len(x), -1, -1), patches], dim=1) + self.positions


def norm(record: zoo.Norm, dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=record.eps) if record.kind == "layer" else nn.RMSNorm(dim, eps=record.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions, "rotate half" convention: pairs (i, i + d/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    inverse: torch.Tensor | None

    def __init__(self, record: zoo.Attention, dim: int) -> None:
        super().__init__()
        self.heads, self.groups, self.causal = record.heads, record.groups, record.causal
        self.width = dim // record.heads
        kv = kv_width(record, dim)
        self.q = _linear(dim, dim, record.bias)
        self.k = _linear(dim, kv, record.bias)
        self.v = _linear(dim, kv, record.bias)
        self.out = _linear(dim, dim, record.bias)
        self.rotary = record.rotary
        inverse = record.rope_theta ** (-torch.arange(0, self.width, 2, dtype=torch.float32) / self.width)
        # rotary's inverse frequencies (None: no rotary positions)
        self.register_buffer("inverse", inverse if record.rotary else None, persistent=False)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """The heads' attended values, (B, S, heads * width): the output matrix's input (with
        tensor parallelism, this rank's heads only)."""
        batch, tokens, _ = x.shape
        q = self.q(x).view(batch, tokens, self.heads, self.width).transpose(1, 2)
        k = self.k(x).view(batch, tokens, self.groups, self.width).transpose(1, 2)
        v = self.v(x).view(batch, tokens, self.groups, self.width).transpose(1, 2)
        if self.inverse is not None:
            angles = torch.outer(torch.arange(tokens, device=x.device, dtype=torch.float32), self.inverse)
            angles = torch.cat([angles, angles], dim=-1)
            cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.groups != self.heads)
        return attended.transpose(1, 2).reshape(batch, tokens, self.heads * self.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attend(x))  # type: ignore[no-any-return]


class FeedForward(nn.Module):
    def __init__(self, record: zoo.FeedForward, dim: int) -> None:
        super().__init__()
        self.swiglu = record.kind == "swiglu"
        self.up = _linear(dim, record.hidden, record.bias)
        self.gate = _linear(dim, record.hidden, record.bias) if self.swiglu else None
        self.down = _linear(record.hidden, dim, record.bias)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden layer's activations: the down matrix's input."""
        return F.silu(self.gate(x)) * self.up(x) if self.gate is not None else F.gelu(self.up(x), approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.hidden(x))  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, record: zoo.Block, dim: int) -> None:
        super().__init__()
        self.pre_norm = record.pre_norm
        self.norm1 = norm(record.norm, dim)
        self.attention = Attention(record.attention, dim)
        self.norm2 = norm(record.norm, dim)
        self.mlp = FeedForward(record.mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))  # type: ignore[no-any-return]
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))  # type: ignore[no-any-return]


class TokenHead(nn.Module):
    """Logits over the vocabulary: the embedding's table (tied) or a matrix of its own."""

    def __init__(self, record: zoo.TokenHead, dim: int, embedding: Embedding | None) -> None:
        super().__init__()
        if record.tied and embedding is None:
            raise ValueError("a tied token head needs an Embedding before it")
        # a list: the embedding is not registered twice as a child
        self.tied_to: list[Embedding] = [embedding] if embedding is not None and record.tied else []
        self.matrix = None if record.tied else nn.Parameter(torch.randn(record.vocab, dim) * INIT_STD)
        self.bias = nn.Parameter(torch.zeros(record.vocab)) if record.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.tied_to[0].table.weight if self.tied_to else self.matrix
        assert weight is not None
        return F.linear(x, weight, self.bias)


class Pooling(nn.Module):
    def __init__(self, record: zoo.Pooling) -> None:
        super().__init__()
        self.first = record.kind == "first"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] if self.first else x.mean(dim=1)


def module(layer: zoo.Layer, shape: zoo.Shape, embedding: Embedding | None) -> nn.Module | None:
    """The module of a transformer record with input `shape`, or None for another record."""
    if isinstance(layer, zoo.Embedding):
        return Embedding(layer)
    if isinstance(layer, zoo.Positions):
        return Positions(layer, shape[-1])
    if isinstance(layer, zoo.Patches):
        return Patches(layer, shape)
    if isinstance(layer, zoo.Norm):
        return norm(layer, shape[-1])
    if isinstance(layer, zoo.Block):
        return Block(layer, shape[-1])
    if isinstance(layer, zoo.TokenHead):
        return TokenHead(layer, shape[-1], embedding)
    if isinstance(layer, zoo.Pooling):
        return Pooling(layer)
    return None
