"""Slurm's srun: one task per rank; MPI through PMIx (the site profile's `srun_args`)."""

from __future__ import annotations

from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.spec import Point


@LAUNCHERS.register
class Srun(Launcher):
    name = "srun"
    program = "srun"
    tasks = "rank"  # in a batch job, Slurm's own srun starts the worker on every task

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        # Outside a batch job (local executor on a login node), srun allocates and runs.
        return [
            "srun", "--nodes", str(point.nodes), "--ntasks-per-node", str(point.ranks_per_node),
            *ctx.srun_args, *ctx.worker_argv(),
        ]  # fmt: skip
