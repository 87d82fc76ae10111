"""Open MPI's mpirun: one process per rank; the worker finds its peers through MPI."""

from __future__ import annotations

from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.spec import Point


@LAUNCHERS.register
class Mpirun(Launcher):
    name = "mpirun"
    program = "mpirun"

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
