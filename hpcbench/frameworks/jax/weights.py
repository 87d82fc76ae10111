"""A zoo model's layers and their weights as numpy arrays, for the functional builders.

JAX and Theano / PyTensor (`hpcbench.frameworks.theano`) both write a network as a function
of its weight arrays; this module gives both the same layer tree and the same weights.

`steps(model)` is the model's layers as a tree of `Step`s: each leaf layer with its input
shape and, where it has learnt tensors, the index of the first one in the weight list; a
`Concat` or `Residual` step holds its branches (a `Residual`'s are its body and its
shortcut, an empty shortcut being the identity) as sequences of steps. Weights come in
creation order, depth first (a `Concat`'s branches in order, a `Residual`'s body before its
shortcut): for each `Conv` its kernel (O×I×KH×KW) and bias, for each `Dense` its kernel
(I×O) and bias (a layer made without bias has only its kernel), for each `BatchNorm` its
scale and shift (C each). He-normal kernels from the point's seed, zero biases and shifts,
unit scales, so every rank starts from the same weights. `BatchNorm`'s running mean and
variance are state, not weights (`state(model)`: zeros and ones, a `BatchNorm` step's
`state` is the index of its mean; its variance follows): they are not learnt and not
exchanged. Every leaf has a serial number (`Step.index`, depth first) that names its
tensors (`conv0.weight`, `bn1.bias`, ...) and, for a `Dropout`, tells its mask's random
stream apart from the others'.

No framework is imported here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from hpcbench.workloads import zoo

PLAIN = (zoo.Conv, zoo.Pool, zoo.GlobalAvgPool, zoo.Flatten, zoo.Dense, zoo.Activation)


def plain(model: zoo.Model) -> bool:
    """Whether the model is a plain sequence of layers (no BatchNorm, Dropout or branches)."""
    return all(isinstance(layer, PLAIN) for layer in model.layers)


SUPPORTED: tuple[str, ...] = tuple(name for name in zoo.IMAGE_NAMES if plain(zoo.model(name)))


@dataclass(frozen=True)
class Step:
    """One layer of the tree with its input shape (C, H, W or features).

    `weight`: for a layer with learnt tensors, the index of its first one (a Conv's or a
    Dense's kernel, its bias following when `bias`; a BatchNorm's scale, its shift
    following); -1 otherwise. `state`: for a BatchNorm, the index of its running mean in
    the state list (its variance follows); -1 otherwise. `branches`: a Concat's branches or
    a Residual's (body, shortcut), each a sequence of steps; () for a leaf. `index`: the
    leaf's serial number, depth first (-1 for a Concat or Residual)."""

    layer: zoo.Layer
    shape: zoo.Shape
    weight: int = -1
    bias: bool = False
    state: int = -1
    branches: tuple[tuple[Step, ...], ...] = ()
    index: int = -1

    @property
    def learnt(self) -> int:
        """How many learnt tensors the step itself holds (not its branches')."""
        if isinstance(self.layer, zoo.BatchNorm):
            return 2
        if isinstance(self.layer, (zoo.Conv, zoo.Dense)):
            return 2 if self.bias else 1
        return 0


class _Counter:
    def __init__(self) -> None:
        self.weight = self.state = self.leaf = 0


def _sequence(layers: Sequence[zoo.Layer], shape: zoo.Shape, n: _Counter) -> tuple[Step, ...]:
    out: list[Step] = []
    for layer in layers:
        if isinstance(layer, zoo.Concat):
            out.append(Step(layer, shape, branches=tuple(_sequence(b, shape, n) for b in layer.branches)))
        elif isinstance(layer, zoo.Residual):
            body = _sequence(layer.body, shape, n)
            out.append(Step(layer, shape, branches=(body, _sequence(layer.shortcut, shape, n))))
        else:
            step = Step(layer, shape, index=n.leaf)
            n.leaf += 1
            if isinstance(layer, (zoo.Conv, zoo.Dense)):
                step = Step(layer, shape, n.weight, layer.bias, index=step.index)
            elif isinstance(layer, zoo.BatchNorm):
                step = Step(layer, shape, n.weight, state=n.state, index=step.index)
                n.state += 2
            n.weight += step.learnt
            out.append(step)
        shape = zoo.output_shape(layer, shape)
    return tuple(out)


def steps(model: zoo.Model) -> list[Step]:
    """The model's layers as a tree of steps (see the module doc)."""
    return list(_sequence(model.layers, model.input, _Counter()))


def leaves(tree: Sequence[Step]) -> Iterator[Step]:
    """Every leaf step, depth first (creation order)."""
    for step in tree:
        if step.branches:
            for branch in step.branches:
                yield from leaves(branch)
        else:
            yield step


_PREFIX = {zoo.Conv: "conv", zoo.Dense: "dense", zoo.BatchNorm: "bn"}


def _shapes(model: zoo.Model) -> Iterator[tuple[str, tuple[int, ...], int]]:
    """(name, shape, fan-in) of every weight, in creation order; fan-in 0 for a bias or a
    shift (zeros), -1 for a scale (ones)."""
    for step in leaves(steps(model)):
        layer, prefix = step.layer, f"{_PREFIX.get(type(step.layer), '')}{step.index}"
        if isinstance(layer, zoo.Conv):
            kh, kw = layer.kernel
            yield f"{prefix}.weight", (layer.out, step.shape[0], kh, kw), step.shape[0] * kh * kw
        elif isinstance(layer, zoo.Dense):
            yield f"{prefix}.weight", (step.shape[0], layer.out), step.shape[0]
        elif isinstance(layer, zoo.BatchNorm):
            yield f"{prefix}.weight", (step.shape[0],), -1
            yield f"{prefix}.bias", (step.shape[0],), 0
            continue
        else:
            continue
        if step.bias:
            yield f"{prefix}.bias", (layer.out,), 0


def initial(model: zoo.Model, seed: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array) of every weight: He-normal kernels, zero biases and shifts,
    unit scales; the same for a seed."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, fan_in in _shapes(model):
        if fan_in > 0:
            value = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        else:
            value = np.full(shape, 1.0 if fan_in < 0 else 0.0, dtype=np.float32)
        out.append((name, value))
    return out


def state(model: zoo.Model) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array) of every BatchNorm's running mean (zeros) and variance (ones),
    in the order of `Step.state`."""
    out = []
    for step in leaves(steps(model)):
        if isinstance(step.layer, zoo.BatchNorm):
            channels = (step.shape[0],)
            out.append((f"bn{step.index}.running_mean", np.zeros(channels, np.float32)))
            out.append((f"bn{step.index}.running_var", np.ones(channels, np.float32)))
    return out


def count(weights: list[tuple[str, np.ndarray]]) -> int:
    return sum(int(w.size) for _, w in weights)
