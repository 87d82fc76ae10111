"""The zoo's models as pure JAX functions of their weights (NCHW, the zoo's conventions).

`apply(steps, weights, state, x, train, key)` walks the tree of `weights.steps(model)` on a
batch and returns the output with the BatchNorm state after the batch:

- convolutions through `lax.conv_general_dilated` (OIHW kernels), pools through
  `lax.reduce_window` with explicit padding (rounding down; average pools count padded
  zeros), dense layers as `x @ W`;
- a `Concat` runs its branches on the same input and concatenates their outputs along the
  channels; a `Residual` adds its body's output to its shortcut's (an empty shortcut is the
  identity);
- `BatchNorm` in training normalises with the batch's statistics (over N, H, W for images,
  N for flat inputs; biased variance), then scales and shifts; its running mean and
  variance (`state`, a list in the order of `Step.state`) move towards the batch's,
  PyTorch's way: new = (1 - momentum) * old + momentum * batch, with the unbiased batch
  variance. Out of training it normalises with the running statistics and returns the
  state unchanged. The state is threaded through, never differentiated;
- `Dropout` in training zeroes each unit with probability `rate` and scales the others by
  1 / (1 - rate) (inverted dropout), its mask drawn from `key` folded with the step's serial
  number (`Step.index`), so each Dropout layer has its own stream; out of training it is
  the identity. The caller folds the iteration into `key`, so masks change every step.

`loss(steps, task, weights, state, x, y, train, key)` is `criterion` of `apply`'s output,
with the new state: the mean softmax cross-entropy of a classifier, or the mean squared
error of a reconstruction of its flattened input.

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


def _channels(x: Array) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(axes a BatchNorm reduces over, shape a per-channel vector broadcasts as) for `x`."""
    if x.ndim == 4:
        return (0, 2, 3), (1, -1, 1, 1)
    return (0,), (1, -1)


class _Walk:
    """One pass over the tree: the weights, the state read and the state written."""

    def __init__(self, weights: Sequence[Array], state: Sequence[Array], train: bool, key: Array) -> None:
        self.weights = weights
        self.state = state
        self.new_state = list(state)
        self.train = train
        self.key = key

    def sequence(self, steps: Sequence[Step], x: Array) -> Array:
        for step in steps:
            x = self.step(step, x)
        return x

    def step(self, step: Step, x: Array) -> Array:
        layer = step.layer
        if isinstance(layer, zoo.Concat):
            return jnp.concatenate([self.sequence(branch, x) for branch in step.branches], axis=1)
        if isinstance(layer, zoo.Residual):
            body, shortcut = step.branches
            return self.sequence(body, x) + self.sequence(shortcut, x)
        if isinstance(layer, zoo.BatchNorm):
            return self.batch_norm(step, layer, x)
        if isinstance(layer, zoo.Dropout):
            return self.dropout(step, layer, x)
        return _layer(step, self.weights, x)

    def batch_norm(self, step: Step, layer: zoo.BatchNorm, x: Array) -> Array:
        axes, shape = _channels(x)
        if self.train:
            mean = jnp.mean(x, axis=axes)
            var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)  # biased: normalises
            n = x.size // x.shape[1]  # values per channel
            unbiased = lax.stop_gradient(var) * (n / max(n - 1, 1))
            m = layer.momentum
            old_mean, old_var = self.state[step.state], self.state[step.state + 1]
            self.new_state[step.state] = (1 - m) * old_mean + m * lax.stop_gradient(mean)
            self.new_state[step.state + 1] = (1 - m) * old_var + m * unbiased
        else:
            mean, var = self.state[step.state], self.state[step.state + 1]
        scale = self.weights[step.weight] * lax.rsqrt(var + layer.eps)
        shift = self.weights[step.weight + 1] - mean * scale
        return x * scale.reshape(shape) + shift.reshape(shape)

    def dropout(self, step: Step, layer: zoo.Dropout, x: Array) -> Array:
        if not self.train or layer.rate <= 0:
            return x
        if self.key is None:
            raise ValueError("Dropout in training needs a random key")
        keep = 1.0 - layer.rate
        mask = jax.random.bernoulli(jax.random.fold_in(self.key, step.index), keep, x.shape)
        return jnp.where(mask, x / keep, jnp.zeros_like(x))


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


def apply(
    steps: Sequence[Step],
    weights: Sequence[Array],
    state: Sequence[Array],
    x: Array,
    train: bool = False,
    key: Array = None,
) -> tuple[Array, list[Array]]:
    """(output, BatchNorm state after the batch) of the tree `steps` on `x`. `train`:
    batch statistics (the state updated) and dropout (masks from `key`); otherwise running
    statistics (the state returned as given) and no dropout."""
    walk = _Walk(weights, state, train, key)
    out = walk.sequence(steps, x)
    return out, walk.new_state


def criterion(task: str, out: Array, x: Array, y: Array) -> Array:
    """The mean loss of a batch's output: softmax cross-entropy against the labels `y` for
    "classify", else the squared error against the flattened input `x`."""
    if task == "classify":
        logp = jax.nn.log_softmax(out, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))
    return jnp.mean(jnp.square(out - x.reshape((x.shape[0], -1))))


def loss(
    steps: Sequence[Step],
    task: str,
    weights: Sequence[Array],
    state: Sequence[Array],
    x: Array,
    y: Array,
    train: bool = False,
    key: Array = None,
) -> tuple[Array, list[Array]]:
    """(mean loss of the batch, BatchNorm state after it): `apply`, then `criterion`."""
    out, new_state = apply(steps, weights, state, x, train, key)
    return criterion(task, out, x, y), new_state
