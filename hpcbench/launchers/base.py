"""The launcher contract: a point and a context in, an argv list and environment out."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from hpcbench.registry import Registry
from hpcbench.spec import Point

Problem = tuple[str, str, str]  # (field, what is wrong, what is allowed)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class LaunchContext:
    """Where and how a point's ranks are started."""

    python: str  # interpreter that runs `-m hpcbench.worker` on every rank
    run_file: str  # the worker's only argument
    local: bool = True  # every rank on this host (local executor)
    cores_per_node: int = os.cpu_count() or 1
    rendezvous: str | None = None  # host:port of the first node, for launchers that need one across nodes
    srun_args: tuple[str, ...] = ("--mpi=pmix",)  # from the site profile
    mpirun_args: tuple[str, ...] = ()  # from the site profile
    container: tuple[str, ...] = ()  # prefix of every rank's command (site profile)
    hosts: tuple[str, ...] = ()  # the job's nodes, known at run time
    forward_env: tuple[str, ...] = ()  # more variables to hand to ranks on other nodes (site profile)

    def worker_argv(self) -> list[str]:
        return [*self.container, self.python, "-m", "hpcbench.worker", self.run_file]


def threads_per_rank(point: Point, ctx: LaunchContext) -> int:
    """The point's `threads`, or the node's cores shared out among its ranks."""
    if point.threads is not None:
        return point.threads
    return max(1, ctx.cores_per_node // point.ranks_per_node)


class Launcher(ABC):
    """Starts a point's ranks.

    `tasks` says what a batch job runs (see executors/slurm.py): "rank" - one Slurm task per
    rank, each running the worker (the launcher is Slurm itself); "node" - one task per
    node running `command`; "job" - `command` once, in the batch step, over the allocation.
    """

    name: ClassVar[str]
    tasks: ClassVar[str] = "job"
    requires: ClassVar[tuple[str, ...]] = ()  # Python modules it needs
    program: ClassVar[str | None] = None  # executable it needs on PATH
    frameworks: ClassVar[tuple[str, ...] | None] = None  # None: any framework

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        if cls.frameworks is not None and point.framework not in cls.frameworks:
            yield (
                "launcher",
                f"{cls.name!r} cannot launch framework {point.framework!r}",
                "frameworks " + ", ".join(cls.frameworks),
            )

    @abstractmethod
    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        """The argv that starts all of the point's ranks."""

    def environment(self, point: Point, ctx: LaunchContext) -> dict[str, str]:
        """Variables the launched ranks need; the point's own `environ` is applied after these."""
        threads = str(threads_per_rank(point, ctx))
        return {name: threads for name in THREAD_VARIABLES}


LAUNCHERS: Registry[type[Launcher]] = Registry("launcher", "hpcbench.launchers")
