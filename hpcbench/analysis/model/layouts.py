"""A performance and memory model of a transformer trained on a parallel layout (dp × fsdp ×
tp × pp, spec/parallel.py), and the enumeration `hpcbench predict FILE.yaml --layouts` ranks.

Every formula is stated in docs/metrics-and-model.md, "Layouts". In short, per device:

- memory: parameters held (tp divides the blocks' matrices, pp the blocks, fsdp what ZeRO
  shards) × bytes per parameter (weights 4, + 2 for the low-precision copy under mixed
  precision, gradients 4, optimizer state adam/adamw 8, momentum 4, sgd 0), the units a
  zero-3 shard gathers, and activations after Korthikanti et al. (2022):
  S·b·D·(10 + 24/t + 5·a·S/(D·t)) bytes per block and micro-batch at 2-byte precision;
- time: the compute (model FLOPs / (peak × efficiency), or a measured one-rank time) split
  over tp × pp, the pipeline's fill and drain ((pp − 1) micro-batch slots), tensor-parallel
  all-reduces and stage-to-stage sends on the critical path, and the sharded data
  parallelism's all-gathers, reduce-scatters and all-reduces overlapped with the compute
  one unit ahead (FSDP's prefetch), each collective costed with an α-β link of the level its
  group spans.

Pure computation: no trace, no framework.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from hpcbench.analysis.model import collectives as co
from hpcbench.errors import HpcbenchError
from hpcbench.spec.parallel import AXES, Layout
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


@dataclass(frozen=True)
class Machine:
    """Where: ranks per node, the two levels' links, the compute rate, the device's memory."""

    ranks_per_node: int
    intra: co.LinkCost
    inter: co.LinkCost
    device_memory: float  # bytes per device
    nics_per_node: int = 1
    peak_flops: float | None = None  # per device, for the job's precision
    efficiency: float = 0.5  # the share of the peak the compute reaches
    single_rank_s: float | None = None  # a measured iteration of batch_size samples on one device (wins)


def step_compute(job: Job, machine: Machine) -> float:
    """Seconds one device computes forward and backward of the whole model on `batch_size`
    samples: measured, else model FLOPs / (peak × efficiency)."""
    if machine.single_rank_s is not None:
        return machine.single_rank_s
    if not machine.peak_flops:
        raise LayoutError("no compute rate: give a peak (peak_tflops or device) or a measured single rank")
    return job.model.flops_per_sample * job.batch_size / (machine.peak_flops * machine.efficiency)


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


# ------------------------------------------------------------------------------------------
# Collectives on the levels their groups span


@dataclass(frozen=True)
class Span:
    """Where an axis's groups lie: inside a node or across nodes, and how many of them cross
    a node's network adapters at once."""

    size: int  # ranks in a group
    intra: bool
    flows: int  # groups with ranks on one node (each crossing its adapters, when inter)


def span(layout: Layout, axis: str, ranks_per_node: int) -> Span:
    """The span of `axis`'s groups: intra when every group's ranks share a node."""
    size = layout.degree(axis)
    if size == 1:
        return Span(1, True, 1)
    groups = list(layout.groups(axis))
    intra = all(len({r // ranks_per_node for r in g}) == 1 for g in groups)
    flows = len({g for g in groups if any(r < ranks_per_node for r in g)})
    return Span(size, intra, flows)


def level_link(s: Span, machine: Machine) -> co.LinkCost:
    """The link a group's collective runs on: the node's inside, or the network, whose β the
    groups crossing a node's adapters at once share (flows / adapters, at least 1)."""
    if s.intra:
        return machine.intra
    share = max(1.0, s.flows / machine.nics_per_node)
    return co.LinkCost(machine.inter.alpha, machine.inter.beta * share, machine.inter.gamma)


def allreduce_cost(n: float, s: Span, machine: Machine) -> float:
    """A ring all-reduce of n bytes over the group: 2(g−1)α + 2n(g−1)/g·β."""
    return co.ring_allreduce(n, s.size, level_link(s, machine)) if s.size > 1 and n > 0 else 0.0


def gather_cost(n: float, s: Span, machine: Machine) -> float:
    """A ring all-gather of n gathered bytes, or a reduce-scatter of n input bytes, over the
    group: (g−1)α + n(g−1)/g·β."""
    return co.ring_allgather(n, s.size, level_link(s, machine)) if s.size > 1 and n > 0 else 0.0


def send_cost(n: float, s: Span, machine: Machine) -> float:
    """One point-to-point send of n bytes: α + n·β."""
    link = level_link(s, machine)
    return link.alpha + n * link.beta if s.size > 1 else 0.0


# ------------------------------------------------------------------------------------------
# Time


def bubble_fraction(pp: int, microbatches: int) -> float:
    """The pipeline's idle share of an iteration, GPipe and 1F1B alike: (pp − 1) / (m + pp − 1)."""
    return (pp - 1) / (microbatches + pp - 1)


def overlapped(compute: Sequence[float], before: Sequence[float], after: Sequence[float]) -> float:
    """Seconds from the first unit's start to the end of all work, when unit u computes for
    compute[u], needs before[u] (a gather) done before it starts and hands after[u] (a
    reduction) over when it ends; one communication stream serves them in the order they are
    issued: before[u+1] when unit u starts (one unit ahead, FSDP's prefetch), after[u] when it
    ends. Exposed communication = the result − Σ compute."""
    if not compute:
        return 0.0
    stream = before[0]
    ready = stream
    t = 0.0
    for u, work in enumerate(compute):
        start = max(t, ready)
        if u + 1 < len(compute):
            stream = max(stream, start) + before[u + 1]
            ready = stream
        t = start + work
        stream = max(stream, t) + after[u]
    return max(t, stream)


@dataclass(frozen=True)
class LayoutPrediction:
    """One layout on `nodes` nodes: its iteration time and its parts, its memory per device."""

    layout: Layout
    nodes: int
    memory: Memory
    fits: bool
    compute_s: float  # per device, the iteration's forward and backward, no bubble
    bubble_s: float  # the pipeline's fill and drain
    tp_comm_s: float  # tensor-parallel all-reduces (on the critical path)
    pp_comm_s: float  # stage-to-stage sends on the critical path
    shard_comm_s: float  # all-gathers, reduce-scatters and data-parallel all-reduces, in all
    shard_exposed_s: float  # of which not hidden behind the compute
    t_iter_s: float
    samples_per_s: float
    tokens_per_s: float


def predict(job: Job, machine: Machine, layout: Layout) -> LayoutPrediction:
    """`job` on `layout` (every rank of it one device, ranks_per_node of them per node)."""
    m = job.model
    rpn = machine.ranks_per_node
    spans = {axis: span(layout, axis, rpn) for axis in AXES}
    mbs = layout.microbatches if layout.pp > 1 else 1
    mb = microbatch_size(job, layout)
    compute = step_compute(job, machine) / (layout.tp * layout.pp)  # the device's share of the batch
    # tensor parallelism: 2 all-reduces of S·b·D activations per block forward, 2 backward
    tp_one = allreduce_cost(m.tokens * mb * m.dim * job.activation_bytes, spans["tp"], machine)
    blocks = stage_blocks(m, layout.pp)
    tp_mb = 4 * blocks * tp_one  # per micro-batch on one stage
    # pipeline: per micro-batch a stage receives its input and sends its output, forward and backward
    send = send_cost(m.tokens * mb * m.dim * STAGE_BYTES, spans["pp"], machine)
    pp_mb = 2 * send if layout.pp > 1 else 0.0
    slot = compute / mbs + tp_mb + pp_mb  # one micro-batch on one stage
    pipeline = (mbs + layout.pp - 1) * slot
    bubble = (layout.pp - 1) * slot
    # sharded data parallelism, overlapped with the stage's work one unit ahead
    shard_total, exposed = _sharded(job, machine, layout, spans, pipeline)
    t_iter = pipeline + exposed
    samples = job.batch_size * layout.data_ranks / t_iter
    mem = memory(job, layout)
    return LayoutPrediction(
        layout=layout, nodes=layout.ranks // rpn, memory=mem, fits=mem.total <= machine.device_memory,
        compute_s=compute, bubble_s=bubble, tp_comm_s=(mbs + layout.pp - 1) * tp_mb,
        pp_comm_s=(mbs + layout.pp - 1) * pp_mb, shard_comm_s=shard_total, shard_exposed_s=exposed,
        t_iter_s=t_iter, samples_per_s=samples, tokens_per_s=samples * m.tokens,
    )  # fmt: skip


def _sharded(job: Job, machine: Machine, layout: Layout, spans: dict[str, Span], busy: float) -> tuple[float, float]:
    """(all, exposed) seconds of the gradient exchange: FSDP's all-gathers and reduce-scatters
    and the all-reduce over dp, per unit (the root, then each block of the stage), overlapped
    with the units' share of `busy` (the stage's iteration) by `overlapped`."""
    m = job.model
    if layout.data_ranks == 1:
        return 0.0, 0.0
    blocks = stage_blocks(m, layout.pp)
    params = [float(m.other)] + [m.block_split / layout.tp + m.block_whole] * blocks  # root first
    flops = [m.other_flops] + [m.block_flops / layout.tp] * blocks
    work = [busy * f / sum(flops) for f in flops]
    fsdp, dp = spans["fsdp"], spans["dp"]
    gather = [gather_cost(p * PARAM_COMM_BYTES, fsdp, machine) for p in params]
    scatter = [gather_cost(p * PARAM_COMM_BYTES, fsdp, machine) for p in params]
    reduce = [allreduce_cost(p * PARAM_COMM_BYTES / layout.fsdp, dp, machine) for p in params]
    regather = gather if layout.fsdp > 1 and layout.zero == 3 else [0.0] * len(params)
    regather = [0.0, *regather[1:]]  # the root stays gathered from forward to backward
    forward = [w * FORWARD_SHARE for w in work]
    backward = [w - f for w, f in zip(work, forward, strict=True)]
    zeros = [0.0] * len(params)
    t_forward = overlapped(forward, gather, zeros)
    after = [s + r for s, r in zip(scatter, reduce, strict=True)]
    t_backward = overlapped(backward[::-1], regather[::-1], after[::-1])
    total = sum(gather) + sum(regather) + sum(after)
    return total, (t_forward - sum(forward)) + (t_backward - sum(backward))


# ------------------------------------------------------------------------------------------
# Enumeration


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_microbatches(batch_size: int, pp: int) -> int:
    """The largest divisor of the batch that is at most 4 · pp (1 without a pipeline)."""
    if pp == 1:
        return 1
    return max(d for d in divisors(batch_size) if d <= MICROBATCHES_PER_STAGE * pp)


def layouts(
    model: Transformer,
    batch_size: int,
    ranks: int,
    microbatches: int | None = None,
    schedules: Sequence[str] = ("1f1b",),
) -> Iterator[Layout]:
    """Every dp × fsdp (zero 2 and 3) × tp × pp of `ranks` that can run `model` (`problems`)."""
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            for fsdp in divisors(ranks // (tp * pp)):
                dp = ranks // (tp * pp * fsdp)
                for zero in (2, 3) if fsdp > 1 else (3,):
                    for schedule in schedules if pp > 1 else ("1f1b",):
                        mbs = (microbatches or default_microbatches(batch_size, pp)) if pp > 1 else 1
                        layout = Layout(dp, fsdp, tp, pp, zero, mbs, schedule)
                        if not problems(layout, model, batch_size):
                            yield layout


def rank(
    job: Job,
    machine: Machine,
    nodes: Sequence[int],
    microbatches: int | None = None,
    schedules: Sequence[str] = ("1f1b",),
    only: Sequence[Layout] = (),
) -> pd.DataFrame:
    """Every layout of every node count (or `only` these, dp filled to the ranks), predicted:
    per node count, those that fit the device's memory first, each part by tokens/s (the most
    first: the layouts train different global batches, dp × fsdp × batch_size, so their t_iter
    alone does not rank them), then those that do not."""
    rows = []
    for n in nodes:
        ranks = n * machine.ranks_per_node
        if only:
            found = [fitted for lay in only if (fitted := fill(lay, ranks)) is not None]
        else:
            found = list(layouts(job.model, job.batch_size, ranks, microbatches, schedules))
        for layout in found:
            rows.append(row(predict(job, machine, layout)))
    table = pd.DataFrame(rows, columns=COLUMNS)
    if table.empty:
        return table
    table["_order"] = ~table["fits"].astype(bool)
    table["_rate"] = -table["tokens_per_s"]
    table = table.sort_values(["nodes", "_order", "_rate", "memory_gib"], kind="stable")
    return table.drop(columns=["_order", "_rate"]).reset_index(drop=True)


def fill(layout: Layout, ranks: int) -> Layout | None:
    """`layout` with dp set to fill `ranks` (None where fsdp × tp × pp does not divide them)."""
    split = layout.fsdp * layout.tp * layout.pp
    if ranks % split:
        return None
    return replace(layout, dp=ranks // split)


def row(pred: LayoutPrediction) -> dict[str, object]:
    lay, mem = pred.layout, pred.memory
    return {
        "nodes": pred.nodes, "ranks": lay.ranks, "layout": lay.label(), "dp": lay.dp, "fsdp": lay.fsdp,
        "zero": lay.zero if lay.fsdp > 1 else 0, "tp": lay.tp, "pp": lay.pp,
        "microbatches": lay.microbatches if lay.pp > 1 else 1, "schedule": lay.schedule if lay.pp > 1 else "",
        "fits": pred.fits, "t_iter_s": pred.t_iter_s, "tokens_per_s": pred.tokens_per_s,
        "samples_per_s": pred.samples_per_s, "memory_gib": mem.total / GIB, "compute_s": pred.compute_s,
        "bubble_s": pred.bubble_s, "bubble": bubble_fraction(lay.pp, lay.microbatches) if lay.pp > 1 else 0.0,
        "tp_comm_s": pred.tp_comm_s, "pp_comm_s": pred.pp_comm_s, "shard_comm_s": pred.shard_comm_s,
        "shard_exposed_s": pred.shard_exposed_s, "weights_gib": mem.weights / GIB,
        "gradients_gib": mem.gradients / GIB, "optimizer_gib": mem.optimizer / GIB,
        "gathered_gib": mem.gathered / GIB, "activations_gib": mem.activations / GIB,
    }  # fmt: skip
