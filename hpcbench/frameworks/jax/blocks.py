"""The zoo's transformers (`workloads/blocks.py` records) as pure JAX functions of their weights.

`Network(model, precision)` gives a transformer's weights (`tensors`: name, shape and how
each starts; `initial`: numpy arrays from the point's seed), its training loss and its test
pass. Layouts: hidden states (B, S, D), matrices (in, out) applied as `x @ W`, the ViT stem's
kernel OIHW (as `layers.py`'s Conv), images NCHW.

- Attention: one fused Q/K/V matrix (D, D + 2 * kv), split into Q (B, S, H, d) and K, V
  (B, S, kv_heads, d), then `jax.nn.dot_product_attention` (JAX's fused scaled dot-product
  attention, `is_causal` for the decoders; K and V with fewer heads is its grouped-query
  attention: query head n reads K/V head n // (H / kv_heads)), then the output projection.
  RoPE in the "rotate half" convention (pairs (i, i + d/2), frequencies theta^(-2i/d)).
- FeedForward: GELU (tanh approximation) between two matrices, or SwiGLU with its gate and
  up matrices fused into one (D, 2 * hidden): silu(x W1) * (x W3), then W2.
- Block: pre-norm x + attn(norm1(x)), x + mlp(norm2(x)); post-norm (BERT) norm1(x +
  attn(x)), norm2(x + mlp(x)): the record's one Norm is two layers with their own weights.
- TokenHead: tied, the embedding's table transposed (its gradient lands on the table).

Weights start as normal(0, 0.02) for matrices, tables, the class token and positions,
zeros for biases and shifts, ones for norm scales; the same seed gives the same weights
(and the adapter broadcasts rank 0's anyway). Weights come in the order the layers are
built (`shapes.leaves`: a pre-norm block's norm, attention, norm, MLP).

Precision "bf16" is mixed precision in JAX's usual way (Flax's `dtype` / `param_dtype`):
the fp32 master weights are cast to bfloat16 inside the differentiated function, so
activations and matmuls are bfloat16 while the gradients, which flow back through the
casts, arrive in float32 (exchanged and applied to the fp32 weights). Norm statistics, the
attention softmax (`dot_product_attention` computes it in float32) and the loss stay fp32.

Losses: "lm" the mean token cross-entropy over every position; "mlm" the mean over the
masked positions only (targets `datasets.IGNORED` elsewhere); "classify" (ViT) the mean
softmax cross-entropy. `evaluate` returns (the loss summed over the batch's first `valid`
samples, each sample's loss its mean token loss; those correctly classified, 0 for a token
model): the adapter pads a short last test batch, so one compiled program serves all.

Only the adapter imports this module, lazily (in `build`), and the tests: it needs jax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo
from hpcbench.workloads.shapes import kv_width, output_shape

Array = Any  # jax.Array; the functions are traced, not type-checked against jax's stubs

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
INIT_STD = 0.02


@dataclass(frozen=True)
class Tensor:
    """One learnt tensor: its name, shape and start ("normal", "zeros" or "ones")."""

    name: str
    shape: tuple[int, ...]
    init: str


@dataclass(frozen=True)
class Layer:
    """One built layer: its record, its input shape (without the batch), the index of its
    first tensor in the weight list, and for a tied head the index of the embedding's table."""

    record: zoo.Layer
    shape: zoo.Shape
    first: int
    tied: int = -1


@dataclass(frozen=True)
class BlockLayers:
    """A Block's four built parts (norm1, attention, norm2, mlp) and its kind."""

    parts: tuple[Layer, Layer, Layer, Layer]
    pre_norm: bool


Spec = tuple[str, tuple[int, ...], str]  # (suffix, shape, start)


def _matrix(name: str, rows: int, cols: int, bias: bool) -> list[Spec]:
    """A (rows, cols) matrix and, with `bias`, its (cols,) bias."""
    out: list[Spec] = [(name, (rows, cols), "normal")]
    return [*out, (f"{name}_bias", (cols,), "zeros")] if bias else out


def _table_tensors(record: zoo.Layer, shape: zoo.Shape) -> list[Spec]:
    """The tensors of an Embedding, Positions, Patches or Norm (none for another layer)."""
    out: list[Spec] = []
    if isinstance(record, zoo.Embedding):
        out.append(("table", (record.vocab, record.dim), "normal"))
        if record.types:
            out.append(("types", (record.types, record.dim), "normal"))
    elif isinstance(record, zoo.Positions):
        out.append(("table", (record.max_len, shape[-1]), "normal"))
    elif isinstance(record, zoo.Patches):
        channels, tokens = shape[0], output_shape(record, shape)[0]
        out.append(("kernel", (record.dim, channels, record.patch, record.patch), "normal"))
        out += [("bias", (record.dim,), "zeros"), ("cls", (record.dim,), "normal")]
        out.append(("positions", (tokens, record.dim), "normal"))
    elif isinstance(record, zoo.Norm):
        out.append(("scale", (shape[-1],), "ones"))
        if record.kind == "layer":
            out.append(("shift", (shape[-1],), "zeros"))
    return out


def _tensors(record: zoo.Layer, shape: zoo.Shape) -> list[Spec]:
    """(suffix, shape, start) of the tensors of one layer with input `shape`."""
    dim = shape[-1]
    if isinstance(record, (zoo.Embedding, zoo.Positions, zoo.Patches, zoo.Norm)):
        return _table_tensors(record, shape)
    if isinstance(record, zoo.Attention):
        qkv = dim + 2 * kv_width(record, dim)
        return _matrix("qkv", dim, qkv, record.bias) + _matrix("out", dim, dim, record.bias)
    if isinstance(record, zoo.FeedForward):
        up = 2 * record.hidden if record.kind == "swiglu" else record.hidden
        return _matrix("up", dim, up, record.bias) + _matrix("down", record.hidden, dim, record.bias)
    if isinstance(record, zoo.Dense):
        return _matrix("weight", dim, record.out, record.bias)
    if isinstance(record, zoo.TokenHead):
        out: list[Spec] = [] if record.tied else [("weight", (dim, record.vocab), "normal")]
        return out + ([("bias", (record.vocab,), "zeros")] if record.bias else [])
    if isinstance(record, (zoo.Activation, zoo.Pooling)):
        return []
    raise TypeError(f"no JAX transformer layer for {record!r}")


def _plan(model: zoo.Model) -> tuple[list[Layer | BlockLayers], list[Tensor]]:
    """The model's layers (a Block's parts built in `shapes.leaves`'s order) and every
    tensor, in build order."""
    plan: list[Layer | BlockLayers] = []
    tensors: list[Tensor] = []
    embedding = -1

    def add(record: zoo.Layer, shape: zoo.Shape, name: str) -> Layer:
        nonlocal embedding
        first = len(tensors)
        if isinstance(record, zoo.Embedding):
            embedding = first
        tied = isinstance(record, zoo.TokenHead) and record.tied
        if tied and embedding < 0:
            raise TypeError("a tied TokenHead needs an Embedding before it")
        tensors.extend(Tensor(f"{name}.{suffix}", s, init) for suffix, s, init in _tensors(record, shape))
        return Layer(record, shape, first, embedding if tied else -1)

    shape = model.input
    for i, record in enumerate(model.layers):
        if isinstance(record, zoo.Block):
            parts = (record.norm, record.attention, record.norm, record.mlp)
            order = (0, 1, 2, 3) if record.pre_norm else (1, 0, 3, 2)
            names = ("norm1", "attn", "norm2", "mlp")
            built = {j: add(parts[j], shape, f"{i}.block.{names[j]}") for j in order}
            plan.append(BlockLayers((built[0], built[1], built[2], built[3]), record.pre_norm))
        else:
            plan.append(add(record, shape, f"{i}.{type(record).__name__.lower()}"))
        shape = output_shape(record, shape)
    return plan, tensors


def _rotary(x: Array, theta: float) -> Array:
    """RoPE on (B, S, heads, d), "rotate half": the pairs (i, i + d/2) turned by position x
    theta^(-2i/d), computed in float32."""
    seq, d = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]  # (S, d/2)
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[None, :, None, :]
    x32 = x.astype(jnp.float32)
    half = d // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def _norm(record: zoo.Norm, w: Sequence[Array], first: int, x: Array) -> Array:
    """LayerNorm or RMSNorm over the last axis; statistics in float32, out in x's dtype."""
    x32 = x.astype(jnp.float32)
    if record.kind == "rms":
        y = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + record.eps)
        return (y * w[first].astype(jnp.float32)).astype(x.dtype)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * lax.rsqrt(var + record.eps)
    return (y * w[first].astype(jnp.float32) + w[first + 1].astype(jnp.float32)).astype(x.dtype)


def _attention(record: zoo.Attention, w: Sequence[Array], first: int, x: Array) -> Array:
    batch, seq, dim = x.shape
    head = dim // record.heads
    kv = record.groups * head
    qkv = x @ w[first]
    i = first + 1
    if record.bias:
        qkv, i = qkv + w[i], i + 1
    q = qkv[..., :dim].reshape(batch, seq, record.heads, head)
    k = qkv[..., dim : dim + kv].reshape(batch, seq, record.groups, head)
    v = qkv[..., dim + kv :].reshape(batch, seq, record.groups, head)
    if record.rotary:
        q, k = _rotary(q, record.rope_theta), _rotary(k, record.rope_theta)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=record.causal).reshape(batch, seq, dim)
    out = out @ w[i]
    return out + w[i + 1] if record.bias else out


def _feed_forward(record: zoo.FeedForward, w: Sequence[Array], first: int, x: Array) -> Array:
    h = x @ w[first]
    i = first + 1
    if record.bias:
        h, i = h + w[i], i + 1
    if record.kind == "swiglu":
        gate, up = jnp.split(h, 2, axis=-1)
        h = jax.nn.silu(gate) * up
    else:
        h = jax.nn.gelu(h, approximate=True)
    out = h @ w[i]
    return out + w[i + 1] if record.bias else out


def _patches(record: zoo.Patches, w: Sequence[Array], first: int, x: Array) -> Array:
    p = record.patch
    out = lax.conv_general_dilated(x, w[first], (p, p), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    out = out + w[first + 1][None, :, None, None]
    batch = out.shape[0]
    tokens = out.reshape(batch, record.dim, -1).transpose(0, 2, 1)  # (B, N, D), row-major patches
    cls = jnp.broadcast_to(w[first + 2], (batch, 1, record.dim))
    return jnp.concatenate([cls, tokens], axis=1) + w[first + 3]


def _layer(layer: Layer, w: Sequence[Array], x: Array) -> Array:
    record, first = layer.record, layer.first
    if isinstance(record, zoo.Embedding):
        h = jnp.take(w[first], x, axis=0)
        return h + w[first + 1][0] if record.types else h  # every token of type 0
    if isinstance(record, zoo.Positions):
        return x + w[first][: x.shape[1]]
    if isinstance(record, zoo.Patches):
        return _patches(record, w, first, x)
    if isinstance(record, zoo.Norm):
        return _norm(record, w, first, x)
    if isinstance(record, zoo.Attention):
        return _attention(record, w, first, x)
    if isinstance(record, zoo.FeedForward):
        return _feed_forward(record, w, first, x)
    if isinstance(record, zoo.Dense):
        out = x @ w[first]
        return out + w[first + 1] if record.bias else out
    if isinstance(record, zoo.Activation):
        if record.kind == "gelu":
            return jax.nn.gelu(x, approximate=True)
        return jax.nn.relu(x) if record.kind == "relu" else jax.nn.sigmoid(x)
    if isinstance(record, zoo.TokenHead):
        out = x @ w[layer.tied].T if record.tied else x @ w[first]
        return out + w[first + (0 if record.tied else 1)] if record.bias else out
    if isinstance(record, zoo.Pooling):
        return x[:, 0] if record.kind == "first" else jnp.mean(x, axis=1)
    raise TypeError(f"no JAX transformer layer for {record!r}")


def _block(block: BlockLayers, w: Sequence[Array], x: Array) -> Array:
    norm1, attention, norm2, mlp = block.parts
    if block.pre_norm:
        x = x + _layer(attention, w, _layer(norm1, w, x))
        return x + _layer(mlp, w, _layer(norm2, w, x))
    x = _layer(norm1, w, x + _layer(attention, w, x))
    return _layer(norm2, w, x + _layer(mlp, w, x))


class Network:
    """A zoo transformer in JAX at a precision ("fp32" or "bf16", mixed)."""

    def __init__(self, model: zoo.Model, precision: str = "fp32") -> None:
        if precision not in DTYPES:
            raise ValueError(f"jax trains transformers in {', '.join(DTYPES)}, not {precision}")
        self.model = model
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.plan, self.tensors = _plan(model)

    def parameters(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors)

    def initial(self, seed: int) -> list[tuple[str, np.ndarray]]:
        """(name, float32 array) of every weight, the same for a seed."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.tensors:
            if t.init == "normal":
                value = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(INIT_STD)
            else:
                value = np.full(t.shape, 1.0 if t.init == "ones" else 0.0, dtype=np.float32)
            out.append((t.name, value))
        return out

    def abstract(self) -> list[jax.ShapeDtypeStruct]:
        """The weights' shapes as float32 `ShapeDtypeStruct`s (for `jax.eval_shape`)."""
        return [jax.ShapeDtypeStruct(t.shape, jnp.float32) for t in self.tensors]

    def apply(self, weights: Sequence[Array], x: Array) -> Array:
        """The model's output on a batch: token logits (B, S, vocab) or class logits (B, classes),
        in float32; computed in the network's precision (its fp32 weights cast inside)."""
        w = [a.astype(self.dtype) for a in weights]
        h = x.astype(self.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        for item in self.plan:
            h = _block(item, w, h) if isinstance(item, BlockLayers) else _layer(item, w, h)
        return h.astype(jnp.float32)

    def _token_losses(self, logits: Array, y: Array) -> tuple[Array, Array]:
        """(per-token cross-entropy (B, S), mask of the positions counted (B, S))."""
        counted = y != data.IGNORED if self.model.task == "mlm" else jnp.ones(y.shape, bool)
        target = jnp.where(counted, y, 0)
        picked = jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - picked
        return jnp.where(counted, nll, 0.0), counted

    def loss(self, weights: Sequence[Array], x: Array, y: Array) -> Array:
        """The batch's mean training loss (float32)."""
        return self.criterion(self.apply(weights, x), y)

    def evaluate(self, weights: Sequence[Array], x: Array, y: Array, valid: Array = None) -> tuple[Array, Array]:
        """`test_sums` of the batch's output."""
        return self.test_sums(self.apply(weights, x), y, valid)

    def criterion(self, out: Array, y: Array) -> Array:
        """The mean loss of the output `out` (`apply`'s) against the targets `y`."""
        if self.model.task == "classify":
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(out, axis=-1), y[:, None], axis=-1))
        nll, counted = self._token_losses(out, y)
        return jnp.sum(nll) / jnp.maximum(jnp.sum(counted), 1)

    def test_sums(self, out: Array, y: Array, valid: Array = None) -> tuple[Array, Array]:
        """(loss summed over the batch's first `valid` samples (None: all), each sample's its
        mean token loss; those correctly classified, 0 for a token model)."""
        counted = jnp.arange(out.shape[0]) < (out.shape[0] if valid is None else valid)
        if self.model.task == "classify":
            logp = jax.nn.log_softmax(out, axis=-1)
            losses = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
            return jnp.sum(jnp.where(counted, losses, 0.0)), jnp.sum((jnp.argmax(out, axis=-1) == y) & counted)
        nll, tokens = self._token_losses(out, y)
        per_sample = jnp.sum(nll, axis=1) / jnp.maximum(jnp.sum(tokens, axis=1), 1)
        return jnp.sum(jnp.where(counted, per_sample, 0.0)), jnp.zeros((), jnp.int32)
