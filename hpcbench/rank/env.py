"""Who am I? Rank, world size, local rank and node from the launcher's environment.

Ground floor: imports nothing of hpcbench. Launchers are tried most specific first:
torchrun sets RANK/WORLD_SIZE even when it runs inside a Slurm allocation, and Open MPI's
variables win over Slurm's when mpirun runs inside a batch job.
"""

from __future__ import annotations

import os
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
    source: str  # which launcher's variables were read: torchrun | horovod | openmpi | pmi | slurm | single
    mpi: bool  # launched by an MPI-aware launcher: MPI_Init will find its peers

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else default


def slurm_tasks_per_node(spec: str, node_id: int) -> int | None:
    """Tasks on node `node_id` from SLURM_TASKS_PER_NODE, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_id] if 0 <= node_id < len(counts) else None


def detect(env: Mapping[str, str] | None = None, hostname: str | None = None) -> RankEnv:
    """Read the rank layout of this process from `env` (default: os.environ)."""
    env = os.environ if env is None else env
    host = hostname or env.get("SLURMD_NODENAME") or socket.gethostname()

    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_WORLD_SIZE" in env and "RANK" in env):
        rank, size = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
        local, local_size = _int(env, "LOCAL_RANK", 0), _int(env, "LOCAL_WORLD_SIZE", 1)
        node = _int(env, "GROUP_RANK", rank // max(local_size, 1))
        return RankEnv(rank, size, local, local_size, node, host, "torchrun", mpi=False)

    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env and "OMPI_COMM_WORLD_RANK" not in env:
        # horovodrun with its Gloo controller (with MPI, horovodrun is mpirun: Open MPI's below)
        rank, size = _int(env, "HOROVOD_RANK", 0), _int(env, "HOROVOD_SIZE", 1)
        local, local_size = _int(env, "HOROVOD_LOCAL_RANK", 0), _int(env, "HOROVOD_LOCAL_SIZE", 1)
        node = _int(env, "HOROVOD_CROSS_RANK", rank // max(local_size, 1))
        return RankEnv(rank, size, local, local_size, node, host, "horovod", mpi=False)

    if "OMPI_COMM_WORLD_RANK" in env:
        rank, size = _int(env, "OMPI_COMM_WORLD_RANK", 0), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        local, local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        # OMPI_COMM_WORLD_NODE_RANK is a rank within the node, not the node's index; with
        # the block mappings hpcbench launches (ppr:K:node), the node is rank // K.
        return RankEnv(rank, size, local, local_size, rank // max(local_size, 1), host, "openmpi", mpi=True)

    if "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH / Intel MPI (Hydra)
        rank, size = _int(env, "PMI_RANK", 0), _int(env, "PMI_SIZE", 1)
        local, local_size = _int(env, "MPI_LOCALRANKID", 0), _int(env, "MPI_LOCALNRANKS", 1)
        return RankEnv(rank, size, local, local_size, rank // max(local_size, 1), host, "pmi", mpi=True)

    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:  # srun; MPI via PMIx when --mpi=pmix
        rank, size = _int(env, "SLURM_PROCID", 0), _int(env, "SLURM_NTASKS", 1)
        local, node = _int(env, "SLURM_LOCALID", 0), _int(env, "SLURM_NODEID", 0)
        local_size = slurm_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""), node) or 1
        return RankEnv(rank, size, local, local_size, node, host, "slurm", mpi="PMIX_RANK" in env)

    return RankEnv(0, 1, 0, 1, 0, host, "single", mpi=False)
