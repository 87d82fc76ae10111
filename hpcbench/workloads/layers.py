"""The vocabulary of the model trees: plain, frozen layer records and the `Model` that holds them.

A record says what a layer is (a convolution's kernel, a pool's stride), never how a framework
builds it: the builders of each framework (`frameworks/*/layers.py`) turn records into their
own layers, `shapes.py` walks the same records for shapes and parameter counts, and
`architectures.py` composes them into the zoo's networks (the helpers at the end, `conv`,
`conv_relu`, `conv_bn_relu`, are the blocks it repeats). `zoo.py` re-exports all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TypeAlias

    from hpcbench.workloads.blocks import (
        Attention,
        Block,
        Embedding,
        FeedForward,
        Norm,
        Patches,
        Pooling,
        Positions,
        TokenHead,
    )

Shape = tuple[int, ...]  # (C, H, W) for images, (F,) after Flatten, (S,) token ids, (S, D) hidden states
OBJECTIVES = ("classify", "reconstruct", "lm", "mlm")


@dataclass(frozen=True)
class Conv:
    out: int
    kernel: tuple[int, int]
    stride: int = 1
    pad: tuple[int, int] = (0, 0)  # rows, columns, on both sides
    bias: bool = True


@dataclass(frozen=True)
class BatchNorm:
    eps: float = 1e-5
    momentum: float = 0.1  # PyTorch's convention: new = (1 - momentum) * old + momentum * batch


@dataclass(frozen=True)
class Pool:
    kind: str  # "max" | "avg"
    kernel: int
    stride: int
    pad: int = 0


@dataclass(frozen=True)
class GlobalAvgPool:
    pass


@dataclass(frozen=True)
class Flatten:
    pass


@dataclass(frozen=True)
class Dense:
    """A matrix product over the last dimension: (F,) -> (out,), or (S, F) -> (S, out)."""

    out: int
    bias: bool = True


@dataclass(frozen=True)
class Activation:
    kind: str  # "relu" | "sigmoid" | "gelu"


@dataclass(frozen=True)
class Dropout:
    rate: float


@dataclass(frozen=True)
class Concat:
    """Branches applied to the same input, outputs concatenated along channels."""

    branches: tuple[tuple[Layer, ...], ...]


@dataclass(frozen=True)
class Residual:
    """body(x) + shortcut(x) (an empty shortcut is the identity)."""

    body: tuple[Layer, ...]
    shortcut: tuple[Layer, ...] = ()


# A string: `X | Y` of classes is evaluated here, which Python 3.9 (the Caffe environment's ranks) cannot do.
Layer: TypeAlias = (
    "Conv | BatchNorm | Pool | GlobalAvgPool | Flatten | Dense | Activation | Dropout | Concat | Residual"
    " | Embedding | Positions | Patches | Norm | Attention | FeedForward | Block | TokenHead | Pooling"
)


@dataclass(frozen=True)
class Model:
    name: str
    input: Shape  # default (C, H, W): synthetic data takes it, real data brings its own
    classes: int  # 0: not a classifier (trained to reconstruct its input)
    layers: tuple[Layer, ...]
    # What it is trained to do (OBJECTIVES); "" for the image models: "classify" with
    # classes, else "reconstruct". "lm": predict every next token (classes: the vocabulary);
    # "mlm": predict the masked tokens (BERT).
    objective: str = ""

    @property
    def task(self) -> str:
        if self.objective:
            return self.objective
        return "classify" if self.classes else "reconstruct"

    @property
    def tokens(self) -> int:
        """Tokens in one sample: the sequence length of a model that reads token ids, 0 for
        one that reads images (ViT included: its throughput is counted in images)."""
        return self.input[0] if len(self.input) == 1 and self.task in ("lm", "mlm") else 0


RELU = Activation("relu")


def conv(
    out: int, k: int | tuple[int, int], stride: int = 1, pad: int | tuple[int, int] = 0, bias: bool = True
) -> Conv:
    kernel = (k, k) if isinstance(k, int) else k
    padding = (pad, pad) if isinstance(pad, int) else pad
    return Conv(out, kernel, stride, padding, bias)


def conv_relu(out: int, k: int | tuple[int, int], stride: int = 1, pad: int | tuple[int, int] = 0) -> tuple[Layer, ...]:
    return (conv(out, k, stride, pad), RELU)


def conv_bn_relu(
    out: int, k: int | tuple[int, int], stride: int = 1, pad: int | tuple[int, int] = 0, eps: float = 1e-5
) -> tuple[Layer, ...]:
    return (conv(out, k, stride, pad, bias=False), BatchNorm(eps), RELU)
