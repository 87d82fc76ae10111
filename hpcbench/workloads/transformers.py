"""The zoo's transformers, built from the records of `blocks.py`, at their published shapes
and as tiny variants of the same design for CPU tests.

=============  ==========  ======  =====  ======  =====  ==========================================
name           input       vocab/  layers width   heads  what
                           classes
=============  ==========  ======  =====  ======  =====  ==========================================
gpt2_124m      1024        50257   12     768     12     GPT-2 small: learned positions, pre-norm,
                                                         GELU, tied head (124,439,808 parameters)
gpt2_350m      1024        50257   24     1024    16     GPT-2 medium (354,823,168)
llama_1b       2048        128256  16     2048    32/8   Llama 3.2 1B: RMSNorm, SwiGLU 8192, RoPE
                                                         (theta 500000), GQA 8 KV heads, tied head
                                                         (1,235,814,400)
bert_base      512         30522   12     768     12     BERT-base, masked-LM pre-training: post-norm,
                                                         token types, MLM head (109,514,298)
vit_b16        3x224x224   1000    12     768     12     ViT-B/16 (86,567,656)
gpt_tiny       64          512     2      64      4      GPT-2's design, tiny (positions 128)
llama_tiny     64          512     2      64      4/2    Llama's design, tiny (SwiGLU 176)
bert_tiny      64          512     2      64      4      BERT's design, tiny (positions 128)
vit_tiny       3x32x32     10      2      64      4      ViT's design on 8x8 patches
=============  ==========  ======  =====  ======  =====  ==========================================

The input of a sequence model is its default sequence length (the point's `seq_len`
replaces it, up to the positions a model with learned positions has); its "classes" are its
vocabulary (a dataset of its own, e.g. byte-level text, brings its own). The parameter
counts in parentheses are the published models' (Hugging Face's GPT2LMHeadModel,
LlamaForCausalLM, BertForMaskedLM; timm's vit_base_patch16_224): `tests/workloads` checks
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpcbench.workloads import blocks as b
from hpcbench.workloads.layers import Activation, Dense, Layer, Shape


@dataclass(frozen=True)
class Size:
    """A transformer's size."""

    layers: int
    dim: int
    heads: int
    hidden: int  # the MLP's width
    kv_heads: int = 0
    positions: int = 0  # learned positions (0: rotary)


def _gpt(s: Size) -> Callable[[int], tuple[Layer, ...]]:
    def layers(vocab: int) -> tuple[Layer, ...]:
        block = b.Block(b.Attention(s.heads, causal=True), b.FeedForward(s.hidden, "gelu"), b.Norm("layer"))
        return (
            b.Embedding(vocab, s.dim),
            b.Positions(s.positions),
            *(block,) * s.layers,
            b.Norm("layer"),
            b.TokenHead(vocab, tied=True),
        )

    return layers


def _llama(s: Size, theta: float) -> Callable[[int], tuple[Layer, ...]]:
    def layers(vocab: int) -> tuple[Layer, ...]:
        attention = b.Attention(s.heads, causal=True, kv_heads=s.kv_heads, rotary=True, bias=False, rope_theta=theta)
        block = b.Block(attention, b.FeedForward(s.hidden, "swiglu", bias=False), b.Norm("rms"))
        return (b.Embedding(vocab, s.dim), *(block,) * s.layers, b.Norm("rms"), b.TokenHead(vocab, tied=True))

    return layers


def _bert(s: Size) -> Callable[[int], tuple[Layer, ...]]:
    def layers(vocab: int) -> tuple[Layer, ...]:
        norm = b.Norm("layer", 1e-12)
        block = b.Block(b.Attention(s.heads, causal=False), b.FeedForward(s.hidden, "gelu"), norm, pre_norm=False)
        return (
            b.Embedding(vocab, s.dim, types=2),
            b.Positions(s.positions),
            norm,
            *(block,) * s.layers,
            Dense(s.dim),  # the masked-LM head's transform
            Activation("gelu"),
            norm,
            b.TokenHead(vocab, tied=True, bias=True),
        )

    return layers


def _vit(s: Size, patch: int) -> Callable[[int], tuple[Layer, ...]]:
    def layers(classes: int) -> tuple[Layer, ...]:
        norm = b.Norm("layer", 1e-6)
        block = b.Block(b.Attention(s.heads, causal=False), b.FeedForward(s.hidden, "gelu"), norm)
        return (b.Patches(patch, s.dim), *(block,) * s.layers, norm, b.Pooling("first"), Dense(classes))

    return layers


TRANSFORMERS: dict[str, tuple[Shape, int, Callable[[int], tuple[Layer, ...]]]] = {
    "gpt2_124m": ((1024,), 50257, _gpt(Size(12, 768, 12, 3072, positions=1024))),
    "gpt2_350m": ((1024,), 50257, _gpt(Size(24, 1024, 16, 4096, positions=1024))),
    "llama_1b": ((2048,), 128256, _llama(Size(16, 2048, 32, 8192, kv_heads=8), 500000.0)),
    "bert_base": ((512,), 30522, _bert(Size(12, 768, 12, 3072, positions=512))),
    "vit_b16": ((3, 224, 224), 1000, _vit(Size(12, 768, 12, 3072), 16)),
    "gpt_tiny": ((64,), 512, _gpt(Size(2, 64, 4, 256, positions=128))),
    "llama_tiny": ((64,), 512, _llama(Size(2, 64, 4, 176, kv_heads=2), 10000.0)),
    "bert_tiny": ((64,), 512, _bert(Size(2, 64, 4, 256, positions=128))),
    "vit_tiny": ((3, 32, 32), 10, _vit(Size(2, 64, 4, 256), 8)),
}

# What each is trained to do (`Model.objective`); ViT classifies, as the image models.
OBJECTIVES: dict[str, str] = {
    "gpt2_124m": "lm",
    "gpt2_350m": "lm",
    "llama_1b": "lm",
    "gpt_tiny": "lm",
    "llama_tiny": "lm",
    "bert_base": "mlm",
    "bert_tiny": "mlm",
}
