"""Tensor parallelism: Megatron-LM's split of each transformer block over the `tp` group.

Attention's query, key and value matrices are split by heads (columns), its output matrix
by rows; the MLP's up (and gate) matrix by columns, its down matrix by rows. A block's input
enters each half through `f` (identity forward, all-reduce of its gradient backward) and
each half's output leaves through `g` (all-reduce forward, identity backward): two
all-reduces of the activations per block forward and two of their gradients backward, each
a `/comm` row of axis `tp`. Embeddings, norms and the head stay whole on every rank: their
inputs and gradients are the same on every rank of the group, so are their gradients.

The split is made from the whole model built with the point's seed, so the weights are
those of the unsplit model; `SPLIT` marks the parameters each rank holds a part of (the
checksum counts the others once per group). DTensor's `parallelize_module` does the same
split, but its collectives run inside the dispatcher where nothing times them one by one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpcbench.frameworks.torch import blocks
from hpcbench.frameworks.torch.mesh import Traced

SPLIT = "_hpcbench_tp_split"  # attribute set on a parameter that holds this rank's part


class _Enter(torch.autograd.Function):
    """f: the block's input as is; its gradient summed over the group."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, traced: Traced, name: str) -> torch.Tensor:
        ctx.traced, ctx.name = traced, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        ctx.traced.all_reduce(grad, ctx.name)
        return grad, None, None


class _Leave(torch.autograd.Function):
    """g: the partial outputs summed over the group; the gradient as is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, traced: Traced, name: str) -> torch.Tensor:
        out = x.contiguous().clone()
        traced.all_reduce(out, name)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


def _rows(layer: nn.Linear, index: int, parts: int) -> None:
    """Keep this rank's block of output features (a column split of the matrix x @ W.T)."""
    size = layer.out_features // parts
    keep = slice(index * size, (index + 1) * size)
    layer.weight = nn.Parameter(layer.weight.detach()[keep].clone())
    setattr(layer.weight, SPLIT, True)
    if layer.bias is not None:
        layer.bias = nn.Parameter(layer.bias.detach()[keep].clone())
        setattr(layer.bias, SPLIT, True)
    layer.out_features = size


def _columns(layer: nn.Linear, index: int, parts: int) -> nn.Parameter | None:
    """Keep this rank's block of input features (a row split); the bias is returned to be
    added once, after the sum."""
    size = layer.in_features // parts
    layer.weight = nn.Parameter(layer.weight.detach()[:, index * size : (index + 1) * size].clone())
    setattr(layer.weight, SPLIT, True)
    layer.in_features = size
    bias = layer.bias
    layer.bias = None  # type: ignore[assignment]
    return bias


class SplitAttention(nn.Module):
    def __init__(self, whole: blocks.Attention, traced: Traced, index: int, parts: int, name: str) -> None:
        super().__init__()
        self.inner = whole
        self.traced, self.name = traced, name
        for layer in (whole.q, whole.k, whole.v):
            _rows(layer, index, parts)
        self.bias = _columns(whole.out, index, parts)
        whole.heads //= parts
        whole.groups //= parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _Enter.apply(x, self.traced, self.name)  # type: ignore[no-untyped-call]
        partial = self.inner.out(self.inner.attend(x))
        out: torch.Tensor = _Leave.apply(partial, self.traced, self.name)  # type: ignore[no-untyped-call]
        return out if self.bias is None else out + self.bias


class SplitFeedForward(nn.Module):
    def __init__(self, whole: blocks.FeedForward, traced: Traced, index: int, parts: int, name: str) -> None:
        super().__init__()
        self.inner = whole
        self.traced, self.name = traced, name
        _rows(whole.up, index, parts)
        if whole.gate is not None:
            _rows(whole.gate, index, parts)
        self.bias = _columns(whole.down, index, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _Enter.apply(x, self.traced, self.name)  # type: ignore[no-untyped-call]
        partial = self.inner.down(self.inner.hidden(x))
        out: torch.Tensor = _Leave.apply(partial, self.traced, self.name)  # type: ignore[no-untyped-call]
        return out if self.bias is None else out + self.bias


def split(model: nn.Module, traced: Traced, index: int, parts: int) -> None:
    """Split every block of `model` in place: this rank keeps part `index` of `parts` (its
    parameters marked `SPLIT`)."""
    for name, module in model.named_modules():
        if isinstance(module, blocks.Block):
            module.attention = SplitAttention(module.attention, traced, index, parts, f"{name}.attention")  # type: ignore[assignment]
            module.mlp = SplitFeedForward(module.mlp, traced, index, parts, f"{name}.mlp")  # type: ignore[assignment]
