"""Horovod's horovodrun: ranks over the given hosts (Gloo or MPI controller, Horovod's choice)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcbench.errors import LaunchError
from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.launchers.mpirun import Mpirun
from hpcbench.rank.env import RankEnv, read_layout
from hpcbench.spec import Point


@LAUNCHERS.register
class Horovodrun(Launcher):
    name = "horovodrun"
    requires = ("horovod",)
    program = "horovodrun"
    horovod = True  # Horovod connects its ranks (its Gloo controller, or MPI)
    detect_order = 20

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        if "HOROVOD_RANK" not in env or "HOROVOD_SIZE" not in env or "OMPI_COMM_WORLD_RANK" in env:
            # with its MPI controller horovodrun is mpirun: Open MPI's variables, MPI ranks
            return Mpirun.rank_env(env, host) if "HOROVOD_RANK" in env else None
        # its Gloo controller
        names = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
        return read_layout(env, host, "horovod", names, "HOROVOD_CROSS_RANK", mpi=False)

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        if ctx.local:
            hosts = f"localhost:{point.ranks}"
        elif ctx.hosts:
            hosts = ",".join(f"{h}:{point.ranks_per_node}" for h in ctx.hosts)
        else:
            raise LaunchError("horovodrun across nodes needs the job's host names")
        # The horovodrun of the interpreter the ranks run in (a point's env), if it has one.
        own = Path(ctx.python).parent / "horovodrun"
        program = str(own) if own.exists() else "horovodrun"
        return [program, "-np", str(point.ranks), "-H", hosts, *ctx.worker_argv()]
