"""A toy launcher that lives outside hpcbench: a plugin module named in $HPCBENCH_PLUGINS.

It starts a point's ranks as plain child processes of one Python parent on this host, with
variables of its own (TOY_RANK, TOY_SIZE) plus torch's env:// rendezvous variables, and
reads them back in `rank_env`. Nothing in hpcbench names it: that a sweep runs through it
shows that a launcher is one module.

    python -m tests.plugins.toy_launcher N WORKER_ARGV...   (what `command` returns)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from hpcbench.errors import LaunchError
from hpcbench.launchers import LAUNCHERS, LaunchContext, Launcher
from hpcbench.rank.env import RankEnv
from hpcbench.rank.net import free_port
from hpcbench.spec import Point


@LAUNCHERS.register
class ToyLauncher(Launcher):
    name = "toy"
    detect_order = 5

    def command(self, point: Point, ctx: LaunchContext) -> list[str]:
        if not ctx.local:
            raise LaunchError("the toy launcher starts ranks on this host only")
        return [ctx.python, "-m", __name__, str(point.ranks), *ctx.worker_argv()]

    @classmethod
    def rank_env(cls, env: Mapping[str, str], host: str) -> RankEnv | None:
        if "TOY_RANK" not in env:
            return None
        rank, size = int(env["TOY_RANK"]), int(env["TOY_SIZE"])
        return RankEnv(rank, size, rank, size, 0, host, "toy", mpi=False)


def spawn(ranks: int, argv: list[str]) -> int:
    """Start `ranks` copies of `argv`, wait for all; the first non-zero exit status, else 0."""
    port = str(free_port())
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "TOY_RANK": str(rank), "TOY_SIZE": str(ranks)}
        env.update(RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen(argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(spawn(int(sys.argv[1]), sys.argv[2:]))
