"""A zoo model's plain layers and their weights as numpy arrays, for the functional builders.

JAX and Theano / PyTensor (`hpcbench.frameworks.theano`) both write a network as a function
of its weight arrays; this module gives both the same layers and the same weights. It
accepts the models made only of plain layers (`Conv`, `Pool`, `GlobalAvgPool`, `Flatten`,
`Dense`, `Activation`): `SUPPORTED` says which of the zoo's are. Weights come in creation
order, for each `Conv` its kernel (O×I×KH×KW) and bias, for each `Dense` its kernel (I×O)
and bias (a layer made without bias has only its kernel): He-normal
kernels from the point's seed, zero biases, so every rank starts from the same weights.
No framework is imported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.workloads import zoo

PLAIN = (zoo.Conv, zoo.Pool, zoo.GlobalAvgPool, zoo.Flatten, zoo.Dense, zoo.Activation)


def plain(model: zoo.Model) -> bool:
    """Whether the model is a plain sequence of the layers the functional builders take."""
    return all(isinstance(layer, PLAIN) for layer in model.layers)


SUPPORTED: tuple[str, ...] = tuple(name for name in zoo.NAMES if plain(zoo.model(name)))


@dataclass(frozen=True)
class Step:
    """One layer of the sequence with its input shape (C, H, W or features) and, for a layer
    with weights, the index of its kernel in the weight list (its bias, if any, follows it)."""

    layer: zoo.Layer
    shape: zoo.Shape
    weight: int = -1
    bias: bool = False


def steps(model: zoo.Model) -> list[Step]:
    """The model's layers in order; refuses a layer the functional builders do not take."""
    out: list[Step] = []
    shape, index = model.input, 0
    for layer in model.layers:
        if not isinstance(layer, PLAIN):
            raise HpcbenchError(
                f"model {model.name}: layer {type(layer).__name__} is not supported here "
                f"(models of plain layers: {', '.join(SUPPORTED)})"
            )
        if isinstance(layer, (zoo.Conv, zoo.Dense)):
            out.append(Step(layer, shape, index, layer.bias))
            index += 2 if layer.bias else 1
        else:
            out.append(Step(layer, shape))
        shape = zoo.output_shape(layer, shape)
    return out


def _shapes(model: zoo.Model) -> Iterator[tuple[str, tuple[int, ...], int]]:
    """(name, shape, fan-in) of every weight, in creation order."""
    for i, step in enumerate(steps(model)):
        layer = step.layer
        if isinstance(layer, zoo.Conv):
            kh, kw = layer.kernel
            yield f"conv{i}.weight", (layer.out, step.shape[0], kh, kw), step.shape[0] * kh * kw
        elif isinstance(layer, zoo.Dense):
            yield f"dense{i}.weight", (step.shape[0], layer.out), step.shape[0]
        else:
            continue
        if step.bias:
            yield f"{type(layer).__name__.lower()}{i}.bias", (layer.out,), 0


def initial(model: zoo.Model, seed: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array) of every weight: He-normal kernels, zero biases; the same for a seed."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, fan_in in _shapes(model):
        if fan_in:
            value = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        else:
            value = np.zeros(shape, dtype=np.float32)
        out.append((name, value))
    return out


def count(weights: list[tuple[str, np.ndarray]]) -> int:
    return sum(int(w.size) for _, w in weights)
