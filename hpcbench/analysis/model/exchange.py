"""How a backend sends the gradients of one iteration, and when each message ends.

Gradients become ready in backward order, each when its layer's backward ends. A backend
groups them into messages: one per tensor (per-parameter MPI, MXNet's kvstore), DDP's
buckets (filled in backward order up to a cap, the first one smaller; a bucket leaves when
its last gradient is ready), Horovod's tensor fusion (every cycle, the gradients ready by
then, up to the fusion threshold, go as one message), or one message after backward. A
message starts when it is ready and the previous one has ended (one collective at a time),
and lasts `cost(bytes)`. The communication left after backward ends is exposed; with
`overlap=False` every message waits for backward to end.

With one message per tensor and no cycle this is the wait-free back-propagation recurrence
of model.wfbp; the other groupings apply the same recurrence to their messages (merged
gradients, as MG-WFBP schedules them). Definitions: docs/metrics-and-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcbench.analysis.model.collectives import ModelError
from hpcbench.analysis.model.iteration import Layer
from hpcbench.store.traits import Grouping, Traits

MB = 1024 * 1024
DDP_BUCKET_BYTES = 25 * MB  # torch DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MB  # its first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
HOROVOD_FUSION_BYTES = 64 * MB  # HOROVOD_FUSION_THRESHOLD's documented default
HOROVOD_CYCLE_S = 1e-3  # HOROVOD_CYCLE_TIME

Cost = Callable[[float], float]  # seconds of one message of n bytes


@dataclass(frozen=True)
class Exchange:
    """How gradients become messages. `fusion_bytes`: 0 one message per tensor, math.inf one
    message for all; otherwise the cap of a bucket (DDP, `first_bucket_bytes` for the first)
    or of a fused message (Horovod, with `cycle_s` > 0)."""

    fusion_bytes: float = 0.0
    first_bucket_bytes: float = 0.0
    cycle_s: float = 0.0
    overlap: bool = True

    def __post_init__(self) -> None:
        for name in ("fusion_bytes", "first_bucket_bytes", "cycle_s"):
            value = getattr(self, name)
            if math.isnan(value) or value < 0:
                raise ModelError(f"exchange {name}: {value!r} is not a non-negative number")


PER_TENSOR = Exchange()
ONE_MESSAGE = Exchange(fusion_bytes=math.inf)
DDP = Exchange(fusion_bytes=DDP_BUCKET_BYTES, first_bucket_bytes=DDP_FIRST_BUCKET_BYTES)
HOROVOD = Exchange(fusion_bytes=HOROVOD_FUSION_BYTES, cycle_s=HOROVOD_CYCLE_S)

# How each grouping of a backend's gradients (trait `grouping`, store/traits.py) sends them:
# one message per tensor (per-parameter MPI, MXNet's kvstore, JAX's pmean), one message of
# every gradient (TensorFlow's multiworker, JAX's pmean_fused, ChainerMN's pure_nccl), DDP's
# buckets (torch gloo, nccl), Horovod's fusion.
GROUPING_EXCHANGE: dict[Grouping, Exchange] = {
    "per_tensor": PER_TENSOR,
    "one_message": ONE_MESSAGE,
    "buckets": DDP,
    "fusion": HOROVOD,
}


def exchange_of(traits: Traits) -> Exchange:
    """What a backend of these traits does by default."""
    return GROUPING_EXCHANGE[traits.grouping]


@dataclass(frozen=True)
class Message:
    grad_bytes: float
    ready: float  # seconds after backward began
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    messages: tuple[Message, ...]
    backward: float  # when backward ends
    comm_total: float  # Σ message durations
    exposed: float  # communication after backward ends


def _ready_times(layers: Sequence[Layer]) -> tuple[list[float], list[float]]:
    """(bytes, ready time) of every tensor in backward order (layers given input first)."""
    sizes, ready, t = [], [], 0.0
    for layer in reversed(layers):
        t += layer.backward_s
        sizes.append(layer.grad_bytes)
        ready.append(t)
    return sizes, ready


def _static_groups(sizes: Sequence[float], exchange: Exchange) -> list[list[int]]:
    """Tensors (backward order) per message when the grouping does not depend on timing."""
    if exchange.fusion_bytes == 0:
        return [[i] for i in range(len(sizes))]
    groups: list[list[int]] = [[]]
    filled = 0.0
    for i, n in enumerate(sizes):
        cap = exchange.first_bucket_bytes if len(groups) == 1 and exchange.first_bucket_bytes else exchange.fusion_bytes
        if groups[-1] and filled + n > cap:
            groups.append([])
            filled = 0.0
        groups[-1].append(i)
        filled += n
    return groups


def _tick(t: float, cycle_s: float) -> float:
    """The first cycle boundary at or after t."""
    return math.ceil(t / cycle_s - 1e-12) * cycle_s if cycle_s > 0 else t


def _fused(sizes: list[float], ready: list[float], cost: Cost, ex: Exchange, backward: float) -> list[Message]:
    """Horovod: every cycle, the gradients ready by then go as one message, up to the threshold."""
    messages: list[Message] = []
    free, i = 0.0, 0
    while i < len(sizes):
        start = _tick(max(free, ready[i], 0.0 if ex.overlap else backward), ex.cycle_s)
        j, total = i + 1, sizes[i]
        while j < len(sizes) and ready[j] <= start and total + sizes[j] <= ex.fusion_bytes:
            total += sizes[j]
            j += 1
        free = start + (cost(total) if total > 0 else 0.0)
        messages.append(Message(total, ready[j - 1], start, free))
        i = j
    return messages


def _grouped(sizes: list[float], ready: list[float], cost: Cost, ex: Exchange, backward: float) -> list[Message]:
    """Per tensor, DDP's buckets or one message: groups fixed before the iteration runs."""
    messages: list[Message] = []
    free = 0.0
    for group in _static_groups(sizes, ex):
        total = sum(sizes[j] for j in group)
        at = ready[group[-1]] if ex.overlap else backward
        start = max(free, at)
        free = start + (cost(total) if total > 0 else 0.0)
        messages.append(Message(total, at, start, free))
    return messages


def schedule(layers: Sequence[Layer], cost: Cost, exchange: Exchange = PER_TENSOR) -> Schedule:
    """The messages of one iteration's exchange and when each starts and ends."""
    sizes, ready = _ready_times(layers)
    backward = ready[-1] if ready else 0.0
    fused = exchange.cycle_s > 0 and exchange.fusion_bytes > 0
    messages = (_fused if fused else _grouped)(sizes, ready, cost, exchange, backward)
    comm_total = sum(m.end - m.start for m in messages)
    exposed = max(messages[-1].end - backward, 0.0) if messages else 0.0
    return Schedule(tuple(messages), backward, comm_total, exposed)
