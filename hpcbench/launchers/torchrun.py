"""torchrun (torch.distributed.run): one agent per node, ranks rendezvous over TCP."""

from __future__ import annotations

from collections.abc import Mapping

from hpcbench.errors import LaunchError
from hpcbench.launchers.base import LAUNCHERS, LaunchContext, Launcher
from hpcbench.rank.env import RankEnv, read_layout
from hpcbench.spec import Point


@LAUNCHERS.register
class Torchrun(Launcher):
    name = "torchrun"
    requires = ("torch",)
    frameworks = ("torch",)
    tasks = "node"
    detect_order = 10  # torchrun sets RANK/WORLD_SIZE even inside a Slurm allocation

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        if "TORCHELASTIC_RUN_ID" not in env and not ("LOCAL_WORLD_SIZE" in env and "RANK" in env):
            return None
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        return read_layout(env, host, "torchrun", names, "GROUP_RANK", mpi=False)

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
