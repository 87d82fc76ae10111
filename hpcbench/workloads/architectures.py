"""The zoo's networks, one function per family, each returning its tree of layer records.

Each function takes the class count (the autoencoder: the width of its input, which its last
layer rebuilds) and returns the layers; `ARCHITECTURES` gives every model's default input and
class count with its function. `zoo.model` is how the rest of hpcbench asks for a model.
Shared blocks (inception modules, ResNet's bottleneck) sit beside the family that uses them.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcbench.workloads.layers import (
    RELU,
    Activation,
    BatchNorm,
    Concat,
    Dense,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Layer,
    Pool,
    Residual,
    Shape,
    conv,
    conv_bn_relu,
    conv_relu,
)


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


ARCHITECTURES: dict[str, tuple[Shape, int, Callable[[int], tuple[Layer, ...]]]] = {
    "lenet": ((1, 28, 28), 10, _lenet),
    "mlp": ((1, 28, 28), 10, _mlp),
    "autoencoder": ((1, 28, 28), 0, _autoencoder),
    "cifar10_quick": ((3, 32, 32), 10, _cifar10_quick),
    "alexnet": ((3, 224, 224), 1000, _alexnet),
    "googlenet": ((3, 224, 224), 1000, _googlenet),
    "resnet50": ((3, 224, 224), 1000, _resnet50),
    "inception_v3": ((3, 299, 299), 1000, _inception_v3),
}
