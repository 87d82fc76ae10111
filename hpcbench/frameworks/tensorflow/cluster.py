"""Addresses of a TensorFlow job's servers, shared by the backends that build a cluster.

Every rank of the `multiworker` and `ps` backends runs a gRPC server (the parameter servers
are more); their addresses are gathered over the bookkeeping communicator (MPI), each rank
naming its own host and a port it found free.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from hpcbench.rank.collectives import Comm
from hpcbench.rank.net import free_port


def cluster_hosts(hostnames: Sequence[str]) -> list[str]:
    """Addresses for the ranks' servers: 'localhost' when every rank is on this host, else each
    rank's own host name (`socket.gethostname()`, as gathered: Slurm node names need not resolve)."""
    if len(set(hostnames)) <= 1:
        return ["localhost"] * len(hostnames)
    return list(hostnames)


def worker_addresses(comm: Comm) -> list[str]:
    """'host:port' of every rank's server, in rank order (the port picked free on each rank)."""
    gathered = comm.allgather((socket.gethostname(), free_port()))
    hosts = cluster_hosts([h for h, _ in gathered])
    return [f"{host}:{port}" for host, (_, port) in zip(hosts, gathered, strict=True)]
