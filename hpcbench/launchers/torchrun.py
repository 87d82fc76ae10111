"""torchrun (torch.distributed.run): one agent per node, ranks rendezvous over TCP."""

from __future__ import annotations

from hpcbench.errors import LaunchError
from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.spec import Point


@LAUNCHERS.register
class Torchrun(Launcher):
    name = "torchrun"
    requires = ("torch",)
    frameworks = ("torch",)
    tasks = "node"

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        if ctx.local:
            nodes, per_node = ["--standalone", "--nnodes", "1"], point.ranks
        elif ctx.rendezvous is None:
            raise LaunchError("torchrun across nodes needs the rendezvous host:port of the job's first node")
        else:
            nodes = ["--nnodes", str(point.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", ctx.rendezvous]
            nodes += ["--rdzv-id", point.id]
            per_node = point.ranks_per_node
        return [
            *ctx.container, ctx.python, "-m", "torch.distributed.run",
            *nodes,
            "--nproc-per-node", str(per_node),
            "--max-restarts", "0",
            "-m", "hpcbench.worker", ctx.run_file,
        ]  # fmt: skip
