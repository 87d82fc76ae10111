"""Shape inference and parameter counts, walking the same model trees the builders walk.

`output_shape` follows one layer (and refuses an input the layer cannot take),
`sequence_shape` / `shapes` a sequence or a whole model; `count_parameters` and
`gradient_sizes` give what every framework's builder must produce, layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hpcbench.errors import HpcbenchError
from hpcbench.workloads.layers import (
    BatchNorm,
    Concat,
    Conv,
    Dense,
    Flatten,
    GlobalAvgPool,
    Layer,
    Model,
    Pool,
    Residual,
    Shape,
)


def size(shape: Shape) -> int:
    """Elements in one sample of `shape`."""
    n = 1
    for d in shape:
        n *= d
    return n


def _spatial(length: int, kernel: int, stride: int, pad: int) -> int:
    return (length + 2 * pad - kernel) // stride + 1


def _image_output(layer: Conv | Pool | GlobalAvgPool, shape: Shape, where: str) -> Shape:
    """Shape after a layer that needs an image input (C, H, W)."""
    if len(shape) != 3:
        raise HpcbenchError(f"{where}{type(layer).__name__} needs an image input, got shape {shape}")
    c, h, w = shape
    if isinstance(layer, Conv):
        return (
            layer.out,
            _spatial(h, layer.kernel[0], layer.stride, layer.pad[0]),
            _spatial(w, layer.kernel[1], layer.stride, layer.pad[1]),
        )
    if isinstance(layer, Pool):
        return (
            c,
            _spatial(h, layer.kernel, layer.stride, layer.pad),
            _spatial(w, layer.kernel, layer.stride, layer.pad),
        )
    return (c, 1, 1)


def _combined_output(layer: Concat | Residual, shape: Shape, where: str) -> Shape:
    """Shape after a layer made of sequences applied to the same input."""
    if isinstance(layer, Concat):
        outs = [sequence_shape(branch, shape, where) for branch in layer.branches]
        if len({o[1:] for o in outs}) != 1:
            raise HpcbenchError(f"{where}Concat branches disagree on spatial size: {outs}")
        return (sum(o[0] for o in outs), *outs[0][1:])
    body = sequence_shape(layer.body, shape, where)
    short = sequence_shape(layer.shortcut, shape, where)
    if body != short:
        raise HpcbenchError(f"{where}Residual body {body} and shortcut {short} differ")
    return body


def output_shape(layer: Layer, shape: Shape, where: str = "") -> Shape:
    """Shape after `layer`; raises HpcbenchError when the input does not fit the layer."""
    out_shape: Shape
    if isinstance(layer, (Conv, Pool, GlobalAvgPool)):
        out_shape = _image_output(layer, shape, where)
    elif isinstance(layer, Flatten):
        out_shape = (size(shape),)
    elif isinstance(layer, Dense):
        if len(shape) != 1:
            raise HpcbenchError(f"{where}Dense needs a flat input, got shape {shape}")
        out_shape = (layer.out,)
    elif isinstance(layer, (Concat, Residual)):
        out_shape = _combined_output(layer, shape, where)
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


def leaves(layers: Sequence[Layer], shape: Shape) -> Iterator[tuple[Layer, Shape]]:
    """(layer, its input shape) for every leaf layer, depth first, in build order."""
    for layer in layers:
        if isinstance(layer, Concat):
            for branch in layer.branches:
                yield from leaves(branch, shape)
        elif isinstance(layer, Residual):
            yield from leaves(layer.body, shape)
            yield from leaves(layer.shortcut, shape)
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
    return sum(layer_parameters(layer, shape) for layer, shape in leaves(m.layers, m.input))


def gradient_sizes(m: Model) -> list[int]:
    """Parameters of each layer that has any, in forward order (per-layer gradient sizes)."""
    return [n for layer, shape in leaves(m.layers, m.input) if (n := layer_parameters(layer, shape))]
