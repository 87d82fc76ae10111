"""The launcher contract: a point and a context in, an argv list and environment out."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from hpcbench.rank.env import RankEnv, host_of, single
from hpcbench.registry import Registry
from hpcbench.spec import Point

Tasks = Literal["rank", "node", "job"]

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
    """Starts a point's ranks, and says what it is.

    `tasks` says what a batch job runs (see executors/slurm/): "rank" - one Slurm task per
    rank, each running the worker (the launcher is Slurm itself); "node" - one task per
    node running `command`; "job" - `command` once, in the batch step, over the allocation.
    `mpi` says whether its ranks find their peers through MPI_Init; `horovod`, whether it is
    Horovod's own launcher (Horovod connects its ranks, with or without MPI): planning checks
    what a framework's backend needs of its launcher against these two
    (`Framework.launcher_needs`). `rank_env` reads the variables it gives each rank;
    `detect_order` places it among the others when a process does not know who started it
    (lower first: more specific variables before general ones, e.g. torchrun's before
    Slurm's, which are set around it in a batch job).
    """

    name: ClassVar[str]
    tasks: ClassVar[Tasks] = "job"
    mpi: ClassVar[bool] = False
    horovod: ClassVar[bool] = False  # Horovod's own launcher: Horovod connects its ranks
    detect_order: ClassVar[int] = 100
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

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        """This process's rank layout if this launcher started it, else None."""
        return None

    def environment(self, point: Point, ctx: LaunchContext) -> dict[str, str]:
        """Variables the launched ranks need; the point's own `environ` is applied after these."""
        threads = str(threads_per_rank(point, ctx))
        return {name: threads for name in THREAD_VARIABLES}


LAUNCHERS: Registry[type[Launcher]] = Registry("launcher", "hpcbench.launchers")


def detect(env: Mapping[str, str] | None = None, hostname: str | None = None, launcher: str | None = None) -> RankEnv:
    """This process's rank layout: asked of `launcher` first (a worker knows its point's),
    then of every registered launcher in `detect_order`; one rank alone if none claims it."""
    env = os.environ if env is None else env
    host = host_of(env, hostname)
    ordered = sorted(LAUNCHERS, key=lambda cls: (cls.detect_order, cls.name))
    first = [LAUNCHERS.get(launcher)] if launcher is not None and launcher in LAUNCHERS.names() else []
    for cls in [*first, *ordered]:
        renv = cls.rank_env(env, host)
        if renv is not None:
            return renv
    return single(host)
