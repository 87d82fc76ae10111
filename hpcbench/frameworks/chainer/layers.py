# mypy: disable-error-code="import-not-found,import-untyped,misc"
"""Chainer links built from the framework-neutral trees of `hpcbench.workloads.zoo` (NCHW).

Every link is given its input size, so parameters exist at once (no lazy initialisation)
and the builder follows `zoo.output_shape` step by step. The zoo's conventions: pools
round down (`cover_all=False`), average pools count padded zeros (Chainer's
`average_pooling_2d` divides by the window's size), BatchNorm's momentum is converted from
PyTorch's convention (weight of the batch) to Chainer's `decay` (weight of the running
value). Parameters (BatchNorm's gamma and beta; its running mean and variance are not)
equal `zoo.count_parameters`.

Only the adapter imports this module, lazily (in `build`): it needs chainer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import chainer
import chainer.functions as F
import chainer.links as L

from hpcbench.workloads import zoo


class Stack(chainer.ChainList):
    """Links and functions applied in order; the links are registered as children."""

    def __init__(self, parts: Sequence[Any]) -> None:
        super().__init__()
        self._calls: list[Callable[[Any], Any]] = []
        for part in parts:
            if isinstance(part, chainer.Link):
                self.add_link(part)
            self._calls.append(part)

    def forward(self, x: Any) -> Any:
        for call in self._calls:
            x = call(x)
        return x


class Concat(chainer.ChainList):
    def forward(self, x: Any) -> Any:
        return F.concat([branch(x) for branch in self], axis=1)


class Residual(chainer.Chain):
    """body(x) + shortcut(x); no shortcut layers: the identity."""

    def __init__(self, body: Stack, shortcut: Stack | None) -> None:
        super().__init__()
        with self.init_scope():
            self.body = body
            self.shortcut = shortcut

    def forward(self, x: Any) -> Any:
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def _pool(layer: zoo.Pool) -> Callable[[Any], Any]:
    k, s, p = layer.kernel, layer.stride, layer.pad
    if layer.kind == "max":
        return lambda x: F.max_pooling_2d(x, k, s, p, cover_all=False)
    return lambda x: F.average_pooling_2d(x, k, s, p)


def _layer(layer: zoo.Layer, shape: zoo.Shape) -> Any:
    if isinstance(layer, zoo.Conv):
        return L.Convolution2D(
            shape[0], layer.out, layer.kernel, stride=layer.stride, pad=layer.pad, nobias=not layer.bias
        )
    if isinstance(layer, zoo.Dense):
        return L.Linear(shape[0], layer.out, nobias=not layer.bias)
    if isinstance(layer, zoo.BatchNorm):
        return L.BatchNormalization(shape[0], decay=1.0 - layer.momentum, eps=layer.eps)
    if isinstance(layer, zoo.Pool):
        return _pool(layer)
    if isinstance(layer, zoo.GlobalAvgPool):
        return lambda x: F.mean(x, axis=(2, 3), keepdims=True)
    if isinstance(layer, zoo.Flatten):
        return lambda x: F.reshape(x, (x.shape[0], -1))
    if isinstance(layer, zoo.Activation):
        return F.relu if layer.kind == "relu" else F.sigmoid
    if isinstance(layer, zoo.Dropout):
        rate = layer.rate
        return lambda x: F.dropout(x, rate)
    if isinstance(layer, zoo.Concat):
        return Concat(*(sequential(branch, shape) for branch in layer.branches))
    if isinstance(layer, zoo.Residual):
        shortcut = sequential(layer.shortcut, shape) if layer.shortcut else None
        return Residual(sequential(layer.body, shape), shortcut)
    raise TypeError(f"no Chainer layer for {layer!r}")


def sequential(layers: Sequence[zoo.Layer], shape: zoo.Shape) -> Stack:
    parts = []
    for layer in layers:
        parts.append(_layer(layer, shape))
        shape = zoo.output_shape(layer, shape)
    return Stack(parts)


def build(model: zoo.Model) -> Stack:
    """The model's network, its weights initialised by Chainer's defaults (numpy's global RNG)."""
    return sequential(model.layers, model.input)


def count_parameters(net: chainer.Link) -> int:
    return sum(int(p.size) for p in net.params())
