"""Shape inference and parameter counts, walking the same model trees the builders walk.

`output_shape` follows one layer (and refuses an input the layer cannot take),
`sequence_shape` / `shapes` a sequence or a whole model; `count_parameters` and
`gradient_sizes` give what every framework's builder must produce, layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hpcbench.errors import HpcbenchError
from hpcbench.workloads import blocks as b
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


def _sequence_output(layer: Layer, shape: Shape, where: str) -> Shape:
    """Shape after a transformer layer (`blocks.py`): (S,) token ids or (S, D) hidden states."""
    name = type(layer).__name__
    if isinstance(layer, b.Embedding):
        if len(shape) != 1:
            raise HpcbenchError(f"{where}Embedding needs token ids (S,), got shape {shape}")
        return (shape[0], layer.dim)
    if isinstance(layer, b.Patches):
        if len(shape) != 3 or shape[1] % layer.patch or shape[2] % layer.patch:
            raise HpcbenchError(
                f"{where}Patches of {layer.patch} need an image (C, H, W) with H and W multiples of "
                f"{layer.patch}, got shape {shape}"
            )
        return ((shape[1] // layer.patch) * (shape[2] // layer.patch) + 1, layer.dim)
    if len(shape) != 2:
        raise HpcbenchError(f"{where}{name} needs hidden states (S, D), got shape {shape}")
    tokens, dim = shape
    if isinstance(layer, b.Positions) and tokens > layer.max_len:
        raise HpcbenchError(f"{where}{tokens} tokens is more than the {layer.max_len} positions the model learns")
    if isinstance(layer, (b.Attention, b.Block)):
        attention = layer.attention if isinstance(layer, b.Block) else layer
        if dim % attention.heads or attention.heads % attention.groups or (dim // attention.heads) % 2:
            raise HpcbenchError(
                f"{where}{attention.heads} heads ({attention.groups} for K and V) do not split {dim} features "
                "into even head widths"
            )
    if isinstance(layer, b.TokenHead):
        return (tokens, layer.vocab)
    if isinstance(layer, b.Pooling):
        return (dim,)
    return shape  # Positions, Norm, Attention, FeedForward, Block keep (S, D)


def output_shape(layer: Layer, shape: Shape, where: str = "") -> Shape:
    """Shape after `layer`; raises HpcbenchError when the input does not fit the layer."""
    out_shape: Shape
    if isinstance(layer, (Conv, Pool, GlobalAvgPool)):
        out_shape = _image_output(layer, shape, where)
    elif isinstance(layer, Flatten):
        out_shape = (size(shape),)
    elif isinstance(layer, Dense):
        if len(shape) not in (1, 2):
            raise HpcbenchError(f"{where}Dense needs a flat input or hidden states (S, D), got shape {shape}")
        out_shape = (*shape[:-1], layer.out)
    elif isinstance(layer, b.RECORDS):
        out_shape = _sequence_output(layer, shape, where)
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
        elif isinstance(layer, b.Block):
            parts = (layer.norm, layer.attention, layer.norm, layer.mlp)
            order = parts if layer.pre_norm else (parts[1], parts[0], parts[3], parts[2])
            for part in order:
                yield part, shape
        else:
            yield layer, shape
        shape = output_shape(layer, shape)


def kv_width(attention: b.Attention, dim: int) -> int:
    """Features of K (and of V): kv heads x head width."""
    return attention.groups * (dim // attention.heads)


def _sequence_parameters(layer: Layer, shape: Shape) -> int:
    dim = shape[-1]
    if isinstance(layer, b.Embedding):
        return (layer.vocab + layer.types) * layer.dim
    if isinstance(layer, b.Positions):
        return layer.max_len * dim
    if isinstance(layer, b.Patches):
        tokens = (shape[1] // layer.patch) * (shape[2] // layer.patch) + 1
        return shape[0] * layer.patch**2 * layer.dim + layer.dim + layer.dim + tokens * layer.dim
    if isinstance(layer, b.Norm):
        return 2 * dim if layer.kind == "layer" else dim
    if isinstance(layer, b.Attention):
        kv = kv_width(layer, dim)
        return 2 * dim * dim + 2 * dim * kv + ((2 * dim + 2 * kv) if layer.bias else 0)
    if isinstance(layer, b.FeedForward):
        if layer.kind == "swiglu":
            return 3 * dim * layer.hidden + ((2 * layer.hidden + dim) if layer.bias else 0)
        return 2 * dim * layer.hidden + ((layer.hidden + dim) if layer.bias else 0)
    if isinstance(layer, b.TokenHead):
        return (0 if layer.tied else dim * layer.vocab) + (layer.vocab if layer.bias else 0)
    return 0


def layer_parameters(layer: Layer, shape: Shape) -> int:
    """Trainable parameters of one leaf layer with input `shape` (BatchNorm: scale and shift)."""
    if isinstance(layer, Conv):
        return layer.out * shape[0] * layer.kernel[0] * layer.kernel[1] + (layer.out if layer.bias else 0)
    if isinstance(layer, Dense):
        return layer.out * shape[-1] + (layer.out if layer.bias else 0)
    if isinstance(layer, BatchNorm):
        return 2 * shape[0]
    return _sequence_parameters(layer, shape)


def count_parameters(m: Model) -> int:
    """Trainable parameters (what every framework's builder must produce)."""
    return sum(layer_parameters(layer, shape) for layer, shape in leaves(m.layers, m.input))


def gradient_sizes(m: Model) -> list[int]:
    """Parameters of each layer that has any, in forward order (per-layer gradient sizes)."""
    return [n for layer, shape in leaves(m.layers, m.input) if (n := layer_parameters(layer, shape))]
