"""Who am I? The `RankEnv` of a rank, and helpers to read it from a launcher's variables.

Each launcher reads its own variables (`Launcher.rank_env` in hpcbench.launchers); the
detection that asks them in turn is `hpcbench.launchers.detect`. Imports nothing of hpcbench.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankEnv:
    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    hostname: str
    source: str  # whose variables were read: torchrun | horovod | openmpi | pmi | slurm | single | a plugin's
    mpi: bool  # launched by an MPI-aware launcher: MPI_Init will find its peers

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def int_var(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else default


def read_layout(
    env: Mapping[str, str], host: str, source: str, names: tuple[str, str, str, str], node: str = "", *, mpi: bool
) -> RankEnv:
    """The rank's place from a launcher's variables `names` (rank, size, local rank, local
    size) and `node` (the node's index; where unset, rank // local size: block placement)."""
    rank, size = int_var(env, names[0], 0), int_var(env, names[1], 1)
    local, local_size = int_var(env, names[2], 0), int_var(env, names[3], 1)
    node_rank = int_var(env, node, rank // max(local_size, 1)) if node else rank // max(local_size, 1)
    return RankEnv(rank, size, local, local_size, node_rank, host, source, mpi=mpi)


def slurm_tasks_per_node(spec: str, node_id: int) -> int | None:
    """Tasks on node `node_id` from SLURM_TASKS_PER_NODE, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_id] if 0 <= node_id < len(counts) else None


def single(hostname: str | None = None) -> RankEnv:
    """A process no launcher started: one rank alone."""
    return RankEnv(0, 1, 0, 1, 0, hostname or socket.gethostname(), "single", mpi=False)


def host_of(env: Mapping[str, str], hostname: str | None = None) -> str:
    """The node name a rank reports: Slurm's name for it where Slurm started it."""
    return hostname or env.get("SLURMD_NODENAME") or socket.gethostname()
