"""The zoo's transformers: published parameter counts, the PyTorch builder against the
description, the FLOPs hpcbench counts against PyTorch's own counter, the token data and
the planning's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import model_for
from hpcbench.frameworks.torch import layers as torch_layers
from hpcbench.spec import Point
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo
from hpcbench.workloads.flops import model_flops

# The published models' parameter counts (Hugging Face's GPT2LMHeadModel gpt2 and
# gpt2-medium, LlamaForCausalLM Llama-3.2-1B, BertForMaskedLM bert-base-uncased; timm's
# vit_base_patch16_224).
PUBLISHED = {
    "gpt2_124m": 124_439_808,
    "gpt2_350m": 354_823_168,
    "llama_1b": 1_235_814_400,
    "bert_base": 109_514_298,
    "vit_b16": 86_567_656,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_the_published_ones(name: str) -> None:
    assert zoo.count_parameters(zoo.model(name)) == PUBLISHED[name]


def _counted(model: zoo.Model) -> tuple[int, float, tuple[int, ...]]:
    """(parameters, training FLOPs per sample by FlopCounterMode, output shape) of the PyTorch
    build, on the meta device: no memory, full-size models included. (On the meta device
    scaled-dot-product attention runs its reference products, which the counter sees; its
    fused CPU kernel is not among the counter's operators.)"""
    with torch.device("meta"):
        net = torch_layers.build(model)
    batch = 2
    if model.tokens:
        x = torch.zeros((batch, *model.input), dtype=torch.int64, device="meta")
    else:
        x = torch.zeros((batch, *model.input), device="meta")
    with FlopCounterMode(display=False) as counter:
        out = net(x)
        out.float().sum().backward()
    return sum(p.numel() for p in net.parameters()), counter.get_total_flops() / batch, tuple(out.shape[1:])


@pytest.mark.parametrize("name", zoo.NAMES)
def test_torch_build_and_flops_agree_with_the_description(name: str) -> None:
    """Every model of the zoo: PyTorch builds the described parameters and output, and the
    FLOPs hpcbench counts for a training step equal PyTorch's count (within 3 %; they are
    exact today)."""
    model = zoo.model(name)
    parameters, flops, shape = _counted(model)
    assert parameters == zoo.count_parameters(model)
    assert shape == zoo.shapes(model)
    counted = model_flops(model).training
    assert counted == pytest.approx(flops, rel=0.03), (name, counted, flops)


def test_flops_follow_the_published_rule_of_thumb() -> None:
    """GPT-2 124M at 1024 tokens: 6 FLOPs per parameter and token for the dense products
    (the tied head counts, the position table does not) plus attention's 12·L·S·D per token,
    as PaLM's appendix counts them."""
    model = zoo.model("gpt2_124m")
    norms, biases = 2 * 2 * 768, 4 * 768 + 3072 + 768  # per layer: two LayerNorms; Q, K, V, out and MLP biases
    dense = zoo.count_parameters(model) - 1024 * 768 - 12 * (norms + biases) - 2 * 768
    tokens, layers, width = 1024, 12, 768
    expected = tokens * (6 * dense + 12 * layers * tokens * width)
    flops = model_flops(model)
    assert flops.training == pytest.approx(expected, rel=1e-9)
    assert flops.attention == 12 * layers * tokens * tokens * width


def test_seq_len_reshapes_a_sequence_model_and_is_refused_elsewhere() -> None:
    point = Point(model="gpt_tiny", seq_len=32)
    assert model_for(point).input == (32,)
    assert model_for(Point(model="gpt_tiny", dataset="text")).classes == data.BYTE_VOCAB
    with pytest.raises(HpcbenchError, match="200 tokens is more than the 128 positions"):
        model_for(Point(model="gpt_tiny", seq_len=200))
    assert model_for(Point(model="llama_tiny", seq_len=4096)).input == (4096,)  # rotary: no table


def test_lm_tokens_predict_the_next_and_masked_lm_hides_some() -> None:
    text = data.read_text(None)
    assert len(text) > 400_000 and b"statement" in text  # Python's documentation topics
    shard = data.load("text", None, (32,), 256, 8, 0, 2, 0, "lm")
    assert shard.train.x.shape[1:] == (32,) and shard.train.y.shape == shard.train.x.shape
    assert (shard.train.x[:, 1:] == shard.train.y[:, :-1]).all()
    other = data.load("text", None, (32,), 256, 8, 1, 2, 0, "lm")
    windows = data.token_windows(text[: int(len(text) * (1 - data.HELD_OUT))], 33)
    assert len(shard.train) + len(other.train) == len(windows)  # the ranks split the windows
    assert bytes(shard.train.x[0].astype(np.uint8)) in text
    mlm = data.load("synthetic", None, (64,), 512, 8, 0, 1, 0, "mlm")
    masked = mlm.train.x == 511
    assert 0.1 < masked.mean() < 0.2
    assert (mlm.train.y[~masked] == data.IGNORED).all() and (mlm.train.y[masked] < 511).all()
    batches = data.Batches(mlm.train, 8, 0, 0)
    x, y = batches.next()
    assert x.shape == y.shape == (8, 64)


def test_synthetic_tokens_are_learnable() -> None:
    """Three tokens in four follow their fixed successor: a model that learns it predicts
    far better than chance."""
    shard = data.load("synthetic", None, (64,), 512, 8, 0, 1, 0, "lm")
    successor: dict[int, list[int]] = {}
    for a, b in zip(shard.train.x.ravel(), shard.train.y.ravel(), strict=True):
        successor.setdefault(int(a), []).append(int(b))
    hits = sum(max(set(v), key=v.count) == b for a, b in zip(shard.test.x.ravel(), shard.test.y.ravel(), strict=True)
               for v in [successor.get(int(a), [-1])])  # fmt: skip
    assert hits / shard.test.x.size > 0.6


@pytest.mark.parametrize(
    ("fields", "field", "match"),
    [
        ({"model": "lenet", "dataset": "text"}, "dataset", "'text' holds tokens; model 'lenet' reads images"),
        ({"model": "gpt_tiny", "dataset": "mnist", "data_dir": "/x"}, "dataset", "holds images"),
        ({"model": "lenet", "seq_len": 64}, "seq_len", "reads images, not token sequences"),
        ({"model": "gpt_tiny", "seq_len": 4096}, "seq_len", "more than the 128 positions"),
        ({"model": "gpt_tiny", "precision": "tf32"}, "precision", "tf32 is a CUDA matmul mode"),
        (
            {"model": "gpt_tiny", "framework": "theano", "backend": "mpi"},
            "model",
            "neither has a fused attention kernel",
        ),
        (
            {"model": "gpt_tiny", "framework": "jax", "backend": "pmean", "optimizer": "adamw"},
            "optimizer",
            "no 'adamw'",
        ),
        ({"model": "gpt_tiny", "compile": "fastest"}, "compile", "'fastest' is not a compile mode of torch"),
    ],
)
def test_planning_refuses_what_does_not_fit(fields: dict[str, object], field: str, match: str) -> None:
    from hpcbench.frameworks import FRAMEWORKS

    point = Point(**fields)  # type: ignore[arg-type]
    problems = [(f, what) for f, what, _ in FRAMEWORKS.get(point.framework).check_point(point)]
    assert any(f == field and match in what for f, what in problems), problems
