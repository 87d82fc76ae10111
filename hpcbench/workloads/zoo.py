"""The benchmark models, described once and built by every framework from this description.

A model is a tree of plain layer records (`Conv`, `Dense`, `Concat`, `Residual`, ...). Each
framework adapter turns the tree into its own layers (`frameworks/torch_layers.py`, the
Keras and Gluon builders), so the architectures are the same by construction and their
parameter counts can be checked against `count_parameters`, which walks the same tree.

Layout conventions every builder follows: images are NCHW here (a builder for a channels-last
framework transposes its input), pooling rounds down (explicit `pad` where the original
network rounded up), padding of a max-pool is applied after a ReLU, so zero padding and
-inf padding give the same result, and average pools count padded zeros (as PyTorch's and
MXNet's defaults do).

Models (seed papers in parentheses):

=================  ===========  =======  =====================================================
name               input        classes  what
=================  ===========  =======  =====================================================
lenet              1x28x28      10       LeNet-5 (002)
mlp                1x28x28      10       two hidden layers of 512 (001)
autoencoder        1x28x28      -        784-256-64-256-784 dense autoencoder (001)
cifar10_quick      3x32x32      10       Caffe's cifar10_quick (002)
alexnet            3x224x224    1000     AlexNet, one-tower variant without LRN (000, 004)
googlenet          3x224x224    1000     GoogLeNet / Inception v1 without auxiliary heads (000, 004)
resnet50           3x224x224    1000     ResNet-50 v1.5 (000, 004)
inception_v3       3x299x299    1000     Inception v3 without the auxiliary head (004)
=================  ===========  =======  =====================================================

A model built on a real dataset takes the dataset's image shape and class count instead
(LeNet on CIFAR-10 is 3x32x32, 10 classes); `shapes` refuses inputs too small for a model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hpcbench.errors import HpcbenchError

Shape = tuple[int, ...]  # (C, H, W) for images, (F,) after Flatten


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
    out: int
    bias: bool = True


@dataclass(frozen=True)
class Activation:
    kind: str  # "relu" | "sigmoid"


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


Layer = Conv | BatchNorm | Pool | GlobalAvgPool | Flatten | Dense | Activation | Dropout | Concat | Residual


@dataclass(frozen=True)
class Model:
    name: str
    input: Shape  # default (C, H, W): synthetic data takes it, real data brings its own
    classes: int  # 0: not a classifier (trained to reconstruct its input)
    layers: tuple[Layer, ...]

    @property
    def task(self) -> str:
        return "classify" if self.classes else "reconstruct"


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


# --------------------------------------------------------------------------------------
# The architectures.


def _lenet(classes: int) -> tuple[Layer, ...]:
    return (
        *conv_relu(6, 5, pad=2),
        Pool("max", 2, 2),
        *conv_relu(16, 5),
        Pool("max", 2, 2),
        Flatten(),
        Dense(120),
        RELU,
        Dense(84),
        RELU,
        Dense(classes),
    )


def _mlp(classes: int) -> tuple[Layer, ...]:
    return (Flatten(), Dense(512), RELU, Dense(512), RELU, Dense(classes))


def _autoencoder(features: int) -> tuple[Layer, ...]:
    return (Flatten(), Dense(256), RELU, Dense(64), RELU, Dense(256), RELU, Dense(features), Activation("sigmoid"))


def _cifar10_quick(classes: int) -> tuple[Layer, ...]:
    # Caffe's pools round up: 32 -> 16 -> 8 -> 4; pad 1 with rounding down gives the same sizes.
    return (
        conv(32, 5, pad=2),
        Pool("max", 3, 2, 1),
        RELU,
        *conv_relu(32, 5, pad=2),
        Pool("avg", 3, 2, 1),
        *conv_relu(64, 5, pad=2),
        Pool("avg", 3, 2, 1),
        Flatten(),
        Dense(64),
        Dense(classes),
    )


def _alexnet(classes: int) -> tuple[Layer, ...]:
    return (
        *conv_relu(64, 11, 4, 2),
        Pool("max", 3, 2),
        *conv_relu(192, 5, pad=2),
        Pool("max", 3, 2),
        *conv_relu(384, 3, pad=1),
        *conv_relu(256, 3, pad=1),
        *conv_relu(256, 3, pad=1),
        Pool("max", 3, 2),
        Flatten(),
        Dropout(0.5),
        Dense(4096),
        RELU,
        Dropout(0.5),
        Dense(4096),
        RELU,
        Dense(classes),
    )


def _inception_v1(n1: int, n3r: int, n3: int, n5r: int, n5: int, pool: int) -> Concat:
    return Concat(
        (
            conv_relu(n1, 1),
            (*conv_relu(n3r, 1), *conv_relu(n3, 3, pad=1)),
            (*conv_relu(n5r, 1), *conv_relu(n5, 5, pad=2)),
            (Pool("max", 3, 1, 1), *conv_relu(pool, 1)),
        )
    )


def _googlenet(classes: int) -> tuple[Layer, ...]:
    return (
        *conv_relu(64, 7, 2, 3),
        Pool("max", 3, 2, 1),
        *conv_relu(64, 1),
        *conv_relu(192, 3, pad=1),
        Pool("max", 3, 2, 1),
        _inception_v1(64, 96, 128, 16, 32, 32),
        _inception_v1(128, 128, 192, 32, 96, 64),
        Pool("max", 3, 2, 1),
        _inception_v1(192, 96, 208, 16, 48, 64),
        _inception_v1(160, 112, 224, 24, 64, 64),
        _inception_v1(128, 128, 256, 24, 64, 64),
        _inception_v1(112, 144, 288, 32, 64, 64),
        _inception_v1(256, 160, 320, 32, 128, 128),
        Pool("max", 3, 2, 1),
        _inception_v1(256, 160, 320, 32, 128, 128),
        _inception_v1(384, 192, 384, 48, 128, 128),
        GlobalAvgPool(),
        Flatten(),
        Dropout(0.4),
        Dense(classes),
    )


def _bottleneck(width: int, stride: int, project: bool) -> tuple[Layer, ...]:
    out = width * 4
    body = (
        *conv_bn_relu(width, 1),
        *conv_bn_relu(width, 3, stride, 1),  # v1.5: the stride sits on the 3x3 convolution
        conv(out, 1, bias=False),
        BatchNorm(),
    )
    shortcut: tuple[Layer, ...] = (conv(out, 1, stride, bias=False), BatchNorm()) if project else ()
    return (Residual(body, shortcut), RELU)


def _resnet50(classes: int) -> tuple[Layer, ...]:
    layers: list[Layer] = [*conv_bn_relu(64, 7, 2, 3), Pool("max", 3, 2, 1)]
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            layers += _bottleneck(width, stride, project=block == 0)
    return (*layers, GlobalAvgPool(), Flatten(), Dense(classes))


def _cbr(out: int, k: int | tuple[int, int], stride: int = 1, pad: int | tuple[int, int] = 0) -> tuple[Layer, ...]:
    return conv_bn_relu(out, k, stride, pad, eps=1e-3)


def _inception_a(pool: int) -> Concat:
    return Concat(
        (
            _cbr(64, 1),
            (*_cbr(48, 1), *_cbr(64, 5, pad=2)),
            (*_cbr(64, 1), *_cbr(96, 3, pad=1), *_cbr(96, 3, pad=1)),
            (Pool("avg", 3, 1, 1), *_cbr(pool, 1)),
        )
    )


def _inception_b() -> Concat:
    return Concat(
        (
            _cbr(384, 3, 2),
            (*_cbr(64, 1), *_cbr(96, 3, pad=1), *_cbr(96, 3, 2)),
            (Pool("max", 3, 2),),
        )
    )


def _inception_c(c7: int) -> Concat:
    return Concat(
        (
            _cbr(192, 1),
            (*_cbr(c7, 1), *_cbr(c7, (1, 7), pad=(0, 3)), *_cbr(192, (7, 1), pad=(3, 0))),
            (
                *_cbr(c7, 1),
                *_cbr(c7, (7, 1), pad=(3, 0)),
                *_cbr(c7, (1, 7), pad=(0, 3)),
                *_cbr(c7, (7, 1), pad=(3, 0)),
                *_cbr(192, (1, 7), pad=(0, 3)),
            ),
            (Pool("avg", 3, 1, 1), *_cbr(192, 1)),
        )
    )


def _inception_d() -> Concat:
    return Concat(
        (
            (*_cbr(192, 1), *_cbr(320, 3, 2)),
            (*_cbr(192, 1), *_cbr(192, (1, 7), pad=(0, 3)), *_cbr(192, (7, 1), pad=(3, 0)), *_cbr(192, 3, 2)),
            (Pool("max", 3, 2),),
        )
    )


def _split_1x3_3x1(out: int) -> Concat:
    return Concat((_cbr(out, (1, 3), pad=(0, 1)), _cbr(out, (3, 1), pad=(1, 0))))


def _inception_e() -> Concat:
    return Concat(
        (
            _cbr(320, 1),
            (*_cbr(384, 1), _split_1x3_3x1(384)),
            (*_cbr(448, 1), *_cbr(384, 3, pad=1), _split_1x3_3x1(384)),
            (Pool("avg", 3, 1, 1), *_cbr(192, 1)),
        )
    )


def _inception_v3(classes: int) -> tuple[Layer, ...]:
    return (
        *_cbr(32, 3, 2),
        *_cbr(32, 3),
        *_cbr(64, 3, pad=1),
        Pool("max", 3, 2),
        *_cbr(80, 1),
        *_cbr(192, 3),
        Pool("max", 3, 2),
        _inception_a(32),
        _inception_a(64),
        _inception_a(64),
        _inception_b(),
        _inception_c(128),
        _inception_c(160),
        _inception_c(160),
        _inception_c(192),
        _inception_d(),
        _inception_e(),
        _inception_e(),
        GlobalAvgPool(),
        Flatten(),
        Dropout(0.5),
        Dense(classes),
    )


_ARCHITECTURES = {
    "lenet": ((1, 28, 28), 10, _lenet),
    "mlp": ((1, 28, 28), 10, _mlp),
    "autoencoder": ((1, 28, 28), 0, _autoencoder),
    "cifar10_quick": ((3, 32, 32), 10, _cifar10_quick),
    "alexnet": ((3, 224, 224), 1000, _alexnet),
    "googlenet": ((3, 224, 224), 1000, _googlenet),
    "resnet50": ((3, 224, 224), 1000, _resnet50),
    "inception_v3": ((3, 299, 299), 1000, _inception_v3),
}
NAMES: tuple[str, ...] = tuple(_ARCHITECTURES)


def model(name: str, input_shape: Shape | None = None, classes: int | None = None) -> Model:
    """The model `name`, for `input_shape` (C, H, W) and `classes` (defaults: its own)."""
    try:
        default_input, default_classes, layers = _ARCHITECTURES[name]
    except KeyError:
        raise HpcbenchError(f"unknown model {name!r} (known: {', '.join(NAMES)})") from None
    shape = tuple(input_shape or default_input)
    n_classes = default_classes if classes is None or default_classes == 0 else classes
    # The autoencoder's last layer rebuilds the input: its width is the input's size.
    arg = n_classes if default_classes else _size(shape)
    built = Model(name, shape, n_classes, layers(arg))
    shapes(built)  # refuse inputs the model cannot take, here rather than inside a framework
    return built


# --------------------------------------------------------------------------------------
# Shape inference and parameter counts, walking the same tree the builders walk.


def _size(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _spatial(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def output_shape(layer: Layer, shape: Shape, where: str = "") -> Shape:
    """Shape after `layer`; raises HpcbenchError when the input does not fit the layer."""

    def need_image() -> tuple[int, int, int]:
        if len(shape) != 3:
            raise HpcbenchError(f"{where}{type(layer).__name__} needs an image input, got shape {shape}")
        return shape[0], shape[1], shape[2]

    if isinstance(layer, Conv):
        _, h, w = need_image()
        out_shape: Shape = (
            layer.out,
            _spatial(h, layer.kernel[0], layer.stride, layer.pad[0]),
            _spatial(w, layer.kernel[1], layer.stride, layer.pad[1]),
        )
    elif isinstance(layer, Pool):
        c, h, w = need_image()
        out_shape = (
            c,
            _spatial(h, layer.kernel, layer.stride, layer.pad),
            _spatial(w, layer.kernel, layer.stride, layer.pad),
        )
    elif isinstance(layer, GlobalAvgPool):
        out_shape = (need_image()[0], 1, 1)
    elif isinstance(layer, Flatten):
        out_shape = (_size(shape),)
    elif isinstance(layer, Dense):
        if len(shape) != 1:
            raise HpcbenchError(f"{where}Dense needs a flat input, got shape {shape}")
        out_shape = (layer.out,)
    elif isinstance(layer, Concat):
        outs = [sequence_shape(branch, shape, where) for branch in layer.branches]
        if len({o[1:] for o in outs}) != 1:
            raise HpcbenchError(f"{where}Concat branches disagree on spatial size: {outs}")
        out_shape = (sum(o[0] for o in outs), *outs[0][1:])
    elif isinstance(layer, Residual):
        body = sequence_shape(layer.body, shape, where)
        short = sequence_shape(layer.shortcut, shape, where)
        if body != short:
            raise HpcbenchError(f"{where}Residual body {body} and shortcut {short} differ")
        out_shape = body
    else:  # BatchNorm, Activation, Dropout keep the shape
        out_shape = shape
    if min(out_shape) < 1:
        raise HpcbenchError(f"{where}input {shape} is too small for {layer}")
    return out_shape


def sequence_shape(layers: Sequence[Layer], shape: Shape, where: str = "") -> Shape:
    for layer in layers:
        shape = output_shape(layer, shape, where)
    return shape


def shapes(m: Model) -> Shape:
    """The model's output shape; raises HpcbenchError naming the model if its input does not fit."""
    return sequence_shape(m.layers, m.input, f"model {m.name} on input {m.input}: ")


def _walk(layers: Sequence[Layer], shape: Shape) -> Iterator[tuple[Layer, Shape]]:
    """(layer, its input shape) for every leaf layer, depth first, in build order."""
    for layer in layers:
        if isinstance(layer, Concat):
            for branch in layer.branches:
                yield from _walk(branch, shape)
        elif isinstance(layer, Residual):
            yield from _walk(layer.body, shape)
            yield from _walk(layer.shortcut, shape)
        else:
            yield layer, shape
        shape = output_shape(layer, shape)


def layer_parameters(layer: Layer, shape: Shape) -> int:
    """Trainable parameters of one leaf layer with input `shape` (BatchNorm: scale and shift)."""
    if isinstance(layer, Conv):
        return layer.out * shape[0] * layer.kernel[0] * layer.kernel[1] + (layer.out if layer.bias else 0)
    if isinstance(layer, Dense):
        return layer.out * shape[0] + (layer.out if layer.bias else 0)
    if isinstance(layer, BatchNorm):
        return 2 * shape[0]
    return 0


def count_parameters(m: Model) -> int:
    """Trainable parameters (what every framework's builder must produce)."""
    return sum(layer_parameters(layer, shape) for layer, shape in _walk(m.layers, m.input))


def gradient_sizes(m: Model) -> list[int]:
    """Parameters of each layer that has any, in forward order (per-layer gradient sizes)."""
    return [n for layer, shape in _walk(m.layers, m.input) if (n := layer_parameters(layer, shape))]
