"""Horovod's horovodrun: ranks over the given hosts (Gloo or MPI controller, Horovod's choice)."""

from __future__ import annotations

from pathlib import Path

from hpcbench.errors import LaunchError
from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.spec import Point


@LAUNCHERS.register
class Horovodrun(Launcher):
    name = "horovodrun"
    requires = ("horovod",)
    program = "horovodrun"

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
