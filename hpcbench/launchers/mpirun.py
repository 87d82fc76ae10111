"""mpirun: one process per rank; the worker finds its peers through MPI.

The arguments are Open MPI's; the rank variables read are Open MPI's, or those of Hydra
(MPICH, Intel MPI), whose `mpirun` sets PMI_RANK/PMI_SIZE.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.rank.env import RankEnv, read_layout
from hpcbench.spec import Point


@LAUNCHERS.register
class Mpirun(Launcher):
    name = "mpirun"
    program = "mpirun"
    mpi = True
    detect_order = 30  # Open MPI's variables win over Slurm's when mpirun runs in a batch job

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        if "OMPI_COMM_WORLD_RANK" in env:
            # OMPI_COMM_WORLD_NODE_RANK is a rank within the node, not the node's index; with
            # the block mappings hpcbench launches (ppr:K:node), the node is rank // K.
            names = (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            )
            return read_layout(env, host, "openmpi", names, mpi=True)
        if "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH / Intel MPI (Hydra)
            names = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
            return read_layout(env, host, "pmi", names, mpi=True)
        return None

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        argv = ["mpirun", "-n", str(point.ranks)]
        if ctx.local:
            # All ranks on this host, however many cores it has; unbound so that threads
            # of oversubscribed ranks are not pinned onto one core.
            argv += ["--oversubscribe", "--bind-to", "none"]
        else:
            argv += ["--map-by", f"ppr:{point.ranks_per_node}:node", "--bind-to", "none"]
        argv += ctx.mpirun_args
        for name in sorted({*self.environment(point, ctx), *dict(point.environ), *ctx.forward_env}):
            argv += ["-x", name]  # forwarded to ranks on other nodes too
        return argv + ctx.worker_argv()

    def environment(self, point: Point, ctx: LaunchContext) -> dict[str, str]:
        env = super().environment(point, ctx)
        # mpirun refuses to run as root without both (containers and CI run as root).
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        return env
