"""The parameter-server backend of the TensorFlow adapter (`backend: ps`; seed 003).

Architecture. Every launched rank is a worker running the timed loop and writing its rows.
The parameter servers are extra processes: `extra.servers` (default 1) TensorFlow server
tasks (`tf.distribute.Server(...).join()`, `python -m hpcbench.frameworks.tensorflow.ps_server`),
server k on node k mod nodes, started by the lowest rank of that node at `setup` and ended
at `teardown`, or by the kernel when that rank dies (PR_SET_PDEATHSIG). Workers connect
with `tf.config.experimental_connect_to_cluster` (each to the servers only: its own cluster
view holds itself and the `ps` job) and keep the model's trainable variables on the
servers, spread by size (largest first, each to the least loaded server). The variables
live in the servers' resource managers under fixed shared names, so every worker's handle
names the same variable: one copy of the weights, on the servers.

A step on a worker: forward and backward on its local copy of the weights; push; pull:

- push: every gradient tensor is sent to its server and applied there by the optimizer's
  own kernel (`ResourceApplyGradientDescent` / `ResourceApplyKerasMomentum` /
  `ResourceApplyAdam`, optimizer state on the servers too): one `push` message per
  variable, from when its gradient is ready until the server has applied it;
- pull: every variable is read from its server into the worker: one `pull` message per
  variable, then copied into the local model (that copy is the `update` phase: the
  optimizer step itself runs on the servers, inside the push messages).

Modes (`extra.sync`):

- asynchronous (default): each push is applied as it arrives; workers never wait for each
  other, so their copies differ (each pulls whatever version the servers hold). A version
  counter on server 0 counts applied pushes; staleness (pushes by others between a
  worker's pull and its next push) is summarised in the log at the end. What is checked
  instead of equal weights: every worker's every push reached the servers (the counter
  equals ranks x iterations, printed by rank 0 at teardown) and each worker's copy, pulled
  from the shared weights, learnt the task.
- synchronous: pushes add `gradient / workers` into accumulators on the servers; after a
  barrier (the bookkeeping communicator: MPI) rank 0 applies the accumulated mean gradient
  with the optimizer kernel and clears the accumulators (SyncReplicasOptimizer's scheme);
  after a second barrier every worker pulls the same version, so all copies are equal. The
  barriers and rank 0's apply fall in the comm phase.

Timing: as in the all-reduce backends, each compiled function returns `tf.timestamp`s
taken inside the graph at message begin (gradient ready / pull issued) and end (applied on
the server / value arrived on the worker).
"""

from __future__ import annotations

import ctypes
import json
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.trace.recorder import Phase, Recorder

SERVER_MODULE = "hpcbench.frameworks.tensorflow.ps_server"
START_TIMEOUT_S = 120.0
CONTAINER = "hpcbench"
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the server process before exec: SIGTERM when the rank that started it dies."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise HpcbenchError(f"parameter server on port {port} exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection(("localhost", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise HpcbenchError(f"parameter server on port {port} not listening after {timeout_s:g} s") from None
            time.sleep(0.05)


def spread(sizes: list[int], servers: int) -> list[int]:
    """Server of each variable: largest first, each to the server holding fewest elements."""
    load = [0] * servers
    where = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        k = min(range(servers), key=lambda s: (load[s], s))
        where[i] = k
        load[k] += sizes[i]
    return where


class ParameterServers:
    def __init__(self, comm: Comm, renv: RankEnv, servers: int, sync: bool, threads: int) -> None:
        import tensorflow as tf

        from hpcbench.frameworks.tensorflow.adapter import cluster_hosts
        from hpcbench.rank.net import free_port

        self.comm = comm
        self.servers = servers
        self.sync = sync
        self.rank = comm.rank
        self.size = comm.size
        layout = comm.allgather((socket.gethostname(), renv.node_rank))
        nodes = sorted({node for _, node in layout})
        first_rank = {node: min(r for r, (_, n) in enumerate(layout) if n == node) for node in nodes}
        mine = [k for k in range(servers) if first_rank[nodes[k % len(nodes)]] == self.rank]
        ports = comm.allgather((free_port(), {k: free_port() for k in mine}))
        hosts = cluster_hosts([host for host, _ in layout])
        workers = [f"{hosts[r]}:{port}" for r, (port, _) in enumerate(ports)]
        ps = [""] * servers
        for r, (_, theirs) in enumerate(ports):
            for k, port in theirs.items():
                ps[k] = f"{hosts[r]}:{port}"
        self.cluster = {"worker": workers, "ps": ps}
        self._procs: list[subprocess.Popen[bytes]] = []
        for k in mine:
            argv = [sys.executable, "-m", SERVER_MODULE, json.dumps(self.cluster), str(k), str(threads)]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            self._procs.append(proc)
        for k, proc in zip(mine, self._procs, strict=True):
            _wait_listening(proc, ports[self.rank][1][k], START_TIMEOUT_S)
        comm.barrier()  # every server is up
        # This worker's view: itself and the servers. (With every worker in every view,
        # each worker's runtime would also connect to all the others, which it never needs.)
        view = tf.train.ClusterSpec({"worker": {self.rank: workers[self.rank]}, "ps": ps})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            view, task_type="worker", task_id=self.rank, rpc_layer="grpc"
        )
        tf.config.experimental_connect_to_cluster(
            resolver, job_name="worker", task_index=self.rank, make_master_device_default=False
        )
        self.local = f"/job:worker/replica:0/task:{self.rank}/device:CPU:0"
        self._staleness: np.ndarray = np.zeros(0, dtype=np.int64)
        self._steps = 0
        self._version = 0  # server version this worker's copy was pulled at

    def describe(self) -> dict[str, str]:
        return {
            "ps_servers": str(self.servers),
            "ps_mode": "sync" if self.sync else "async",
            "ps_cluster": json.dumps(self.cluster),
        }

    # ----------------------------------------------------------------------------------

    def attach(self, model: Any, loss_fn: Any, x_spec: Any, y_spec: Any, point: Point, capacity: int) -> None:
        """Put `model`'s trainable variables on the servers and compile the step's functions."""
        import tensorflow as tf

        from hpcbench.frameworks.tensorflow.adapter import Messages

        variables = list(model.trainable_variables)
        self.variables = variables
        sizes = [int(np.prod(v.shape)) for v in variables]
        where = spread(sizes, self.servers)
        devices = [f"/job:ps/replica:0/task:{k}/device:CPU:0" for k in where]
        tag = f"{point.id}"

        def handle(name: str, shape: Any, device: str, dtype: Any = tf.float32) -> Any:
            with tf.device(device):
                return tf.raw_ops.VarHandleOp(
                    dtype=dtype, shape=shape, container=CONTAINER, shared_name=f"{tag}/{name}"
                )

        optimizer = point.optimizer
        slots = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v")}[optimizer]
        names = [v.path for v in variables]
        self.handles = [handle(n, v.shape, d) for n, v, d in zip(names, variables, devices, strict=True)]
        placed = list(zip(names, variables, devices, strict=True))
        self.slots = [[handle(f"{n}/{s}", v.shape, d) for s in slots] for n, v, d in placed]
        self.accumulators = [handle(f"{n}/sum", v.shape, d) for n, v, d in placed] if self.sync else []
        ps0 = "/job:ps/replica:0/task:0/device:CPU:0"
        self.counter = handle("version", [], ps0, tf.int64)
        if self.rank == 0:  # rank 0's initial weights become the servers'
            for i, v in enumerate(variables):
                with tf.device(devices[i]):
                    tf.raw_ops.AssignVariableOp(resource=self.handles[i], value=v.value)
                    for h in (*self.slots[i], *(self.accumulators[i : i + 1] if self.sync else ())):
                        tf.raw_ops.AssignVariableOp(resource=h, value=tf.zeros(v.shape))
            with tf.device(ps0):
                tf.raw_ops.AssignVariableOp(resource=self.counter, value=tf.constant(0, tf.int64))
        self.comm.barrier()  # the servers hold the initial weights

        lr = float(point.lr)
        n_workers = float(self.size)
        order = list(range(len(variables)))[::-1]  # the last layer's gradient is ready first
        local = self.local
        handles, slot_handles, accumulators, counter = self.handles, self.slots, self.accumulators, self.counter

        def apply(i: int, grad: Any, version: Any) -> Any:
            """The optimizer's kernel on server `where[i]`, updating variable i with `grad`."""
            var, s = handles[i], slot_handles[i]
            if optimizer == "sgd":
                return tf.raw_ops.ResourceApplyGradientDescent(var=var, alpha=lr, delta=grad)
            if optimizer == "momentum":
                return tf.raw_ops.ResourceApplyKerasMomentum(var=var, accum=s[0], lr=lr, grad=grad, momentum=0.9)
            t = tf.cast(version, tf.float32)
            return tf.raw_ops.ResourceApplyAdam(
                var=var, m=s[0], v=s[1], beta1_power=tf.pow(0.9, t), beta2_power=tf.pow(0.999, t), lr=lr,
                beta1=0.9, beta2=0.999, epsilon=1e-7, grad=grad,
            )  # fmt: skip

        sync = self.sync

        def push(x: Any, y: Any) -> tuple[Any, Any, Any]:
            with tf.device(local):
                with tf.GradientTape() as tape:
                    loss = loss_fn(x, y, model(x, training=True))
                with tf.control_dependencies([loss]):
                    t_forward = tf.timestamp()
                with tf.control_dependencies([t_forward]):  # backward starts after the stamp
                    seed = tf.ones_like(loss)
                grads = tape.gradient(loss, variables, output_gradients=seed)
                with tf.control_dependencies(grads):
                    t_backward = tf.timestamp()
            version = tf.constant(0, tf.int64)
            if not sync:
                with tf.device(ps0):  # one applied push more
                    tf.raw_ops.AssignAddVariableOp(resource=counter, value=tf.constant(1, tf.int64))
                    version = tf.raw_ops.ReadVariableOp(resource=counter, dtype=tf.int64)
            begins: list[Any] = [None] * len(order)
            ends: list[Any] = [None] * len(order)
            for i in order:
                with tf.device(local):
                    with tf.control_dependencies([grads[i]]):
                        t0 = tf.timestamp()
                    with tf.control_dependencies([t0]):
                        grad = tf.identity(grads[i])
                with tf.device(devices[i]):
                    if sync:
                        done = tf.raw_ops.AssignAddVariableOp(resource=accumulators[i], value=grad / n_workers)
                    else:
                        done = apply(i, grad, version)
                with tf.device(local), tf.control_dependencies([done]):
                    t1 = tf.timestamp()
                begins[i], ends[i] = t0, t1
            return loss, tf.stack([t_forward, t_backward, *begins, *ends]), version

        def apply_sum() -> None:
            """Synchronous mode, rank 0: one optimizer step with the accumulated mean gradient."""
            with tf.device(ps0):
                tf.raw_ops.AssignAddVariableOp(resource=counter, value=tf.constant(1, tf.int64))
                version = tf.raw_ops.ReadVariableOp(resource=counter, dtype=tf.int64)
            for i in range(len(variables)):
                with tf.device(devices[i]):
                    total = tf.raw_ops.ReadVariableOp(resource=accumulators[i], dtype=tf.float32)
                    applied = apply(i, total, version)
                    with tf.control_dependencies([applied]):
                        tf.raw_ops.AssignVariableOp(resource=accumulators[i], value=tf.zeros_like(total))

        def pull() -> tuple[Any, Any]:
            with tf.device(ps0):
                version = tf.raw_ops.ReadVariableOp(resource=counter, dtype=tf.int64)
            begins, ends = [], []
            for i, v in enumerate(variables):
                with tf.device(local):
                    t0 = tf.timestamp()
                with tf.device(devices[i]), tf.control_dependencies([t0]):
                    value = tf.raw_ops.ReadVariableOp(resource=handles[i], dtype=tf.float32)
                with tf.device(local):
                    value = tf.ensure_shape(tf.identity(value), v.shape)  # arrived on this worker
                    with tf.control_dependencies([value]):
                        t1 = tf.timestamp()
                    v.assign(value)
                begins.append(t0)
                ends.append(t1)
            return tf.stack([*begins, *ends]), version

        self._push = tf.function(push, input_signature=[x_spec, y_spec])
        self._apply_sum = tf.function(apply_sum)
        self._pull = tf.function(pull)
        n = len(variables)
        nbytes = [4 * s for s in sizes]
        self.messages = Messages(op=["push"] * n + ["pull"] * n, name=names * 2, nbytes=nbytes * 2)
        self._stamps = np.zeros(2 + 4 * n, dtype=np.float64)  # reused every step
        self._staleness = np.zeros(capacity, dtype=np.int64)
        _, self._version = self._pull_now()  # every worker starts from the same weights

    def _pull_now(self) -> tuple[np.ndarray, int]:
        stamps, version = self._pull()
        return stamps.numpy(), int(version.numpy())

    def step(self, rec: Recorder, x: Any, y: Any) -> Any:
        loss, push_stamps, version = self._push(x, y)
        if self.sync:
            self.comm.barrier()  # every worker's gradient is on the servers
            if self.rank == 0:
                self._apply_sum()
            self.comm.barrier()  # the new version is there for everyone
        pull_stamps, pulled = self._pull_now()
        rec.mark(Phase.UPDATE)
        # Bookkeeping after the step's last mark: stamps into one array, staleness.
        n = len(self.variables)
        s = self._stamps
        p = push_stamps.numpy()
        s[:2] = p[:2]
        s[2 : 2 + n], s[2 + 2 * n : 2 + 3 * n] = p[2 : 2 + n], p[2 + n :]
        s[2 + n : 2 + 2 * n], s[2 + 3 * n :] = pull_stamps[:n], pull_stamps[n:]
        self.messages.record(rec, s)
        if not self.sync and self._steps < len(self._staleness):
            self._staleness[self._steps] = int(version.numpy()) - 1 - self._version
        self._steps += 1
        self._version = pulled
        return loss

    def close(self) -> None:
        """After the workers' last barrier: report, then end this rank's servers."""
        try:
            if self.rank == 0:
                import tensorflow as tf

                with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
                    version = int(tf.raw_ops.ReadVariableOp(resource=self.counter, dtype=tf.int64).numpy())
                kind = "optimizer steps" if self.sync else "pushes"
                print(f"hpcbench.tensorflow.ps: server version {version} ({kind} applied)", flush=True)
            if not self.sync and self._steps:
                st = self._staleness[: min(self._steps, len(self._staleness))]
                print(
                    f"hpcbench.tensorflow.ps: rank {self.rank} staleness mean {st.mean():.2f} max {st.max()}",
                    flush=True,
                )
        finally:
            self.comm.barrier()  # nobody talks to a server any more
            for proc in self._procs:
                proc.terminate()
            for proc in self._procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
