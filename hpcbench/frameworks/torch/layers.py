"""PyTorch modules built from the framework-neutral model trees of `hpcbench.workloads.zoo`
(the transformer's records: `blocks.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hpcbench.frameworks.torch import blocks
from hpcbench.workloads import zoo


class Concat(nn.Module):
    def __init__(self, branches: Sequence[nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class Residual(nn.Module):
    def __init__(self, body: nn.Module, shortcut: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x) + self.shortcut(x)
        return out


def _activation(kind: str) -> nn.Module:
    if kind == "gelu":
        return nn.GELU(approximate="tanh")
    return nn.ReLU(inplace=False) if kind == "relu" else nn.Sigmoid()


def _layer(layer: zoo.Layer, shape: zoo.Shape) -> nn.Module:
    if isinstance(layer, zoo.Conv):
        return nn.Conv2d(shape[0], layer.out, layer.kernel, layer.stride, layer.pad, bias=layer.bias)
    if isinstance(layer, zoo.BatchNorm):
        return nn.BatchNorm2d(shape[0], eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, zoo.Pool):
        if layer.kind == "max":
            return nn.MaxPool2d(layer.kernel, layer.stride, layer.pad)
        return nn.AvgPool2d(layer.kernel, layer.stride, layer.pad, count_include_pad=True)
    if isinstance(layer, zoo.GlobalAvgPool):
        return nn.AdaptiveAvgPool2d(1)
    if isinstance(layer, zoo.Flatten):
        return nn.Flatten()
    if isinstance(layer, zoo.Dense):
        return nn.Linear(shape[-1], layer.out, bias=layer.bias)
    if isinstance(layer, zoo.Activation):
        return _activation(layer.kind)
    if isinstance(layer, zoo.Dropout):
        return nn.Dropout(layer.rate)
    if isinstance(layer, zoo.Concat):
        return Concat([sequential(branch, shape) for branch in layer.branches])
    if isinstance(layer, zoo.Residual):
        return Residual(sequential(layer.body, shape), sequential(layer.shortcut, shape))
    raise TypeError(f"no PyTorch layer for {layer!r}")


def sequential(layers: Sequence[zoo.Layer], shape: zoo.Shape) -> nn.Sequential:
    modules = []
    embedding = None  # a tied token head's table
    for layer in layers:
        built = blocks.module(layer, shape, embedding) or _layer(layer, shape)
        if isinstance(built, blocks.Embedding):
            embedding = built
        modules.append(built)
        shape = zoo.output_shape(layer, shape)
    return nn.Sequential(*modules)  # empty: the identity


def build(model: zoo.Model) -> nn.Module:
    return sequential(model.layers, model.input)
