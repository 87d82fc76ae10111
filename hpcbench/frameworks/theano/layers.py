"""The zoo's plain models as Theano / PyTensor graphs, split layer by layer for timing.

`forward(lib, steps, weights, x)` gives every layer's output, from the input on (the
layers and weights of `hpcbench.frameworks.jax.weights`). Theano's own `conv2d` (as a
cross-correlation, `filter_flip=False`) and `pool_2d` (`ignore_border=True`: rounding down;
`average_inc_pad`: padded zeros counted) are used where they exist; PyTensor has neither,
so there a convolution is one matrix product of the input's strided patches (im2col) and a
pool the maximum or mean of its window's strided slices (zero padding: the zoo's pools
are padded after a ReLU, where zero and -inf padding give the same result).

`backward(lib, steps, weights, activations, seed)` is the gradient graph of every weight
given each layer's input as a separate variable and the gradient of the last output: layer
by layer (`grad` with `known_grads`), so the backward function starts from the forward's
saved activations instead of recomputing the forward pass.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any

from hpcbench.frameworks.jax.weights import Step
from hpcbench.frameworks.theano.library import Library
from hpcbench.workloads import zoo


def _pad(T: Any, x: Any, ph: int, pw: int) -> Any:
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    padded = T.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    return T.set_subtensor(padded[:, :, ph : ph + h, pw : pw + w], x)


def _windows(T: Any, x: Any, kh: int, kw: int, stride: int, out: tuple[int, int]) -> list[Any]:
    """The kh·kw strided slices of (padded) x, one per window offset, each N×C×OH×OW."""
    oh, ow = out
    return [
        x[:, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride]
        for i in range(kh)
        for j in range(kw)
    ]


def _conv(lib: Library, step: Step, weights: Sequence[Any], x: Any) -> Any:
    layer = step.layer
    assert isinstance(layer, zoo.Conv)
    T = lib.tensor
    w = weights[step.weight]
    (ph, pw), (kh, kw) = layer.pad, layer.kernel
    nnet = lib.native_conv
    if nnet is not None:
        out = nnet.conv2d(x, w, border_mode=(ph, pw), subsample=(layer.stride, layer.stride), filter_flip=False)
    else:
        _, oh, ow = zoo.output_shape(layer, step.shape)
        patches = T.stack(_windows(T, _pad(T, x, ph, pw), kh, kw, layer.stride, (oh, ow)), axis=2)
        channels = step.shape[0]
        cols = patches.reshape((x.shape[0], channels * kh * kw, oh, ow))  # C major, then the offset
        out = T.tensordot(cols, w.reshape((layer.out, channels * kh * kw)), axes=[[1], [1]]).dimshuffle(0, 3, 1, 2)
    if step.bias:
        out = out + weights[step.weight + 1].dimshuffle("x", 0, "x", "x")
    return out


def _pool(lib: Library, step: Step, x: Any) -> Any:
    layer = step.layer
    assert isinstance(layer, zoo.Pool)
    T = lib.tensor
    k, s, p = layer.kernel, layer.stride, layer.pad
    if lib.native_conv is not None:
        pool_2d = importlib.import_module(f"{lib.name}.tensor.signal.pool").pool_2d
        mode = "max" if layer.kind == "max" else "average_inc_pad"
        return pool_2d(x, ws=(k, k), stride=(s, s), pad=(p, p), ignore_border=True, mode=mode)
    _, oh, ow = zoo.output_shape(layer, step.shape)
    slices = T.stack(_windows(T, _pad(T, x, p, p), k, k, s, (oh, ow)), axis=0)
    return T.max(slices, axis=0) if layer.kind == "max" else T.sum(slices, axis=0) / (k * k)


def _layer(lib: Library, step: Step, weights: Sequence[Any], x: Any) -> Any:
    layer, T = step.layer, lib.tensor
    if isinstance(layer, zoo.Conv):
        return _conv(lib, step, weights, x)
    if isinstance(layer, zoo.Dense):
        out = T.dot(x, weights[step.weight])
        return out + weights[step.weight + 1] if step.bias else out
    if isinstance(layer, zoo.Pool):
        return _pool(lib, step, x)
    if isinstance(layer, zoo.GlobalAvgPool):
        return T.mean(x, axis=(2, 3), keepdims=True)
    if isinstance(layer, zoo.Flatten):
        return x.reshape((x.shape[0], math.prod(step.shape)))
    if isinstance(layer, zoo.Activation):
        return T.maximum(x, 0) if layer.kind == "relu" else 1 / (1 + T.exp(-x))
    raise TypeError(f"no Theano layer for {layer!r}")


def forward(lib: Library, steps: Sequence[Step], weights: Sequence[Any], x: Any) -> list[Any]:
    """Every layer's output, in order (the last is the model's)."""
    outs = []
    for step in steps:
        x = _layer(lib, step, weights, x)
        outs.append(x)
    return outs


def loss(lib: Library, task: str, out: Any, x: Any, y: Any) -> Any:
    """Mean softmax cross-entropy (classify) or mean squared error of the flattened input."""
    T = lib.tensor
    if task == "classify":
        shifted = out - T.max(out, axis=1, keepdims=True)
        logp = shifted - T.log(T.sum(T.exp(shifted), axis=1, keepdims=True))
        return -T.mean(logp[T.arange(y.shape[0]), y])
    return T.mean(T.sqr(out - x.reshape((x.shape[0], -1))))


def _weights_of(step: Step, weights: Sequence[Any]) -> list[Any]:
    if step.weight < 0:
        return []
    return list(weights[step.weight : step.weight + (2 if step.bias else 1)])


def backward(
    lib: Library, steps: Sequence[Step], weights: Sequence[Any], inputs: Sequence[Any], last: Any
) -> list[Any]:
    """Gradients of `weights` (in their order) given each layer's input (`inputs[i]` feeds
    `steps[i]`) and `last`, the gradient of the loss with respect to the model's output."""
    grads: dict[int, Any] = {}
    upstream = last
    for i in reversed(range(len(steps))):
        step = steps[i]
        own = _weights_of(step, weights)
        wrt = own + ([inputs[i]] if i > 0 else [])
        if not wrt:
            continue
        out = _layer(lib, step, weights, inputs[i])
        found = lib.module.grad(None, wrt=wrt, known_grads={out: upstream})
        for k, g in enumerate(found[: len(own)]):
            grads[step.weight + k] = g
        if i > 0:
            upstream = found[-1]
    return [grads[k] for k in range(len(weights))]
