"""Model FLOPs: the arithmetic a training step of a model must do, counted once from its
record tree (docs/metrics-and-model.md, "Model FLOPs").

Counted, as a multiply-add = 2 FLOPs, per sample:

- every matrix product with weights: a dense layer 2·F_in·F_out per token (attention's Q, K,
  V and output projections, the MLP's two or three matrices, a language model's head:
  tied or not, it is a product of the hidden states with the vocabulary's table), a
  convolution 2·C_in·kh·kw·C_out·H_out·W_out (ViT's patch projection is one);
- attention's two products with the sequence, Q·Kᵀ and the weights·V: 2·S·S·D each per
  sequence (4·S²·D), counted in full for a causal model too, as PaLM's and torchtitan's MFU
  do and as PyTorch's own FLOP counter counts scaled-dot-product attention; a kernel that
  skips the masked half does about half of that (`ModelFlops.attention` says how much);
- the backward pass: twice the forward (the gradient of the input and of the weights), except
  for a product whose input is the data itself (an image's first convolution, ViT's patch
  projection): there is no input gradient to compute, once the forward.

Not counted: embeddings (a lookup), norms, activations, softmax, the loss and the optimizer
(element-wise, a few per parameter or activation: under 1 % of a transformer's step), as in
every MFU definition in use. Nothing is recomputed in hpcbench's steps, so the hardware FLOPs
equal these; a step that recomputed activations would do more (a separate figure).
`tests/workloads/test_flops.py` checks the count against PyTorch's `FlopCounterMode`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hpcbench.workloads.blocks import Attention, FeedForward, Patches, TokenHead
from hpcbench.workloads.layers import Conv, Dense, Layer, Model, Shape
from hpcbench.workloads.shapes import kv_width, layer_parameters, leaves, output_shape, size


@dataclass(frozen=True)
class ModelFlops:
    """A model's FLOPs per sample (see the module's doc)."""

    forward: float  # matrix products and attention, one forward pass
    backward: float  # the same products' backward pass
    attention: float  # of forward + backward: attention's S² products (a causal kernel does about half)

    @property
    def training(self) -> float:
        """FLOPs of one training step per sample: forward + backward."""
        return self.forward + self.backward


def layer_matmul_flops(layer: Layer, shape: Shape) -> tuple[float, float]:
    """(matrix-product FLOPs, of which attention's S² products) of one leaf layer's forward
    pass on one sample whose input has `shape`."""
    if isinstance(layer, Conv):
        return 2.0 * shape[0] * layer.kernel[0] * layer.kernel[1] * size(output_shape(layer, shape)), 0.0
    if isinstance(layer, Dense):
        return 2.0 * size(shape) * layer.out, 0.0
    if isinstance(layer, Patches):
        patches = (shape[1] // layer.patch) * (shape[2] // layer.patch)
        return 2.0 * shape[0] * layer.patch**2 * layer.dim * patches, 0.0
    if isinstance(layer, Attention):
        tokens, dim = shape
        projections = 2.0 * tokens * dim * (2 * dim + 2 * kv_width(layer, dim))
        quadratic = 4.0 * tokens * tokens * dim
        return projections + quadratic, quadratic
    if isinstance(layer, FeedForward):
        matrices = 3 if layer.kind == "swiglu" else 2
        return 2.0 * size(shape) * layer.hidden * matrices, 0.0
    if isinstance(layer, TokenHead):
        return 2.0 * size(shape) * layer.vocab, 0.0
    return 0.0, 0.0


def _products(m: Model) -> Iterator[tuple[float, float, bool]]:
    """(forward FLOPs, attention's share, whether its input is the data) of every leaf: the
    data flows until the first leaf with weights (an Embedding's output is not data)."""
    on_data = True
    for layer, shape in leaves(m.layers, m.input):
        flops, attention = layer_matmul_flops(layer, shape)
        yield flops, attention, on_data
        on_data = on_data and not layer_parameters(layer, shape)


def model_flops(m: Model) -> ModelFlops:
    """The model's FLOPs per sample (the module's doc)."""
    forward = backward = attention = 0.0
    for flops, quadratic, on_data in _products(m):
        forward += flops
        backward += flops if on_data else 2 * flops
        attention += 3 * quadratic
    return ModelFlops(forward, backward, attention)
