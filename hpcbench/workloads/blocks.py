"""The transformer's layer records: embeddings, norms, attention, feed-forward, the block.

Like the image records (`layers.py`) a record says what a layer is, never how a framework
builds it. Sequence shapes are (S,) for token ids and (S, D) for hidden states; `Patches`
turns an image (C, H, W) into (N + 1, D) tokens. Every builder must produce, record for
record, the parameters `shapes.layer_parameters` counts and the arithmetic
`flops.layer_matmul_flops` counts (docs/models.md, "Transformers").
"""

from __future__ import annotations

from dataclasses import dataclass

NORMS = ("layer", "rms")
FEED_FORWARDS = ("gelu", "swiglu")
POOLINGS = ("first", "mean")


@dataclass(frozen=True)
class Embedding:
    """Token ids (S,) -> (S, dim): a vocab x dim table; `types` > 0 adds BERT's token-type
    table (every token of type 0, as in single-segment pre-training)."""

    vocab: int
    dim: int
    types: int = 0


@dataclass(frozen=True)
class Positions:
    """Learned absolute positions added to (S, D): a max_len x D table (S <= max_len)."""

    max_len: int


@dataclass(frozen=True)
class Patches:
    """ViT's stem: an image (C, H, W) cut into patch x patch squares, each projected to `dim`
    (a convolution of kernel = stride = patch, with bias), a learned class token in front and
    learned positions added: (N + 1, dim) with N = (H / patch) * (W / patch)."""

    patch: int
    dim: int


@dataclass(frozen=True)
class Norm:
    """LayerNorm (scale and shift) or RMSNorm (scale only) over the last dimension."""

    kind: str  # "layer" | "rms"
    eps: float = 1e-5


@dataclass(frozen=True)
class Attention:
    """Multi-head self-attention: Q, K, V projections, scaled dot-product attention (causal:
    each token sees itself and earlier ones), an output projection. `kv_heads` < `heads`:
    grouped-query attention (K and V have kv_heads heads, each shared by heads / kv_heads
    query heads); `rotary`: rotary position embeddings on Q and K (base `rope_theta`)."""

    heads: int
    causal: bool
    kv_heads: int = 0  # 0: as many as `heads`
    rotary: bool = False
    bias: bool = True
    rope_theta: float = 10000.0

    @property
    def groups(self) -> int:
        return self.kv_heads or self.heads


@dataclass(frozen=True)
class FeedForward:
    """The MLP: D -> hidden -> D with GELU (tanh approximation, as GPT-2, BERT and ViT), or
    SwiGLU (silu(x W1) * (x W3), then W2; no biases, as Llama)."""

    hidden: int
    kind: str  # "gelu" | "swiglu"
    bias: bool = True


@dataclass(frozen=True)
class Block:
    """One transformer layer. Pre-norm (GPT-2, Llama, ViT): x + attention(norm(x)), then
    x + mlp(norm(x)). Post-norm (BERT): norm(x + attention(x)), then norm(x + mlp(x))."""

    attention: Attention
    mlp: FeedForward
    norm: Norm
    pre_norm: bool = True


@dataclass(frozen=True)
class TokenHead:
    """(S, D) -> (S, vocab) logits: the embedding's table transposed (`tied`: no weights of
    its own; its gradient lands on the embedding) or a matrix of its own; `bias` (BERT) adds
    vocab biases."""

    vocab: int
    tied: bool
    bias: bool = False


@dataclass(frozen=True)
class Pooling:
    """(S, D) -> (D,): the first token (ViT's class token) or the mean over tokens."""

    kind: str = "first"  # "first" | "mean"


RECORDS = (Embedding, Positions, Patches, Norm, Attention, FeedForward, Block, TokenHead, Pooling)
