"""Slurm's srun: one task per rank; MPI through PMIx (the site profile's `srun_args`)."""

from __future__ import annotations

from collections.abc import Mapping

from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.rank.env import RankEnv, int_var, slurm_tasks_per_node
from hpcbench.spec import Point


@LAUNCHERS.register
class Srun(Launcher):
    name = "srun"
    program = "srun"
    tasks = "rank"  # in a batch job, Slurm's own srun starts the worker on every task
    mpi = True  # through PMIx (the site profile's srun_args)
    detect_order = 50  # last: Slurm's variables surround every other launcher in a batch job

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
            return None
        rank, size = int_var(env, "SLURM_PROCID", 0), int_var(env, "SLURM_NTASKS", 1)
        local, node = int_var(env, "SLURM_LOCALID", 0), int_var(env, "SLURM_NODEID", 0)
        local_size = slurm_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""), node) or 1
        return RankEnv(rank, size, local, local_size, node, host, "slurm", mpi="PMIX_RANK" in env)

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        # Outside a batch job (local executor on a login node), srun allocates and runs.
        return [
            "srun", "--nodes", str(point.nodes), "--ntasks-per-node", str(point.ranks_per_node),
            *ctx.srun_args, *ctx.worker_argv(),
        ]  # fmt: skip
