"""What a model costs, tensor by tensor: every trainable tensor's size and the forward FLOPs
of the layer it belongs to, per sample. The performance model spreads a measured backward
time over the tensors in proportion to these FLOPs (backward does about twice the forward's
arithmetic in every layer with weights) and sends their gradients in backward order.

FLOPs count a multiply-add as two: a convolution 2·C_in·kh·kw·C_out·H_out·W_out, a dense
layer 2·F_in·F_out; BatchNorm's scale and shift 2 per element (4·C·H·W in all). Layers
without weights (pooling, activations) are left out: they own no gradient, and their share
of the backward time is spread with the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hpcbench.workloads.flops import layer_matmul_flops
from hpcbench.workloads.layers import BatchNorm, Layer, Model, Shape
from hpcbench.workloads.shapes import layer_parameters, leaves, output_shape, size

FLOAT32_BYTES = 4


@dataclass(frozen=True)
class TensorCost:
    """One layer's trainable parameters (weights and bias together) and forward FLOPs per sample."""

    name: str  # e.g. "3.conv" — the index in build order and the kind of layer
    parameters: int
    flops: float

    @property
    def grad_bytes(self) -> int:
        return self.parameters * FLOAT32_BYTES


def _leaves(layers: Sequence[Layer], shape: Shape) -> Iterator[tuple[Layer, Shape, Shape]]:
    """(layer, its input shape, its output shape) for every leaf layer, in build order."""
    for layer, given in leaves(layers, shape):
        yield layer, given, output_shape(layer, given)


def layer_flops(layer: Layer, shape: Shape, out: Shape) -> float:
    """Forward FLOPs per sample of one leaf layer with input `shape` and output `out`: its
    matrix products (`flops.layer_matmul_flops`: convolutions, dense layers, a transformer's
    attention and MLP) and BatchNorm's element-wise scale and shift."""
    if isinstance(layer, BatchNorm):
        return 4.0 * size(shape)
    return layer_matmul_flops(layer, shape)[0]


def tensor_costs(m: Model) -> list[TensorCost]:
    """Every layer with weights, in forward (build) order."""
    out = []
    for i, (layer, shape, result) in enumerate(_leaves(m.layers, m.input)):
        n = layer_parameters(layer, shape)
        if n:
            out.append(TensorCost(f"{i}.{type(layer).__name__.lower()}", n, layer_flops(layer, shape, result)))
    return out


def backward_order(m: Model) -> list[TensorCost]:
    """The tensors in the order their gradients become ready: the last layer's first."""
    return tensor_costs(m)[::-1]
