"""The zoo's plain models as pure JAX functions of their weights (NCHW, the zoo's conventions).

`apply(steps, weights, x)` runs the layers of `weights.steps(model)` on a batch: convolutions
through `lax.conv_general_dilated` (OIHW kernels), pools through `lax.reduce_window` with
explicit padding (rounding down; average pools count padded zeros), dense layers as `x @ W`.
`loss(steps, task, weights, x, y)` is the mean softmax cross-entropy of a classifier, or the
mean squared error of a reconstruction of its flattened input.

Only the adapter imports this module, lazily (in `build`): it needs jax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from hpcbench.frameworks.jax.weights import Step
from hpcbench.workloads import zoo

Array = Any  # jax.Array; the functions are traced, not type-checked against jax's stubs


def _pool(layer: zoo.Pool, x: Array) -> Array:
    window = (1, 1, layer.kernel, layer.kernel)
    strides = (1, 1, layer.stride, layer.stride)
    padding = ((0, 0), (0, 0), (layer.pad, layer.pad), (layer.pad, layer.pad))
    if layer.kind == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
    total = lax.reduce_window(x, 0.0, lax.add, window, strides, padding)
    return total / (layer.kernel * layer.kernel)


def _layer(step: Step, weights: Sequence[Array], x: Array) -> Array:
    layer = step.layer
    if isinstance(layer, zoo.Conv):
        (ph, pw), s = layer.pad, layer.stride
        w = weights[step.weight]
        out = lax.conv_general_dilated(x, w, (s, s), ((ph, ph), (pw, pw)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + weights[step.weight + 1][None, :, None, None] if step.bias else out
    if isinstance(layer, zoo.Dense):
        out = x @ weights[step.weight]
        return out + weights[step.weight + 1] if step.bias else out
    if isinstance(layer, zoo.Pool):
        return _pool(layer, x)
    if isinstance(layer, zoo.GlobalAvgPool):
        return jnp.mean(x, axis=(2, 3), keepdims=True)
    if isinstance(layer, zoo.Flatten):
        return x.reshape((x.shape[0], -1))
    if isinstance(layer, zoo.Activation):
        return jax.nn.relu(x) if layer.kind == "relu" else jax.nn.sigmoid(x)
    raise TypeError(f"no JAX layer for {layer!r}")


def apply(steps: Sequence[Step], weights: Sequence[Array], x: Array) -> Array:
    for step in steps:
        x = _layer(step, weights, x)
    return x


def loss(steps: Sequence[Step], task: str, weights: Sequence[Array], x: Array, y: Array) -> Array:
    out = apply(steps, weights, x)
    if task == "classify":
        logp = jax.nn.log_softmax(out, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))
    return jnp.mean(jnp.square(out - x.reshape((x.shape[0], -1))))
