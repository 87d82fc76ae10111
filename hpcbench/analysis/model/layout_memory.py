"""The transformer a layout trains, as the layout model sees it (its parameters split by what
tensor parallelism divides, its FLOPs, its blocks), the job (batch, numerics), and the memory
each device holds on a layout (docs/metrics-and-model.md, "Layouts"). The time and the
enumeration are layouts.py's.

Pure computation: no trace, no framework.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from hpcbench.errors import HpcbenchError
from hpcbench.spec.parallel import Layout
from hpcbench.workloads import blocks as b
from hpcbench.workloads import zoo
from hpcbench.workloads.flops import layer_matmul_flops, model_flops
from hpcbench.workloads.shapes import layer_parameters, output_shape

GIB = float(1 << 30)
OPTIMIZER_BYTES = {"adamw": 8, "adam": 8, "momentum": 4, "sgd": 0}  # state per parameter (fp32)
MIXED = ("bf16", "fp16")  # autocast: matrix products and activations in 2 bytes, fp32 master weights
WEIGHT_BYTES = 4  # fp32 master weights
COPY_BYTES = 2  # autocast's low-precision copy of the weights, under mixed precision
GRAD_BYTES = 4  # fp32 gradients (autocast keeps parameters and their gradients fp32)
PARAM_COMM_BYTES = 4  # parameters gathered and gradients reduced in fp32
STAGE_BYTES = 4  # the residual stream sent between stages (fp32 under autocast)
LOGIT_BYTES = 4  # the logits, fp32 for the loss
FORWARD_SHARE = 1 / 3  # forward : backward = 1 : 2 (model FLOPs)
GATHERED_UNITS = 2  # a zero-3 shard holds the unit it computes and the one it prefetches
MICROBATCHES_PER_STAGE = 4  # default micro-batches: the largest divisor of the batch <= 4 · pp
SCHEDULES = ("1f1b", "gpipe")
COLUMNS = ["nodes", "ranks", "layout", "dp", "fsdp", "zero", "tp", "pp", "microbatches", "schedule", "fits",
           "t_iter_s", "tokens_per_s", "samples_per_s", "memory_gib", "compute_s", "bubble_s", "bubble",
           "tp_comm_s", "pp_comm_s", "shard_comm_s", "shard_exposed_s", "weights_gib", "gradients_gib",
           "optimizer_gib", "gathered_gib", "activations_gib"]  # fmt: skip


class LayoutError(HpcbenchError):
    """A layout or model the layout model cannot take (names what and why)."""


# ------------------------------------------------------------------------------------------
# The model's shape


@dataclass(frozen=True)
class Transformer:
    """What the layout model needs of a zoo transformer at sequence length `tokens`."""

    name: str
    blocks: int  # L
    dim: int  # D
    heads: int  # a
    kv_heads: int
    hidden: int  # the MLP's width
    vocab: int  # the token head's vocabulary (0: no token head, e.g. ViT)
    tokens: int  # S, tokens per sample
    block_split: int  # parameters of one block that tp divides (the matrices, column-parallel biases)
    block_whole: int  # parameters of one block tp keeps whole (norms, row-parallel biases)
    other: int  # parameters outside the blocks (embeddings, positions, final norm, head)
    block_flops: float  # one block's training FLOPs per sample
    flops_per_sample: float  # the model's training FLOPs per sample (workloads.flops)

    @property
    def block_parameters(self) -> int:
        return self.block_split + self.block_whole

    @property
    def parameters(self) -> int:
        return self.blocks * self.block_parameters + self.other

    @property
    def other_flops(self) -> float:
        """Training FLOPs per sample outside the blocks (the head's product, a patch projection)."""
        return self.flops_per_sample - self.blocks * self.block_flops


def _block_parts(block: b.Block, shape: zoo.Shape) -> tuple[int, int, float]:
    """(parameters tp splits, parameters tp keeps whole, training FLOPs per sample) of a block."""
    dim = shape[-1]
    attention = layer_parameters(block.attention, shape)
    mlp = layer_parameters(block.mlp, shape)
    norms = 2 * layer_parameters(block.norm, shape)
    row_biases = (dim if block.attention.bias else 0) + (dim if block.mlp.bias else 0)  # added after the reduce
    forward = layer_matmul_flops(block.attention, shape)[0] + layer_matmul_flops(block.mlp, shape)[0]
    return attention + mlp - row_biases, norms + row_biases, 3 * forward


@functools.lru_cache(maxsize=64)
def transformer(name: str, seq_len: int | None = None) -> Transformer:
    """The zoo model `name` at `seq_len` tokens (None: its own); LayoutError for a model
    without transformer blocks or blocks of different shapes."""
    if name not in zoo.NAMES:
        raise LayoutError(f"model {name!r} is not known (known: {', '.join(zoo.NAMES)})")
    is_sequence = name in zoo.TRANSFORMER_NAMES and name not in ("vit_b16", "vit_tiny")
    m = zoo.model(name, (seq_len,) if seq_len and is_sequence else None)
    shape = m.input
    found: list[tuple[b.Block, zoo.Shape]] = []
    vocab = 0
    for layer in m.layers:
        if isinstance(layer, b.Block):
            found.append((layer, shape))
        if isinstance(layer, b.TokenHead):
            vocab = layer.vocab
        shape = output_shape(layer, shape)
    if not found:
        raise LayoutError(f"model {name!r} has no transformer blocks to split (transformers: "
                          f"{', '.join(zoo.TRANSFORMER_NAMES)})")  # fmt: skip
    block, block_shape = found[0]
    if any(other != (block, block_shape) for other in found):
        raise LayoutError(f"model {name!r} has blocks of different shapes: the layout model takes equal blocks")
    split, whole, flops = _block_parts(block, block_shape)
    total = zoo.count_parameters(m)
    return Transformer(
        name=name, blocks=len(found), dim=block_shape[-1], heads=block.attention.heads,
        kv_heads=block.attention.groups, hidden=block.mlp.hidden, vocab=vocab, tokens=block_shape[0],
        block_split=split, block_whole=whole, other=total - len(found) * (split + whole), block_flops=flops,
        flops_per_sample=model_flops(m).training,
    )  # fmt: skip


def problems(layout: Layout, model: Transformer, batch_size: int) -> list[str]:
    """Why `layout` cannot run `model` (empty: it can): tp divides heads, KV heads and the MLP's
    width; pp is at most the blocks; the micro-batches divide the batch."""
    out = []
    for what, count in (("heads", model.heads), ("KV heads", model.kv_heads), ("MLP width", model.hidden)):
        if count % layout.tp:
            out.append(f"tp {layout.tp} does not divide the {count} {what} of {model.name}")
    if layout.pp > model.blocks:
        out.append(f"pp {layout.pp} is more stages than the {model.blocks} blocks of {model.name}")
    if layout.pp > 1 and batch_size % layout.microbatches:
        out.append(f"{layout.microbatches} micro-batches do not divide the batch of {batch_size}")
    return out


# ------------------------------------------------------------------------------------------
# The job and the machine


@dataclass(frozen=True)
class Job:
    """What is trained: the model, the batch per data-parallel rank, the numerics."""

    model: Transformer
    batch_size: int  # per data-parallel rank (dp × fsdp of them)
    precision: str = "fp32"  # fp32 | tf32 | bf16 | fp16
    optimizer: str = "adamw"
    flash_attention: bool = False  # attention's S² scores are not kept for backward

    @property
    def mixed(self) -> bool:
        return self.precision in MIXED

    @property
    def activation_bytes(self) -> int:
        """Bytes of an activation element: 2 under mixed precision, else 4."""
        return 2 if self.mixed else 4


# ------------------------------------------------------------------------------------------
# Memory


@dataclass(frozen=True)
class Memory:
    """Bytes per device, by what holds them."""

    weights: float  # fp32 master weights (+ the low-precision copy under mixed precision)
    gradients: float
    optimizer: float
    gathered: float  # a zero-3 shard's gathered units (the one computed, the one prefetched)
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.gathered + self.activations


def stage_blocks(model: Transformer, pp: int) -> int:
    """Blocks of the largest stage: ⌈L / pp⌉."""
    return -(-model.blocks // pp)


def device_parameters(model: Transformer, layout: Layout) -> float:
    """Parameters of the largest stage on one device before fsdp shards them: its blocks with
    their matrices split by tp, and every parameter outside the blocks whole."""
    block = model.block_split / layout.tp + model.block_whole
    return stage_blocks(model, layout.pp) * block + model.other


def unit_parameters(model: Transformer, layout: Layout) -> float:
    """The largest FSDP unit's parameters on one device, gathered: a block (its tp share) or the root."""
    return max(model.block_split / layout.tp + model.block_whole, float(model.other))


def block_activations(job: Job, tp: int, microbatch: float) -> float:
    """Bytes one block keeps for backward per micro-batch of `microbatch` samples (Korthikanti
    et al. 2022, tensor parallelism without sequence parallelism, no recomputation):
    S·b·D·(10 + 24/t + 5·a·S/(D·t)) at 2-byte precision, twice that in fp32; without the
    attention scores' 5·a·S/(D·t) under a fused (flash) attention kernel."""
    m = job.model
    s, d = m.tokens, m.dim
    per_element = 10 + 24 / tp + (0.0 if job.flash_attention else 5 * m.heads * s / (d * tp))
    return s * microbatch * d * per_element * (1 if job.mixed else 2)


def microbatch_size(job: Job, layout: Layout) -> float:
    return job.batch_size / layout.microbatches if layout.pp > 1 else float(job.batch_size)


def in_flight(layout: Layout) -> int:
    """Micro-batches whose activations the first stage holds at once: all of them in GPipe,
    at most pp in 1F1B."""
    if layout.pp == 1:
        return 1
    return layout.microbatches if layout.schedule == "gpipe" else min(layout.pp, layout.microbatches)


def memory(job: Job, layout: Layout) -> Memory:
    """Bytes per device of `job` on `layout` (docs/metrics-and-model.md, "Layouts")."""
    m = job.model
    p = device_parameters(m, layout)
    sharded = layout.fsdp > 1
    weight_share = layout.fsdp if sharded and layout.zero == 3 else 1
    state_share = layout.fsdp  # zero 2 and 3 shard gradients and optimizer state
    weight_bytes = WEIGHT_BYTES + (COPY_BYTES if job.mixed else 0)
    gathered = 0.0
    if sharded and layout.zero == 3:
        gathered = GATHERED_UNITS * unit_parameters(m, layout) * weight_bytes
    mb = microbatch_size(job, layout)
    per_block = block_activations(job, layout.tp, mb)
    blocks = stage_blocks(m, layout.pp)
    logits = LOGIT_BYTES * m.tokens * mb * m.vocab
    last = blocks * per_block + logits  # the last stage: one micro-batch at a time, and the logits
    first = blocks * in_flight(layout) * per_block
    return Memory(
        weights=p * weight_bytes / weight_share,
        gradients=p * GRAD_BYTES / state_share,
        optimizer=p * OPTIMIZER_BYTES[job.optimizer] / state_share,
        gathered=gathered,
        activations=max(first, last),
    )
