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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from hpcbench.analysis.model import collectives as co
from hpcbench.analysis.model.layout_memory import (
    COLUMNS as COLUMNS,
)
from hpcbench.analysis.model.layout_memory import (
    COPY_BYTES as COPY_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    FORWARD_SHARE as FORWARD_SHARE,
)
from hpcbench.analysis.model.layout_memory import (
    GATHERED_UNITS as GATHERED_UNITS,
)
from hpcbench.analysis.model.layout_memory import (  # re-exported: the model of a layout is one API
    GIB as GIB,
)
from hpcbench.analysis.model.layout_memory import (
    GRAD_BYTES as GRAD_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    LOGIT_BYTES as LOGIT_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    MICROBATCHES_PER_STAGE as MICROBATCHES_PER_STAGE,
)
from hpcbench.analysis.model.layout_memory import (
    MIXED as MIXED,
)
from hpcbench.analysis.model.layout_memory import (
    OPTIMIZER_BYTES as OPTIMIZER_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    PARAM_COMM_BYTES as PARAM_COMM_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    SCHEDULES as SCHEDULES,
)
from hpcbench.analysis.model.layout_memory import (
    STAGE_BYTES as STAGE_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    WEIGHT_BYTES as WEIGHT_BYTES,
)
from hpcbench.analysis.model.layout_memory import (
    Job as Job,
)
from hpcbench.analysis.model.layout_memory import (
    LayoutError as LayoutError,
)
from hpcbench.analysis.model.layout_memory import (
    Memory as Memory,
)
from hpcbench.analysis.model.layout_memory import (
    Transformer as Transformer,
)
from hpcbench.analysis.model.layout_memory import (
    block_activations as block_activations,
)
from hpcbench.analysis.model.layout_memory import (
    device_parameters as device_parameters,
)
from hpcbench.analysis.model.layout_memory import (
    in_flight as in_flight,
)
from hpcbench.analysis.model.layout_memory import (
    memory as memory,
)
from hpcbench.analysis.model.layout_memory import (
    microbatch_size as microbatch_size,
)
from hpcbench.analysis.model.layout_memory import (
    problems as problems,
)
from hpcbench.analysis.model.layout_memory import (
    stage_blocks as stage_blocks,
)
from hpcbench.analysis.model.layout_memory import (
    transformer as transformer,
)
from hpcbench.analysis.model.layout_memory import (
    unit_parameters as unit_parameters,
)
from hpcbench.spec.parallel import AXES, Layout


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
