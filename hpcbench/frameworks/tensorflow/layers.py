"""Keras 3 models built from the framework-neutral model trees of `hpcbench.workloads.zoo`
(the transformers' by `blocks.py`).

Imports TensorFlow and Keras at module level: import this module only where they exist
(inside the TensorFlow adapter's methods).

TensorFlow's CPU kernels want channels-last images, so the Keras model takes NHWC input
(the adapter transposes the NCHW arrays of `hpcbench.workloads.datasets` once, when it builds its data).
The layers follow the conventions of `hpcbench.workloads.zoo`:

- explicit padding is a `ZeroPadding2D` in front of a layer with `padding="valid"`, so
  output sizes round down exactly as in the tree (and as PyTorch and MXNet do);
- average pools therefore count the padded zeros (PyTorch's `count_include_pad=True`);
- max-pool padding is zeros too, which the tree only uses where the input is >= 0 (after
  a ReLU), so it equals -inf padding;
- `BatchNorm.momentum` is PyTorch's (weight of the new batch); Keras' momentum is the
  weight of the old value: `1 - momentum`;
- `Flatten` flattens the channels-last tensor (H, W, C order): a permutation of PyTorch's
  (C, H, W) order, so the dense layer after it has the same shape and parameter count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from hpcbench.workloads import zoo


def nhwc(shape: zoo.Shape) -> tuple[int, ...]:
    """Keras' input shape (no batch axis) for a tree shape: (C, H, W) -> (H, W, C)."""
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else tuple(shape)


class Namer:
    """Stable, readable layer names (they name the gradient messages)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str) -> str:
        n = self.counts.get(kind, 0)
        self.counts[kind] = n + 1
        return f"{kind}{n}"


def _pad(x: Any, rows: int, cols: int, name: Namer) -> Any:
    if rows or cols:
        return keras.layers.ZeroPadding2D(((rows, rows), (cols, cols)), name=name("pad"))(x)
    return x


def _apply(layer: zoo.Layer, x: Any, name: Namer) -> Any:
    if isinstance(layer, zoo.Conv):
        x = _pad(x, layer.pad[0], layer.pad[1], name)
        conv = keras.layers.Conv2D(
            layer.out, layer.kernel, strides=layer.stride, padding="valid", use_bias=layer.bias, name=name("conv")
        )
        return conv(x)
    if isinstance(layer, zoo.BatchNorm):
        bn = keras.layers.BatchNormalization(axis=-1, epsilon=layer.eps, momentum=1.0 - layer.momentum, name=name("bn"))
        return bn(x)
    if isinstance(layer, zoo.Pool):
        x = _pad(x, layer.pad, layer.pad, name)
        cls = keras.layers.MaxPooling2D if layer.kind == "max" else keras.layers.AveragePooling2D
        return cls(layer.kernel, strides=layer.stride, padding="valid", name=name(f"{layer.kind}pool"))(x)
    if isinstance(layer, zoo.GlobalAvgPool):
        return keras.layers.GlobalAveragePooling2D(keepdims=True, name=name("gap"))(x)
    if isinstance(layer, zoo.Flatten):
        return keras.layers.Flatten(name=name("flatten"))(x)
    if isinstance(layer, zoo.Dense):
        return keras.layers.Dense(layer.out, use_bias=layer.bias, name=name("dense"))(x)
    if isinstance(layer, zoo.Activation):
        return keras.layers.Activation(layer.kind, name=name(layer.kind))(x)
    if isinstance(layer, zoo.Dropout):
        return keras.layers.Dropout(layer.rate, name=name("dropout"))(x)
    if isinstance(layer, zoo.Concat):
        outs = [_sequence(branch, x, name) for branch in layer.branches]
        return keras.layers.Concatenate(axis=-1, name=name("concat"))(outs)
    if isinstance(layer, zoo.Residual):
        body = _sequence(layer.body, x, name)
        short = _sequence(layer.shortcut, x, name)
        return keras.layers.Add(name=name("add"))([body, short])
    raise TypeError(f"no Keras layer for {layer!r}")


def _sequence(layers: Sequence[zoo.Layer], x: Any, name: Namer) -> Any:
    for layer in layers:
        x = _apply(layer, x, name)
    return x  # empty: the identity


def build(model: zoo.Model) -> keras.Model:
    """The Keras functional model of `model` (NHWC input, no batch axis fixed); a
    transformer's from `blocks.py`."""
    from hpcbench.frameworks.tensorflow import blocks

    if blocks.is_transformer(model):
        return blocks.build(model)
    name = Namer()
    inputs = keras.Input(shape=nhwc(model.input), name="input")
    outputs = _sequence(model.layers, inputs, name)
    return keras.Model(inputs, outputs, name=model.name)


def trainable_count(model: keras.Model) -> int:
    return sum(int(v.numpy().size) for v in model.trainable_variables)
