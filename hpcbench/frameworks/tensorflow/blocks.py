"""Keras 3 layers of the transformer records (`hpcbench.workloads.blocks`) and the functional
model of a transformer of the zoo.

Imports Keras at module level: import this module only where it exists (inside the
TensorFlow adapter's methods, or through `layers.build`).

Attention is `keras.ops.dot_product_attention(q, k, v, is_causal=...)`, Keras' one
attention op (fused where its backend has a fused kernel), on (batch, tokens, heads, head
width) tensors; grouped-query K and V keep their own heads (the op repeats each K/V head for
heads / kv_heads consecutive query heads). On the TensorFlow backend there is no fused
kernel (Keras refuses `flash_attention=True` there): the op lowers to einsum(Q, K) -> scale
-> causal mask (`band_part`, `where`) -> softmax in float32 -> einsum(P, V), which XLA
compiles with the rest of forward and backward under `compile: xla`.
Norms are `keras.layers.LayerNormalization` and `keras.layers.RMSNormalization` (both
normalise in float32 under a mixed policy); every matrix is a `keras.layers.Dense`. The
token table serves the tied head too (`TokenEmbedding(..., reverse=True)`, as KerasHub's
`ReversibleEmbedding`): one variable, whose gradient sums both uses.

Weights start as GPT-2's and Llama's do: matrices and tables normal(0, 0.02), biases zero,
norm scales one; Keras' seed (`keras.utils.set_random_seed`) makes them equal on every rank.
Under a mixed-precision policy (`mixed_bfloat16`, `mixed_float16`) the weights stay float32
and the layers compute in the policy's dtype; the logits are cast back to float32 by the loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import keras
from keras import ops

from hpcbench.frameworks.tensorflow.layers import Namer, nhwc
from hpcbench.workloads import zoo
from hpcbench.workloads.shapes import kv_width, output_shape

INIT_STD = 0.02


def _init() -> Any:
    return keras.initializers.RandomNormal(stddev=INIT_STD)


def _dense(units: int, bias: bool, name: str) -> keras.layers.Dense:
    return keras.layers.Dense(units, use_bias=bias, kernel_initializer=_init(), name=name)


def gelu_tanh(x: Any) -> Any:
    """GELU, tanh approximation (GPT-2, BERT, ViT)."""
    return keras.activations.gelu(x, approximate=True)


class TokenEmbedding(keras.layers.Layer):  # type: ignore[misc]
    """Token ids (B, S) -> (B, S, D); with `reverse=True`, hidden states (B, S, D) -> logits
    (B, S, vocab) through the same table transposed (the tied head). `types` > 0 adds BERT's
    token-type table (every token of type 0)."""

    def __init__(self, record: zoo.Embedding, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record

    def build(self, input_shape: Any) -> None:
        r = self.record
        self.embeddings = self.add_weight(shape=(r.vocab, r.dim), initializer=_init(), name="embeddings")
        self.token_types = (
            self.add_weight(shape=(r.types, r.dim), initializer=_init(), name="token_types") if r.types else None
        )

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        table = ops.cast(self.embeddings, self.compute_dtype)
        if reverse:
            return ops.matmul(inputs, ops.transpose(table))
        out = ops.take(table, inputs, axis=0)
        if self.token_types is not None:
            out = out + ops.cast(self.token_types[0], self.compute_dtype)
        return out


class PositionEmbedding(keras.layers.Layer):  # type: ignore[misc]
    """Learned absolute positions added to (B, S, D)."""

    def __init__(self, max_len: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_len = max_len

    def build(self, input_shape: Any) -> None:
        self.table = self.add_weight(shape=(self.max_len, input_shape[-1]), initializer=_init(), name="table")

    def call(self, x: Any) -> Any:
        return x + ops.cast(self.table[: x.shape[1]], x.dtype)


class PatchEmbedding(keras.layers.Layer):  # type: ignore[misc]
    """ViT's stem on a channels-last image (B, H, W, C): a convolution of kernel = stride =
    patch (with bias), a learned class token in front, learned positions added."""

    def __init__(self, record: zoo.Patches, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.project = keras.layers.Conv2D(
            record.dim, record.patch, strides=record.patch, padding="valid", kernel_initializer=_init(), name="project"
        )

    def build(self, input_shape: Any) -> None:
        height, width, patch, dim = input_shape[1], input_shape[2], self.record.patch, self.record.dim
        self.tokens = (height // patch) * (width // patch) + 1
        self.project.build(input_shape)
        self.cls = self.add_weight(shape=(1, 1, dim), initializer="zeros", name="cls")
        self.positions = self.add_weight(shape=(1, self.tokens, dim), initializer=_init(), name="positions")

    def call(self, x: Any) -> Any:
        patches = self.project(x)  # (B, H/p, W/p, D): row-major patches, as PyTorch's flatten
        patches = ops.reshape(patches, (-1, self.tokens - 1, self.record.dim))
        cls = ops.broadcast_to(ops.cast(self.cls, patches.dtype), (ops.shape(patches)[0], 1, self.record.dim))
        return ops.concatenate([cls, patches], axis=1) + ops.cast(self.positions, patches.dtype)

    def compute_output_shape(self, input_shape: Any) -> Any:
        patch = self.record.patch
        return (input_shape[0], (input_shape[1] // patch) * (input_shape[2] // patch) + 1, self.record.dim)


def norm(record: zoo.Norm, name: str) -> keras.layers.Layer:
    """LayerNorm (scale and shift) or RMSNorm (x * rsqrt(mean(x²) + eps) * scale)."""
    if record.kind == "layer":
        return keras.layers.LayerNormalization(epsilon=record.eps, name=name)
    return keras.layers.RMSNormalization(epsilon=record.eps, name=name)


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary positions on (B, S, heads, width), "rotate half" convention: pairs (i, i + d/2)."""
    half = x.shape[-1] // 2
    rotated = ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class SelfAttention(keras.layers.Layer):  # type: ignore[misc]
    """Q, K, V projections, (rotary positions), `keras.ops.dot_product_attention`, the output
    projection."""

    def __init__(self, record: zoo.Attention, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.dim = dim
        self.width = dim // record.heads
        kv = kv_width(record, dim)
        self.q = _dense(dim, record.bias, "query")
        self.k = _dense(kv, record.bias, "key")
        self.v = _dense(kv, record.bias, "value")
        self.out = _dense(dim, record.bias, "output")

    def build(self, input_shape: Any) -> None:
        for layer in (self.q, self.k, self.v):
            layer.build(input_shape)
        self.out.build((*input_shape[:-1], self.dim))

    def _heads(self, x: Any, heads: int) -> Any:
        return ops.reshape(x, (-1, x.shape[1], heads, self.width))

    def call(self, x: Any) -> Any:
        r = self.record
        q = self._heads(self.q(x), r.heads)
        k = self._heads(self.k(x), r.groups)
        v = self._heads(self.v(x), r.groups)
        if r.rotary:
            inverse = r.rope_theta ** (-ops.arange(0, self.width, 2, dtype="float32") / self.width)
            angles = ops.outer(ops.arange(x.shape[1], dtype="float32"), inverse)
            angles = ops.concatenate([angles, angles], axis=-1)[None, :, None, :]  # (1, S, 1, width)
            cos, sin = ops.cast(ops.cos(angles), q.dtype), ops.cast(ops.sin(angles), q.dtype)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if r.groups == 1 < r.heads:  # one K/V head: Keras repeats heads only from two on
            k, v = ops.repeat(k, r.heads, axis=2), ops.repeat(v, r.heads, axis=2)
        attended = ops.dot_product_attention(q, k, v, is_causal=r.causal)
        return self.out(ops.reshape(attended, (-1, x.shape[1], self.dim)))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


class FeedForward(keras.layers.Layer):  # type: ignore[misc]
    """D -> hidden -> D: GELU (tanh approximation) or SwiGLU (silu(gate(x)) * up(x))."""

    def __init__(self, record: zoo.FeedForward, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.dim = dim
        self.up = _dense(record.hidden, record.bias, "up")
        self.gate = _dense(record.hidden, record.bias, "gate") if record.kind == "swiglu" else None
        self.down = _dense(dim, record.bias, "down")

    def build(self, input_shape: Any) -> None:
        self.up.build(input_shape)
        if self.gate is not None:
            self.gate.build(input_shape)
        self.down.build((*input_shape[:-1], self.record.hidden))

    def call(self, x: Any) -> Any:
        hidden = ops.silu(self.gate(x)) * self.up(x) if self.gate is not None else gelu_tanh(self.up(x))
        return self.down(hidden)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


class TransformerBlock(keras.layers.Layer):  # type: ignore[misc]
    """Pre-norm: x + attention(norm1(x)), then x + mlp(norm2(x)); post-norm (BERT):
    norm1(x + attention(x)), then norm2(x + mlp(x)). Two norms, each with its own weights."""

    def __init__(self, record: zoo.Block, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pre_norm = record.pre_norm
        self.norm1 = norm(record.norm, "norm1")
        self.attention = SelfAttention(record.attention, dim, name="attention")
        self.norm2 = norm(record.norm, "norm2")
        self.mlp = FeedForward(record.mlp, dim, name="mlp")

    def build(self, input_shape: Any) -> None:
        for layer in (self.norm1, self.attention, self.norm2, self.mlp):
            layer.build(input_shape)

    def call(self, x: Any) -> Any:
        if self.pre_norm:
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


class Bias(keras.layers.Layer):  # type: ignore[misc]
    """The tied token head's own vocabulary biases (BERT)."""

    def build(self, input_shape: Any) -> None:
        self.bias = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="bias")

    def call(self, x: Any) -> Any:
        return x + ops.cast(self.bias, x.dtype)


class Pooling(keras.layers.Layer):  # type: ignore[misc]
    """(B, S, D) -> (B, D): the first token (ViT's class token) or the mean over tokens."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind

    def call(self, x: Any) -> Any:
        return x[:, 0] if self.kind == "first" else ops.mean(x, axis=1)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return (input_shape[0], input_shape[2])


Stack = list[tuple[keras.layers.Layer, dict[str, Any]]]  # layers applied in turn, with their call's keywords


def _layers(layer: zoo.Layer, dim: int, name: Namer, embedding: TokenEmbedding | None) -> Stack:
    """The Keras layers of one record whose input has `dim` features, in call order."""
    if isinstance(layer, zoo.Positions):
        return [(PositionEmbedding(layer.max_len, name=name("positions")), {})]
    if isinstance(layer, zoo.Patches):
        return [(PatchEmbedding(layer, name=name("patches")), {})]
    if isinstance(layer, zoo.Norm):
        return [(norm(layer, name("norm")), {})]
    if isinstance(layer, zoo.Block):
        return [(TransformerBlock(layer, dim, name=name("block")), {})]
    if isinstance(layer, zoo.TokenHead):
        head: Stack
        if layer.tied:
            if embedding is None:
                raise ValueError("a tied token head needs an Embedding before it")
            head = [(embedding, {"reverse": True})]
        else:
            head = [(_dense(layer.vocab, False, name("head")), {})]
        return [*head, (Bias(name=name("head_bias")), {})] if layer.bias else head
    if isinstance(layer, zoo.Pooling):
        return [(Pooling(layer.kind, name=name("pool")), {})]
    if isinstance(layer, zoo.Dense):
        return [(_dense(layer.out, layer.bias, name("dense")), {})]
    if isinstance(layer, zoo.Activation) and layer.kind == "gelu":
        return [(keras.layers.Activation(gelu_tanh, name=name("gelu")), {})]
    if isinstance(layer, zoo.Activation):
        return [(keras.layers.Activation(layer.kind, name=name(layer.kind)), {})]
    raise TypeError(f"no Keras layer for {layer!r} in a transformer")


def stacks(model: zoo.Model) -> Iterator[tuple[Stack, zoo.Shape, zoo.Shape]]:
    """Each record's Keras layers with the record's input and output shapes (the tree's: no
    batch axis; an image (C, H, W))."""
    name = Namer()
    embedding: TokenEmbedding | None = None
    shape = model.input
    for layer in model.layers:
        out = output_shape(layer, shape)
        if isinstance(layer, zoo.Embedding):
            embedding = TokenEmbedding(layer, name=name("embedding"))
            yield [(embedding, {})], shape, out
        else:
            yield _layers(layer, shape[-1], name, embedding), shape, out
        shape = out


def _keras_shape(shape: zoo.Shape) -> tuple[int | None, ...]:
    """A tree shape as Keras' input shape: a batch axis in front, an image channels-last."""
    return (None, *(nhwc(shape) if len(shape) == 3 else shape))


def is_transformer(model: zoo.Model) -> bool:
    """The model is built of transformer records (token ids or ViT patches in front)."""
    return isinstance(model.layers[0], (zoo.Embedding, zoo.Patches))


def build(model: zoo.Model) -> keras.Model:
    """The Keras functional model of a transformer of the zoo: token ids (B, S) in, logits
    (B, S, vocab) out; ViT: a channels-last image (B, H, W, C) in, class logits out."""
    dtype = "int64" if len(model.input) == 1 else None
    inputs = keras.Input(shape=_keras_shape(model.input)[1:], dtype=dtype, name="input")
    x = inputs
    for stack, _, _ in stacks(model):
        for layer, kwargs in stack:
            x = layer(x, **kwargs)
    return keras.Model(inputs, x, name=model.name)


def abstract_parameters(model: zoo.Model) -> int:
    """The trainable parameters `build` gives `model`, counted without allocating a weight:
    every layer built from the tree's shapes in a `keras.StatelessScope` that never
    initialises them (its variables are shapes, their values deferred), nothing called.
    The deferred variables stay registered with Keras until `keras.backend.clear_session()`."""
    built: dict[int, keras.layers.Layer] = {}
    with keras.StatelessScope(initialize_variables=False):
        for stack, shape, out in stacks(model):
            for i, (layer, _) in enumerate(stack):
                if not layer.built:
                    layer.build(_keras_shape(shape if i == 0 else out))
                built[id(layer)] = layer
        return sum(int(math.prod(v.shape)) for layer in built.values() for v in layer.trainable_weights)
