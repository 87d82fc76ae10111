"""The iteration model of synchronous data-parallel SGD (after Shi, Wang and Chu, 2018).

Plain functions of plain numbers: it needs no trace. Inputs are per-phase times of one
rank, the gradient size and backward time of every layer (or bucket), the α–β cost of the
network and the number of ranks; the output is the predicted iteration and its parts.

Layers are numbered 1..L from the input; backward runs L -> 1, so layer L's gradients are
ready first. `layers[0]` is layer 1. Definitions: docs/metrics-and-model.md.
The collective costs it uses are in collectives.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpcbench.analysis.model.collectives import LinkCost, MessageCost, ModelError, check_ranks, ring_message_cost


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per iteration of one rank, except backward (the layers carry it)."""

    data: float = 0.0  # I/O: reading the next batch
    h2d: float = 0.0
    forward: float = 0.0
    update: float = 0.0


@dataclass(frozen=True)
class Layer:
    """One layer (or gradient bucket): bytes of its gradients, seconds of its backward."""

    grad_bytes: float
    backward_s: float


# --------------------------------------------------------------------------------------
# One process driving several devices


@dataclass(frozen=True)
class HostWork:
    """A process's host work for one device in one step (graph dispatch, kernel launches, the
    variable update's bookkeeping), in one of three forms, the others 0: `seconds` as given,
    `fraction` of one device's step, or `per_sample_s` for each of the device's samples."""

    seconds: float = 0.0
    fraction: float = 0.0
    per_sample_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("seconds", "fraction", "per_sample_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ModelError(f"host work {name}: {value!r} is not a non-negative number")
        if self.fraction >= 1:
            raise ModelError(f"host work fraction {self.fraction!r}: the host cannot take the whole step or more")

    def per_device(self, device_step_s: float, batch_size: int) -> float:
        """h = seconds + fraction · t₁ + per_sample_s · b, t₁ one device's step of b samples."""
        return self.seconds + self.fraction * device_step_s + self.per_sample_s * batch_size


def serialised_host(host_s: float, devices: int) -> float:
    """The step's time added when one process drives `devices` devices: (d − 1)·h.

    The process does each device's host work h in turn, while the devices compute in parallel;
    device i starts its step (i − 1)·h after the first, so the last one, whose gradients every
    exchange waits for, ends (d − 1)·h after one device alone would (one device's step t₁
    already holds its own h)."""
    if devices < 1:
        raise ModelError(f"devices per rank must be >= 1, got {devices}")
    if not (math.isfinite(host_s) and host_s >= 0):
        raise ModelError(f"host work {host_s!r} s is not a non-negative time")
    return (devices - 1) * host_s


# --------------------------------------------------------------------------------------
# Wait-free back-propagation


@dataclass(frozen=True)
class WfbpSchedule:
    """τb[l] (start of layer l's backward) and τc[l] (start of its communication), layers 1..L
    at indices 0..L−1, and the communication left after backward ends."""

    tau_b: tuple[float, ...]
    tau_c: tuple[float, ...]
    non_overlapped: float


def wfbp(tb: Sequence[float], tc: Sequence[float]) -> WfbpSchedule:
    """The wait-free back-propagation recurrence (docs/metrics-and-model.md), layers 1..L at indices 0..L−1:

    τb[L] = 0; τb[l] = τb[l+1] + tb[l+1]
    τc[L] = τb[L] + tb[L]; τc[l] = max(τc[l+1] + tc[l+1], τb[l] + tb[l])
    non-overlapped = τc[1] + tc[1] − (τb[1] + tb[1])
    """
    if len(tb) != len(tc):
        raise ModelError(f"{len(tb)} backward times but {len(tc)} communication times")
    n = len(tb)
    if n == 0:
        return WfbpSchedule((), (), 0.0)
    tau_b = [0.0] * n
    tau_c = [0.0] * n
    last = n - 1
    tau_b[last] = 0.0
    for l in range(last - 1, -1, -1):  # noqa: E741 - l is the layer, as in the paper
        tau_b[l] = tau_b[l + 1] + tb[l + 1]
    tau_c[last] = tau_b[last] + tb[last]
    for l in range(last - 1, -1, -1):  # noqa: E741
        tau_c[l] = max(tau_c[l + 1] + tc[l + 1], tau_b[l] + tb[l])
    non_overlapped = tau_c[0] + tc[0] - (tau_b[0] + tb[0])
    return WfbpSchedule(tuple(tau_b), tuple(tau_c), non_overlapped)


# --------------------------------------------------------------------------------------
# The iteration


@dataclass(frozen=True)
class IterationPrediction:
    """A predicted iteration and its parts (seconds)."""

    ranks: int
    batch_size: int  # per rank
    overlap: bool  # wait-free back-propagation (True) or communication after backward (False)
    data: float
    h2d: float
    forward: float
    backward: float
    comm_total: float  # Σ tc over the messages
    comm_exposed: float  # the part not hidden behind backward
    update: float
    overhead: float  # time in no phase (loop, synchronisation skew), carried over from measurement
    t_iter: float
    sync_wait: float = 0.0  # of comm_exposed: the wait for the last rank (skew.py)

    @property
    def throughput(self) -> float:
        """Samples per second, N·b / t_iter."""
        return self.ranks * self.batch_size / self.t_iter if self.t_iter > 0 else math.nan


def _check_inputs(phases: PhaseTimes, layers: Sequence[Layer], ranks: int, batch_size: int) -> None:
    check_ranks(ranks)
    if batch_size < 1:
        raise ModelError(f"batch size must be >= 1, got {batch_size}")
    for name in ("data", "h2d", "forward", "update"):
        value = getattr(phases, name)
        if not math.isfinite(value) or value < 0:
            raise ModelError(f"phase {name}: {value!r} is not a non-negative time")
    for i, layer in enumerate(layers, start=1):
        if not (math.isfinite(layer.backward_s) and layer.backward_s >= 0):
            raise ModelError(f"layer {i}: backward time {layer.backward_s!r} is not a non-negative time")
        if not (math.isfinite(layer.grad_bytes) and layer.grad_bytes >= 0):
            raise ModelError(f"layer {i}: gradient size {layer.grad_bytes!r} is not a non-negative byte count")


def message_times(
    layers: Sequence[Layer], ranks: int, link: LinkCost, message_cost: Callable[[float], float] | None = None
) -> list[float]:
    """tc[l] of every layer: its gradients' ring all-reduce over `ranks` (0 on one rank), or
    `message_cost` of its bytes (a parameter server's push and pull: servers.py)."""
    if message_cost is None:
        if ranks == 1:
            return [0.0] * len(layers)
        message_cost = ring_message_cost(ranks, link).time
    return [message_cost(layer.grad_bytes) if layer.grad_bytes > 0 else 0.0 for layer in layers]


def predict_iteration(
    phases: PhaseTimes,
    layers: Sequence[Layer],
    link: LinkCost,
    ranks: int,
    batch_size: int = 1,
    *,
    overlap: bool = True,
    prefetch: bool = False,
    overhead: float = 0.0,
    exchange_wait: float = 0.0,
    message_cost: Callable[[float], float] | None = None,
    sync_wait: float = 0.0,
    local_exchange: float = 0.0,
) -> IterationPrediction:
    """One iteration on `ranks` ranks.

    Without overlap: t_iter = t_io + t_h2d + t_f + t_b + t_c + t_u, t_c = Σ tc[l].
    With wait-free back-propagation: t_f + t_b + non-overlapped comm + t_u (plus t_io + t_h2d).
    With `prefetch`, I/O and H2D hide behind the rest of the iteration when shorter than it.
    `overhead` (time in no phase) is added as it is; `exchange_wait` (per iteration, the
    exchange's wait for time-shared threads to be scheduled: contention.py) to the exposed
    communication, when there is any; `sync_wait` (the wait for the last rank: skew.py) to
    the exposed communication of two or more ranks. `message_cost`: a message's seconds from
    its bytes in place of the ring all-reduce over `link` (message_times). `local_exchange`:
    the exchange's own work on a single rank, where no message crosses a link (a backend's
    all-reduce over one rank still waits for its hooks and copies its buckets), added to the
    communication and exposed, at one rank only.
    """
    _check_inputs(phases, layers, ranks, batch_size)
    tb = [layer.backward_s for layer in layers]
    tc = message_times(layers, ranks, link, message_cost)
    t_b, t_c = float(sum(tb)), float(sum(tc))
    exposed = wfbp(tb, tc).non_overlapped if overlap else t_c
    if t_c > 0 and exchange_wait > 0:
        t_c, exposed = t_c + exchange_wait, exposed + exchange_wait
    sync_wait = sync_wait if ranks >= 2 else 0.0
    exposed += sync_wait
    if ranks == 1 and local_exchange > 0:
        t_c, exposed = t_c + local_exchange, exposed + local_exchange
    compute = phases.forward + t_b + exposed + phases.update + overhead
    io = phases.data + phases.h2d
    t_iter = max(io, compute) if prefetch else io + compute
    return IterationPrediction(
        ranks=ranks,
        batch_size=batch_size,
        overlap=overlap,
        data=phases.data,
        h2d=phases.h2d,
        forward=phases.forward,
        backward=t_b,
        comm_total=t_c,
        comm_exposed=exposed,
        update=phases.update,
        overhead=overhead,
        t_iter=t_iter,
        sync_wait=sync_wait,
    )


def efficiency(prediction: IterationPrediction, single: IterationPrediction) -> float:
    """E(N) = X(N) / (N·X(1)) of a prediction against the one-rank one."""
    return prediction.throughput / (prediction.ranks * single.throughput)


__all__ = [
    "HostWork",
    "IterationPrediction",
    "Layer",
    "LinkCost",
    "MessageCost",
    "ModelError",
    "PhaseTimes",
    "WfbpSchedule",
    "efficiency",
    "message_times",
    "predict_iteration",
    "serialised_host",
    "wfbp",
]
