"""Gluon networks (HybridBlocks, NCHW) built from the framework-neutral trees of `hpcbench.workloads.zoo`.

Every layer is given its input size (`in_channels`, `in_units`), so parameters have their
shapes at once (no deferred initialisation) and the builder follows `zoo.output_shape`
step by step. Conventions of `hpcbench.workloads.zoo`: pools round down (Gluon's default
`ceil_mode=False`, i.e. `pooling_convention='valid'`), average pools count padded zeros
(`count_include_pad=True`), and BatchNorm's momentum is converted from PyTorch's convention
(weight of the batch) to MXNet's (weight of the running value). Trainable parameters
(`grad_req != 'null'`: BatchNorm's gamma and beta, not its running mean and variance)
equal `zoo.count_parameters`.

Only the adapter imports this module, lazily (in `build`): it needs mxnet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mxnet import gluon
from mxnet.gluon import nn
from mxnet.gluon.contrib.nn import HybridConcurrent

from hpcbench.workloads import zoo


class Residual(gluon.HybridBlock):  # type: ignore[misc]  # mxnet has no type information
    """body(x) + shortcut(x); no shortcut layers: the identity."""

    def __init__(self, body: nn.HybridSequential, shortcut: nn.HybridSequential | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def _pair(v: tuple[int, int]) -> tuple[int, int]:
    return (int(v[0]), int(v[1]))


def _layer(layer: zoo.Layer, shape: zoo.Shape) -> gluon.HybridBlock:
    if isinstance(layer, zoo.Concat | zoo.Residual):
        return _composite(layer, shape)
    if isinstance(layer, zoo.Conv):
        return nn.Conv2D(
            layer.out,
            _pair(layer.kernel),
            strides=layer.stride,
            padding=_pair(layer.pad),
            use_bias=layer.bias,
            in_channels=shape[0],
        )
    if isinstance(layer, zoo.BatchNorm):
        return nn.BatchNorm(axis=1, momentum=1.0 - layer.momentum, epsilon=layer.eps, in_channels=shape[0])
    if isinstance(layer, zoo.Pool):
        if layer.kind == "max":
            return nn.MaxPool2D(layer.kernel, layer.stride, layer.pad, ceil_mode=False)
        return nn.AvgPool2D(layer.kernel, layer.stride, layer.pad, ceil_mode=False, count_include_pad=True)
    if isinstance(layer, zoo.GlobalAvgPool):
        return nn.GlobalAvgPool2D()
    if isinstance(layer, zoo.Flatten):
        return nn.Flatten()
    if isinstance(layer, zoo.Dense):
        return nn.Dense(layer.out, use_bias=layer.bias, in_units=shape[0])
    if isinstance(layer, zoo.Activation):
        return nn.Activation(layer.kind)  # "relu" | "sigmoid": the same names in MXNet
    if isinstance(layer, zoo.Dropout):
        return nn.Dropout(layer.rate)
    raise TypeError(f"no Gluon layer for {layer!r}")


def _composite(layer: zoo.Concat | zoo.Residual, shape: zoo.Shape) -> gluon.HybridBlock:
    """A layer made of sequences applied to the same input: branches concatenated, or a residual block."""
    if isinstance(layer, zoo.Concat):
        concat = HybridConcurrent(axis=1)
        for branch in layer.branches:
            concat.add(sequential(branch, shape))
        return concat
    shortcut = sequential(layer.shortcut, shape) if layer.shortcut else None
    return Residual(sequential(layer.body, shape), shortcut)


def sequential(layers: Sequence[zoo.Layer], shape: zoo.Shape) -> nn.HybridSequential:
    net = nn.HybridSequential()
    for layer in layers:
        net.add(_layer(layer, shape))
        shape = zoo.output_shape(layer, shape)
    return net


def build(model: zoo.Model) -> nn.HybridSequential:
    """The model's network, not yet initialised."""
    return sequential(model.layers, model.input)


def trainable(net: gluon.Block) -> list[gluon.Parameter]:
    """Parameters the optimizer updates, in the order the network creates them."""
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def count_trainable(net: gluon.Block) -> int:
    total = 0
    for p in trainable(net):
        n = 1
        for d in p.shape:
            n *= d
        total += n
    return total
