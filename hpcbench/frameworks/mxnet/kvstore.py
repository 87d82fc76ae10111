"""The parameter-server roles of the MXNet adapter's `dist_sync` / `dist_async` backends.

MXNet's parameter server is ps-lite. Every launched rank is a worker that runs the timed
loop and writes its rows. Extra processes play the other roles: rank 0 starts the scheduler
on a free port and broadcasts its address over MPI (127.0.0.1 on one host; else its address
on the route to the other nodes, or `HPCBENCH_MASTER_ADDR`; ps-lite's `DMLC_INTERFACE` picks
the nodes' own interface); `extra: {servers: N}` (default 1) servers are started by the
first N ranks in the order (local rank, node): local rank 0 of every node first, so servers
spread over nodes. They are `python -c "import mxnet"` with `DMLC_ROLE` set (importing
MXNet runs that role), die with the rank that started them (PR_SET_PDEATHSIG), abort the
job when one dies early (`Roles`' guard thread), and leave on their own when the workers
close the store at teardown. ps-lite numbers workers in its own order (it cannot be told
hpcbench's), so the adapter records the kvstore rank of every hpcbench rank.

`kvstore='horovod'` is refused (`create_kvstore`): MXNet 1.9 returns a local store for it
(and for any unknown name) without an error, and every worker would train alone. For the
same reason a created store is checked to be distributed and to count every worker.

This module imports MXNet only inside `create_kvstore`: the adapter imports it where MXNet
is not installed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hpcbench.errors import HpcbenchError
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.rank.net import die_with_parent, free_port
from hpcbench.spec import Point

KVSTORES = ("dist_sync", "dist_async")
DEFAULT_SERVERS = 1
ROLE_STOP_S = 20.0  # servers and scheduler leave by themselves once workers close the store


class KVStoreError(HpcbenchError):
    """A kvstore that would not do what the point asks (local store, missing workers)."""


def create_kvstore(kind: str, workers: int) -> Any:
    """`mx.kv.create(kind)`, refusing what would silently train each worker alone."""
    import mxnet as mx

    if kind == "horovod":
        raise KVStoreError(
            "kvstore 'horovod' is refused: MXNet 1.9 returns a local store for it without an error, "
            "so every worker would train alone; use backend 'horovod' (horovod.mxnet) instead"
        )
    if kind not in KVSTORES:
        raise KVStoreError(f"kvstore {kind!r} is not a distributed kvstore hpcbench runs ({', '.join(KVSTORES)})")
    kv = mx.kv.create(kind)
    if kv.type != kind or kv.num_workers != workers:
        raise KVStoreError(
            f"mx.kv.create({kind!r}) gave a {kv.type!r} store with {kv.num_workers} workers, not {workers}: "
            "the workers would not exchange gradients (is DMLC_ROLE / DMLC_NUM_WORKER set?)"
        )
    return kv


def _address_towards(peer: str) -> str:
    """This host's address on the route to `peer` (not what its own name resolves to, which
    on many systems is a loopback address such as 127.0.1.1). No packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(peer), 9))
        address: str = s.getsockname()[0]
        return address


class Roles:
    """Scheduler / server processes started by this rank, and a guard thread that ends the
    job if one of them dies early or the store is not up in time (ps-lite would wait forever)."""

    def __init__(self, comm: Comm, timeout_s: float) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._comm = comm
        self._deadline = time.monotonic() + timeout_s
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._guard, name="hpcbench-mxnet-roles", daemon=True)

    def start(self, role: str, env: dict[str, str]) -> None:
        # `-c` puts the current folder first on sys.path: drop it, so that no `mxnet` there
        # (e.g. this very package, run from hpcbench/frameworks) shadows the real one.
        code = "import sys; sys.path[:] = [p for p in sys.path if p]; import mxnet"
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        self.procs.append((role, proc))

    def launch(self, places: list[tuple[int, int, str]], servers: int, rank: int) -> None:
        """This rank's roles (after `rendezvous`): the scheduler on rank 0, a server on each of
        the first `servers` ranks in the order (local rank, node); then the guard."""
        child = dict(os.environ)
        # The servers unpickle the workers' optimizer (`ps.py`): they must import hpcbench.
        child["PYTHONPATH"] = os.pathsep.join(p for p in (child.get("PYTHONPATH"), _hpcbench_root()) if p)
        if rank == 0:
            self.start("scheduler", {**child, "DMLC_ROLE": "scheduler"})
        order = sorted(range(len(places)), key=lambda r: (places[r][0], places[r][1], r))
        if rank in order[:servers]:
            self.start("server", {**child, "DMLC_ROLE": "server"})
        self.guard()

    def guard(self) -> None:
        self._thread.start()

    def ready(self) -> None:
        self._ready.set()

    def _guard(self) -> None:
        while not self._stopping.wait(0.5):
            for role, proc in self.procs:
                code = proc.poll()
                if code is not None and not self._stopping.is_set():
                    self._fail(f"the kvstore {role} (pid {proc.pid}) exited with code {code} during training")
            if not self._ready.is_set() and time.monotonic() > self._deadline:
                self._fail("the kvstore did not come up in time (scheduler, servers and all workers must connect)")

    def _fail(self, why: str) -> None:
        print(f"hpcbench.mxnet: rank {self._comm.rank}: {why}", file=sys.stderr, flush=True)
        self._comm.abort(1)

    def leaving(self) -> None:
        """From now on the roles may leave (the workers are about to close the store): the
        guard stops taking their exit for a failure."""
        self._stopping.set()

    def stop(self) -> None:
        """Wait for the roles to leave (after the store is closed); kill one that does not."""
        self._stopping.set()
        for role, proc in self.procs:
            try:
                proc.wait(timeout=ROLE_STOP_S)
            except subprocess.TimeoutExpired:
                print(f"hpcbench.mxnet: the kvstore {role} (pid {proc.pid}) did not leave; killed", file=sys.stderr)
                proc.kill()
                proc.wait()
        self.procs.clear()


def _hpcbench_root() -> str:
    """The folder that holds the `hpcbench` package (wherever this module sits in it)."""
    import hpcbench

    return str(Path(hpcbench.__file__).resolve().parent.parent)


def servers_for(point: Point, renv: RankEnv) -> int:
    """The point's number of servers (`extra.servers`), checked against the ranks."""
    servers = int(dict(point.extra).get("servers", DEFAULT_SERVERS))
    if not 1 <= servers <= renv.size:
        raise HpcbenchError(f"mxnet: servers must be 1 to {renv.size}, not {servers}")
    return servers


def rendezvous(servers: int, renv: RankEnv, comm: Comm) -> list[tuple[int, int, str]]:
    """Agree on the scheduler's address (rank 0 picks it) and set this worker's ps-lite
    variables. Returns every rank's (local rank, node, host name)."""
    places = comm.allgather((renv.local_rank, renv.node_rank, renv.hostname))
    root = None
    if comm.rank == 0:
        others = sorted({host for _, _, host in places} - {renv.hostname})
        if os.environ.get("HPCBENCH_MASTER_ADDR"):
            host = os.environ["HPCBENCH_MASTER_ADDR"]
        elif not others:
            host = "127.0.0.1"
        else:
            host = _address_towards(others[0])
        root = (host, free_port())
    host, port = comm.bcast(root)
    env = {
        "DMLC_PS_ROOT_URI": str(host),
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(renv.size),
    }
    os.environ.update(env)
    os.environ["DMLC_ROLE"] = "worker"
    return places
