"""A point's layout (`hpcbench.spec.parallel`) as PyTorch process groups, and the collectives
that time every message on them.

Every rank creates every group of every axis, in the same order (torch.distributed's rule),
and keeps its own. `Traced` is one group's collectives: each call records a `/comm` row
(kind, the group's mesh axis, bytes as nccl-tests counts them, begin and end on the rank's
clock) and, for the data-parallel axes, adds its time to the iteration's `comm_total`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hpcbench.spec.parallel import Layout

if TYPE_CHECKING:
    from hpcbench.frameworks.torch.exchange import Exchange

DATA_AXES = ("dp", "fsdp")  # whose messages are the gradient exchange (`comm_total`)


class Mesh:
    """This rank's groups along each axis of `layout` (None where the axis has degree 1),
    and its replica group: the ranks that hold one copy of the model between them (every
    axis but dp), over gloo, for the weights' checksum."""

    def __init__(self, layout: Layout, rank: int, backend: str | None = None) -> None:
        self.layout = layout
        self.rank = rank
        self.coords = layout.coords(rank)
        self.groups: dict[str, Any] = {}
        for axis in ("pp", "dp", "fsdp", "tp"):
            if layout.degree(axis) == 1:
                continue
            for ranks in layout.groups(axis):
                group = dist.new_group(list(ranks), backend=backend)
                if rank in ranks:
                    self.groups[axis] = group
        if layout.pp > 1:  # each pipeline's first and last ranks: a head tied to the embedding
            for ranks in layout.groups("pp"):
                group = dist.new_group([ranks[0], ranks[-1]], backend=backend)
                if rank in (ranks[0], ranks[-1]):
                    self.groups["ends"] = group
        self.replica: Any = None
        replicas = [tuple(r for r in range(layout.ranks) if layout.coords(r)["dp"] == d) for d in range(layout.dp)]
        for ranks in replicas:
            group = dist.new_group(list(ranks), backend="gloo")
            if rank in ranks:
                self.replica = group

    def index(self, axis: str) -> int:
        return self.coords[axis]

    def peer(self, axis: str, index: int) -> int:
        """The global rank at `index` along `axis` of this rank's group."""
        return self.layout.rank_of({**self.coords, axis: index})


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class Traced:
    """The collectives of one group (axis `axis`), each timed into the exchange's recorder.

    Synchronous calls end when they return (on a GPU, the recorder's events time the device's
    part). An asynchronous one (FSDP's on CUDA) ends when its future completes."""

    def __init__(self, exchange: Exchange, group: Any, axis: str) -> None:
        self.exchange = exchange
        self.group = group
        self.axis = axis
        self._data = axis in DATA_AXES

    def _begin(self, op: str, name: str, tensor: torch.Tensor, nbytes: int) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        comm = self.exchange.comm
        slot = (
            comm.begin(self.exchange.iteration, op, name, _dtype(tensor), nbytes, t0, self.axis)
            if comm is not None
            else -1
        )
        return slot, t0

    def _end(self, slot: int, t0: int) -> None:
        t1 = time.perf_counter_ns()
        if self._data:
            self.exchange.total_ns += t1 - t0
        comm = self.exchange.comm
        if comm is not None and slot >= 0:
            comm.end(slot, t1)

    def _finished(self, work: Any, slot: int, t0: int) -> Any:
        if work is None:
            self._end(slot, t0)
            return None

        def done(fut: Any) -> Any:
            self._end(slot, t0)
            return fut.value()

        work.get_future().then(done)
        return work

    def all_reduce(self, tensor: torch.Tensor, name: str, async_op: bool = False) -> Any:
        slot, t0 = self._begin("allreduce", name, tensor, _nbytes(tensor))
        return self._finished(dist.all_reduce(tensor, group=self.group, async_op=async_op), slot, t0)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, name: str, async_op: bool = False) -> Any:
        slot, t0 = self._begin("allgather", name, output, _nbytes(output))
        work = dist.all_gather_into_tensor(output, input, group=self.group, async_op=async_op)
        return self._finished(work, slot, t0)

    def reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, op: Any, name: str, async_op: bool = False
    ) -> Any:
        slot, t0 = self._begin("reducescatter", name, input, _nbytes(input))
        work = dist.reduce_scatter_tensor(output, input, op=op, group=self.group, async_op=async_op)
        return self._finished(work, slot, t0)

    def send(self, tensor: torch.Tensor, peer: int, name: str) -> Any:
        """Non-blocking: its end is seen when the returned work is waited on (`wait`)."""
        slot, t0 = self._begin("send", name, tensor, _nbytes(tensor))
        return dist.isend(tensor, peer, group=self.group), slot, t0

    def recv(self, tensor: torch.Tensor, peer: int, name: str) -> None:
        slot, t0 = self._begin("recv", name, tensor, _nbytes(tensor))
        dist.recv(tensor, peer, group=self.group)
        self._end(slot, t0)

    def wait(self, sent: tuple[Any, int, int]) -> None:
        work, slot, t0 = sent
        work.wait()
        self._end(slot, t0)
