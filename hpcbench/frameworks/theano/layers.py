"""The zoo's models as Theano / PyTensor graphs, split layer by layer for timing.

`forward(lib, steps, weights, x, ...)` builds the model's graph on the layer tree and the
weights of `hpcbench.frameworks.jax.weights` and returns a `Pass`: every tensor the backward
graph needs (`saved`: each leaf's output, depth first, a `Dropout`'s mask before its output,
and each `Concat`'s and `Residual`'s output after its branches'; the last is the model's
output) and the updates of the forward function (the `BatchNorm`s' running statistics, the
dropout masks' random streams). In training (`train=True`) a `BatchNorm` normalises with its
batch's statistics (biased variance) and moves its running mean and variance towards them
(PyTorch's convention: new = (1 - momentum) * old + momentum * batch, the variance's batch
value unbiased); a `Dropout` multiplies by a mask of zeros and 1 / (1 - rate), drawn anew at
every call from a random stream of its own (seeded from the given seed and the leaf's
serial number). In evaluation a `BatchNorm` uses its running statistics and `Dropout` is the
identity.

Theano's own `conv2d` (as a cross-correlation, `filter_flip=False`) and `pool_2d`
(`ignore_border=True`: rounding down; `average_inc_pad`: padded zeros counted) are used where
they exist; PyTensor has neither, so there the zero-padded input's windows are gathered in
one indexing op (im2col) and a convolution is one matrix product of them with the kernel (a
1x1 convolution: of the strided input itself), a pool their maximum or mean (zero padding:
the zoo's pools are padded after a ReLU, where zero and -inf padding give the same result).
One gather per layer whatever its kernel: a graph of one strided slice per kernel offset
took PyTensor's Numba linker more than ten minutes to compile for AlexNet's 11x11 kernel.

`backward(lib, steps, weights, x, saved, last)` is the gradient graph of every weight given
the forward's saved tensors as separate variables and the gradient of the model's output:
leaf by leaf, in reverse (`grad` with `known_grads`), so the backward function starts from
the forward's saved activations instead of recomputing the forward pass. A `Concat` splits
its upstream gradient by its branches' channel ranges; a `Residual` sends its upstream
gradient into both its body and its shortcut and sums their input gradients (an empty
shortcut passes it through); a `Dropout` reuses the forward's mask.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcbench.frameworks.jax.weights import Step
from hpcbench.frameworks.theano.library import Library
from hpcbench.workloads import zoo


@dataclass
class Pass:
    """One forward graph: the tensors the backward graph needs (`saved`, in the order of
    the module doc; the last is the model's output), the forward function's updates, and
    the dropout masks among `saved` (`masks`, in leaf order)."""

    saved: list[Any] = field(default_factory=list)
    updates: list[tuple[Any, Any]] = field(default_factory=list)
    masks: list[Any] = field(default_factory=list)

    @property
    def output(self) -> Any:
        return self.saved[-1]


def _pad(T: Any, x: Any, ph: int, pw: int) -> Any:
    if not ph and not pw:
        return x
    n, c, h, w = x.shape
    padded = T.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    return T.set_subtensor(padded[:, :, ph : ph + h, pw : pw + w], x)


def _patches(T: Any, x: Any, step: Step, kernel: tuple[int, int], stride: int, pad: tuple[int, int]) -> Any:
    """The input's windows gathered at once (PyTensor): K×(OH·OW)×N×C, K = kh·kw offsets.

    x (N×C×H×W), zero-padded, becomes (H·W)×N×C; one gather of constant indices (a single
    `AdvancedSubtensor1`, whose gradient is one scatter-add) takes every window's rows."""
    (kh, kw), (ph, pw) = kernel, pad
    channels, height, width = step.shape
    hp, wp = height + 2 * ph, width + 2 * pw
    oh, ow = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    rows = np.arange(kh)[:, None, None, None] + stride * np.arange(oh)[None, None, :, None]
    cols = np.arange(kw)[None, :, None, None] + stride * np.arange(ow)[None, None, None, :]
    index = (rows * wp + cols).reshape(-1).astype(np.int64)  # (kh, kw, oh, ow), row major
    flat = _pad(T, x, ph, pw).reshape((x.shape[0], channels, hp * wp)).dimshuffle(2, 0, 1)
    return flat[index].reshape((kh * kw, oh * ow, x.shape[0], channels))


def _image(rows: Any, n: Any, channels: int, out: tuple[int, int]) -> Any:
    """(OH·OW)×N×C back to N×C×OH×OW."""
    return rows.dimshuffle(1, 2, 0).reshape((n, channels, out[0], out[1]))


def _conv(lib: Library, step: Step, weights: Sequence[Any], x: Any) -> Any:
    layer = step.layer
    assert isinstance(layer, zoo.Conv)
    T = lib.tensor
    w = weights[step.weight]
    nnet = lib.native_conv
    if nnet is not None:
        sub = (layer.stride, layer.stride)
        out = nnet.conv2d(x, w, border_mode=layer.pad, subsample=sub, filter_flip=False)
    else:
        _, oh, ow = zoo.output_shape(layer, step.shape)
        channels, (kh, kw) = step.shape[0], layer.kernel
        if layer.kernel == (1, 1) and layer.pad == (0, 0):  # the (strided) input is its own patch matrix
            inputs = x[:, :, :: layer.stride, :: layer.stride] if layer.stride > 1 else x
            out = T.tensordot(inputs, w.reshape((layer.out, channels)), axes=[[1], [1]]).dimshuffle(0, 3, 1, 2)
        else:
            patches = _patches(T, x, step, layer.kernel, layer.stride, layer.pad)
            kernel = w.reshape((layer.out, channels, kh * kw)).dimshuffle(2, 1, 0)  # K×C×O
            rows = T.tensordot(patches, kernel, axes=[[0, 3], [0, 1]])  # (OH·OW)×N×O
            out = _image(rows, x.shape[0], layer.out, (oh, ow))
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
    patches = _patches(T, x, step, (k, k), s, (p, p))
    rows = T.max(patches, axis=0) if layer.kind == "max" else T.sum(patches, axis=0) / np.float32(k * k)
    return _image(rows, x.shape[0], step.shape[0], (oh, ow))


def _channels(step: Step) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """A BatchNorm's reduction axes and the broadcast pattern of a per-channel vector."""
    if len(step.shape) == 3:
        return (0, 2, 3), ("x", 0, "x", "x")
    return (0,), ("x", 0)


def _batch_norm(
    lib: Library, step: Step, weights: Sequence[Any], x: Any, state: Sequence[Any] | None, train: bool
) -> tuple[Any, list[tuple[Any, Any]]]:
    """A BatchNorm's output and, in training, its running statistics' updates."""
    layer = step.layer
    assert isinstance(layer, zoo.BatchNorm)
    T = lib.tensor
    axes, pattern = _channels(step)
    scale, shift = weights[step.weight], weights[step.weight + 1]
    eps = np.float32(layer.eps)
    if not train:
        if state is None:
            raise ValueError("a BatchNorm in evaluation needs the running statistics (state)")
        mean, var = state[step.state], state[step.state + 1]
        factor = scale / T.sqrt(var + eps)
        return (x - mean.dimshuffle(*pattern)) * factor.dimshuffle(*pattern) + shift.dimshuffle(*pattern), []
    mean = T.mean(x, axis=axes)
    centred = x - mean.dimshuffle(*pattern)
    var = T.mean(T.sqr(centred), axis=axes)  # biased, for normalising
    out = centred * (scale / T.sqrt(var + eps)).dimshuffle(*pattern) + shift.dimshuffle(*pattern)
    if state is None:  # the backward graph: no statistics to move
        return out, []
    count = T.cast(T.prod(T.stack([x.shape[a] for a in axes])), "float32")
    m, keep = np.float32(layer.momentum), np.float32(1 - layer.momentum)  # float32 both (numpy 1: 1 - m is float64)
    old_mean, old_var = state[step.state], state[step.state + 1]
    unbiased = var * count / (count - np.float32(1))
    return out, [(old_mean, keep * old_mean + m * mean), (old_var, keep * old_var + m * unbiased)]


def _mask(lib: Library, step: Step, x: Any, seed: int) -> tuple[Any, list[tuple[Any, Any]]]:
    """A Dropout's mask for `x` (0 or 1 / (1 - rate)) from a stream of its own, and the
    stream's update (none for Theano, whose stream updates itself: `default_update`)."""
    layer = step.layer
    assert isinstance(layer, zoo.Dropout)
    T = lib.tensor
    stream = int(np.random.SeedSequence([seed, step.index]).generate_state(1)[0]) % (2**30) + 1
    uniform, updates = lib.uniform(stream, x.shape)
    keep = np.float32(1.0 - layer.rate)
    return T.cast(uniform >= np.float32(layer.rate), "float32") * (np.float32(1) / keep), updates


def _leaf(lib: Library, step: Step, weights: Sequence[Any], x: Any, mask: Any = None) -> Any:
    """A leaf's output for input `x`; a BatchNorm with its batch's statistics, a Dropout
    with `mask` (the identity without one)."""
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
    if isinstance(layer, zoo.BatchNorm):
        return _batch_norm(lib, step, weights, x, None, True)[0]
    if isinstance(layer, zoo.Dropout):
        return x if mask is None else x * mask
    raise TypeError(f"no Theano layer for {layer!r}")


def _concat_or_sum(lib: Library, step: Step, x: Any, outs: Sequence[Any]) -> Any:
    if isinstance(step.layer, zoo.Concat):
        return lib.tensor.concatenate(list(outs), axis=1)
    body, shortcut = outs
    return body + (x if shortcut is None else shortcut)


def _forward(
    lib: Library,
    seq: Sequence[Step],
    weights: Sequence[Any],
    x: Any,
    state: Sequence[Any] | None,
    train: bool,
    seed: int,
    out: Pass,
) -> Any:
    for step in seq:
        if step.branches:
            ends = []
            for branch in step.branches:
                ends.append(_forward(lib, branch, weights, x, state, train, seed, out) if branch else None)
            x = _concat_or_sum(lib, step, x, ends)
        elif isinstance(step.layer, zoo.BatchNorm):
            x, updates = _batch_norm(lib, step, weights, x, state, train)
            out.updates += updates
        elif isinstance(step.layer, zoo.Dropout) and train:
            mask, updates = _mask(lib, step, x, seed)
            out.saved.append(mask)
            out.masks.append(mask)
            out.updates += updates
            x = x * mask
        else:
            x = _leaf(lib, step, weights, x)
        out.saved.append(x)
    return x


def forward(
    lib: Library,
    steps: Sequence[Step],
    weights: Sequence[Any],
    x: Any,
    state: Sequence[Any] | None = None,
    train: bool = True,
    seed: int = 0,
) -> Pass:
    """The model's forward graph on input `x`: training (batch statistics, dropout masks)
    or evaluation (running statistics, no dropout). `state`: the BatchNorms' running means
    and variances as shared variables (in `Step.state` order), needed where the model has a
    BatchNorm; `seed`: the dropout masks' streams' (see the module doc)."""
    out = Pass()
    _forward(lib, steps, weights, x, state, train, seed, out)
    return out


def loss(lib: Library, task: str, out: Any, x: Any, y: Any) -> Any:
    """Mean softmax cross-entropy (classify) or mean squared error of the flattened input."""
    T = lib.tensor
    if task == "classify":
        shifted = out - T.max(out, axis=1, keepdims=True)
        logp = shifted - T.log(T.sum(T.exp(shifted), axis=1, keepdims=True))
        return -T.mean(logp[T.arange(y.shape[0]), y])
    return T.mean(T.sqr(out - x.reshape((x.shape[0], -1))))


@dataclass
class _Node:
    """A step of the tree bound to the saved tensors: its input, its output and, for a
    Dropout, its mask; a Concat's or Residual's branches as bound sequences."""

    step: Step
    input: Any
    output: Any
    mask: Any = None
    branches: tuple[list[_Node], ...] = ()


def _bind(seq: Sequence[Step], x: Any, saved: Iterator[Any]) -> list[_Node]:
    """The steps of `seq` (input `x`) bound to the saved tensors, read in `forward`'s order."""
    nodes = []
    for step in seq:
        if step.branches:
            branches = tuple(_bind(branch, x, saved) for branch in step.branches)
            node = _Node(step, x, next(saved), branches=branches)
        elif isinstance(step.layer, zoo.Dropout):
            mask = next(saved)
            node = _Node(step, x, next(saved), mask)
        else:
            node = _Node(step, x, next(saved))
        nodes.append(node)
        x = node.output
    return nodes


class _Backward:
    def __init__(self, lib: Library, weights: Sequence[Any]) -> None:
        self.lib, self.weights = lib, weights
        self.grads: dict[int, Any] = {}

    def sequence(self, nodes: Sequence[_Node], upstream: Any, need_input: bool) -> Any:
        """Every weight's gradient in `nodes` given the gradient of the last one's output;
        returns the gradient of the first one's input (None unless `need_input`)."""
        for i in reversed(range(len(nodes))):
            upstream = self.node(nodes[i], upstream, need_input or i > 0)
        return upstream

    def node(self, node: _Node, upstream: Any, need_input: bool) -> Any:
        step = node.step
        if isinstance(step.layer, zoo.Concat):
            total, start = None, 0
            for branch in node.branches:
                channels = zoo.sequence_shape([b.step.layer for b in branch], step.shape)[0]
                part = self.sequence(branch, upstream[:, start : start + channels], need_input)
                start += channels
                total = part if total is None else total + part
            return total
        if isinstance(step.layer, zoo.Residual):
            body, shortcut = node.branches
            total = self.sequence(body, upstream, need_input)
            if not need_input:  # the weights' gradients only (nothing before the block)
                self.sequence(shortcut, upstream, False)
                return None
            return total + (self.sequence(shortcut, upstream, True) if shortcut else upstream)
        own = [] if step.weight < 0 else list(self.weights[step.weight : step.weight + step.learnt])
        wrt = own + ([node.input] if need_input else [])
        if not wrt:
            return None
        out = _leaf(self.lib, step, self.weights, node.input, node.mask)
        found = self.lib.module.grad(None, wrt=wrt, known_grads={out: upstream})
        for k, g in enumerate(found[: len(own)]):
            self.grads[step.weight + k] = g
        return found[-1] if need_input else None


def backward(
    lib: Library, steps: Sequence[Step], weights: Sequence[Any], x: Any, saved: Sequence[Any], last: Any
) -> list[Any]:
    """Gradients of `weights` (in their order) given the model's input `x`, the tensors a
    training `forward` saved (`saved`, as variables of their own, in its order) and `last`,
    the gradient of the loss with respect to the model's output."""
    it = iter(saved)
    nodes = _bind(steps, x, it)
    if next(it, None) is not None:
        raise ValueError("more saved tensors than the model's steps read")
    walk = _Backward(lib, weights)
    walk.sequence(nodes, last, need_input=False)
    return [walk.grads[k] for k in range(len(weights))]
