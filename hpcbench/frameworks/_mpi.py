"""Gradients all-reduced one tensor at a time through mpi4py, each message timed.

The exchange of the adapters that run a framework's compute and move its gradients
themselves (theano, caffe, cntk: `HostMPIFramework`; synthetic's buffers): one blocking
`Allreduce` (sum) per tensor, in the order given (the adapters pass the last layer first),
each recorded as a gradient message (`allreduce`, the tensor's name) from the call to its
return and its duration added to the iteration's `comm_total`. Nothing is allocated per
message.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from hpcbench.frameworks.base import Framework, LauncherNeed, Problem, cpu_problems
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.trace.recorder import Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo


class TimedAllreduce:
    """Blocking all-reduces (sum) over `mpi` (an mpi4py communicator), each timed as a
    message. Without `mpi` (one rank alone) the messages are recorded and nothing moves."""

    def __init__(self, mpi: Any | None) -> None:
        self.mpi = mpi
        self.size = int(mpi.Get_size()) if mpi is not None else 1
        if mpi is not None:
            from mpi4py import MPI

            self._in_place, self._sum = MPI.IN_PLACE, MPI.SUM

    def each(
        self, rec: Recorder, tensors: Iterable[tuple[str, np.ndarray]], into: Sequence[np.ndarray] | None = None
    ) -> None:
        """Every (name, float32 array) summed over the ranks, in the order given: in place, or
        into the arrays of `into` (one per tensor)."""
        comm, iteration, mpi = rec.comm, rec.iteration, self.mpi
        for k, (name, g) in enumerate(tensors):
            t0 = time.perf_counter_ns()
            slot = comm.begin(iteration, "allreduce", name, "float32", g.nbytes, t0) if comm is not None else -1
            if mpi is not None:
                mpi.Allreduce(self._in_place if into is None else g, g if into is None else into[k], op=self._sum)
            t1 = time.perf_counter_ns()
            if comm is not None:
                comm.end(slot, t1)
            rec.add_comm(t1 - t0)

    def average(self, rec: Recorder, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
        """`each`, then every array divided by the ranks: the mean gradient."""
        named = list(tensors)
        self.each(rec, named)
        self.scale([g for _, g in named])

    def scale(self, arrays: Iterable[np.ndarray]) -> None:
        """Every array divided by the ranks, in place."""
        factor = np.float32(1.0 / self.size)
        for g in arrays:
            g *= factor


class HostMPIFramework(Framework):
    """A framework that computes on the CPU while its rank all-reduces the gradients itself,
    one tensor at a time through mpi4py (`TimedAllreduce`, `self.allreduce`): one backend,
    `mpi`, every model and dataset, no settings. A subclass says why it runs on the CPU only
    (`cpu_only`) and joins the ranks in its `setup` (`join`)."""

    backends: ClassVar[tuple[str, ...]] = ("mpi",)
    models: ClassVar[tuple[str, ...]] = zoo.IMAGE_NAMES
    datasets: ClassVar[tuple[str, ...]] = data.NAMES
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {"mpi": LauncherNeed("it exchanges gradients over MPI")}
    cpu_only: ClassVar[str]  # why another device is refused
    rank, size = 0, 1  # this rank's place among the MPI ranks (`join`)
    mpi: Any = None  # their mpi4py communicator

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        yield from cpu_problems(point, cls.name, cls.cpu_only)

    def join(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        """In `setup`: this rank's place among the MPI ranks (`rank`, `size`), their
        communicator (`mpi`) and the exchange over them (`allreduce`)."""
        self.mpi = self.mpi_ranks(point, comm).mpi_comm
        self.rank, self.size = renv.rank, renv.size
        self.allreduce = TimedAllreduce(self.mpi)
