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

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import MOMENTUM
from hpcbench.frameworks.tensorflow.cluster import cluster_hosts
from hpcbench.frameworks.tensorflow.stamps import Messages, stamp_after, stamped_gradients
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.rank.net import die_with_parent
from hpcbench.spec import Point
from hpcbench.trace.recorder import Phase, Recorder

SERVER_MODULE = "hpcbench.frameworks.tensorflow.ps_server"
PS0 = "/job:ps/replica:0/task:0/device:CPU:0"  # the server holding the version counter
START_TIMEOUT_S = 120.0
CONTAINER = "hpcbench"


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
    """The `ps` backend on one worker: starts this rank's servers and connects to all of
    them (`__init__`, at setup), puts the model's variables on them (`attach`, at build),
    then pushes and pulls every step (`step`) and ends its servers (`close`)."""

    def __init__(self, comm: Comm, renv: RankEnv, servers: int, sync: bool, threads: int) -> None:
        import tensorflow as tf

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
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
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

    def attach(
        self, model: Any, forward: Callable[[Any, Any], Any], x_spec: Any, y_spec: Any, point: Point, capacity: int
    ) -> None:
        """Put `model`'s trainable variables on the servers and compile the step's functions
        (`forward(x, y)`: the loss of `model`)."""
        import tensorflow as tf

        variables = list(model.trainable_variables)
        self.variables = variables
        sizes = [int(np.prod(v.shape)) for v in variables]
        names = [v.path for v in variables]
        shared = SharedVariables.create(variables, names, spread(sizes, self.servers), point, self.sync)
        self.shared = shared
        if self.rank == 0:  # rank 0's initial weights become the servers'
            shared.initialise(variables)
        self.comm.barrier()  # the servers hold the initial weights

        push = _push_function(forward, variables, shared, self.local, self.sync, float(self.size))
        self._push = tf.function(push, input_signature=[x_spec, y_spec])
        self._apply_sum = tf.function(shared.apply_sum)
        self._pull = tf.function(_pull_function(variables, shared, self.local))
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

                with tf.device(PS0):
                    version = int(tf.raw_ops.ReadVariableOp(resource=self.shared.counter, dtype=tf.int64).numpy())
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


class SharedVariables:
    """The variables on the servers, by handle: each model variable, its optimizer slots and
    (synchronous mode) its gradient accumulator on the server `spread` gave it; the version
    counter on server 0. They live in the servers' resource managers under fixed shared
    names (`CONTAINER`, the point's id), so every worker's handle names the same variable."""

    def __init__(self, devices: list[str], optimizer: str, lr: float) -> None:
        self.devices = devices
        self.optimizer = optimizer
        self.lr = lr
        self.handles: list[Any] = []
        self.slots: list[list[Any]] = []
        self.accumulators: list[Any] = []
        self.counter: Any = None

    @classmethod
    def create(
        cls, variables: list[Any], names: list[str], where: list[int], point: Point, sync: bool
    ) -> SharedVariables:
        import tensorflow as tf

        devices = [f"/job:ps/replica:0/task:{k}/device:CPU:0" for k in where]
        shared = cls(devices, point.optimizer, float(point.lr))
        tag = f"{point.id}"

        def handle(name: str, shape: Any, device: str, dtype: Any = tf.float32) -> Any:
            with tf.device(device):
                return tf.raw_ops.VarHandleOp(
                    dtype=dtype, shape=shape, container=CONTAINER, shared_name=f"{tag}/{name}"
                )

        slots = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v")}[point.optimizer]
        shared.handles = [handle(n, v.shape, d) for n, v, d in zip(names, variables, devices, strict=True)]
        placed = list(zip(names, variables, devices, strict=True))
        shared.slots = [[handle(f"{n}/{s}", v.shape, d) for s in slots] for n, v, d in placed]
        shared.accumulators = [handle(f"{n}/sum", v.shape, d) for n, v, d in placed] if sync else []
        shared.counter = handle("version", [], PS0, tf.int64)
        return shared

    def initialise(self, variables: list[Any]) -> None:
        """Rank 0: the servers' variables take this worker's values; slots, sums, counter: zeros."""
        import tensorflow as tf

        for i, v in enumerate(variables):
            with tf.device(self.devices[i]):
                tf.raw_ops.AssignVariableOp(resource=self.handles[i], value=v.value)
                for h in (*self.slots[i], *self.accumulators[i : i + 1]):
                    tf.raw_ops.AssignVariableOp(resource=h, value=tf.zeros(v.shape))
        with tf.device(PS0):
            tf.raw_ops.AssignVariableOp(resource=self.counter, value=tf.constant(0, tf.int64))

    def apply(self, i: int, grad: Any, version: Any) -> Any:
        """Graph code: the optimizer's kernel on variable i's server, updating it with `grad`."""
        import tensorflow as tf

        var, s, lr = self.handles[i], self.slots[i], self.lr
        if self.optimizer == "sgd":
            return tf.raw_ops.ResourceApplyGradientDescent(var=var, alpha=lr, delta=grad)
        if self.optimizer == "momentum":
            return tf.raw_ops.ResourceApplyKerasMomentum(var=var, accum=s[0], lr=lr, grad=grad, momentum=MOMENTUM)
        t = tf.cast(version, tf.float32)
        return tf.raw_ops.ResourceApplyAdam(
            var=var, m=s[0], v=s[1], beta1_power=tf.pow(0.9, t), beta2_power=tf.pow(0.999, t), lr=lr,
            beta1=0.9, beta2=0.999, epsilon=1e-7, grad=grad,
        )  # fmt: skip

    def next_version(self) -> Any:
        """Graph code: one update more on the counter; its new value."""
        import tensorflow as tf

        with tf.device(PS0):
            tf.raw_ops.AssignAddVariableOp(resource=self.counter, value=tf.constant(1, tf.int64))
            return tf.raw_ops.ReadVariableOp(resource=self.counter, dtype=tf.int64)

    def apply_sum(self) -> None:
        """Graph code, synchronous mode, rank 0: one optimizer step with the accumulated mean gradient."""
        import tensorflow as tf

        version = self.next_version()
        for i in range(len(self.handles)):
            with tf.device(self.devices[i]):
                total = tf.raw_ops.ReadVariableOp(resource=self.accumulators[i], dtype=tf.float32)
                applied = self.apply(i, total, version)
                with tf.control_dependencies([applied]):
                    tf.raw_ops.AssignVariableOp(resource=self.accumulators[i], value=tf.zeros_like(total))


def _push_function(
    forward: Callable[[Any, Any], Any],
    variables: list[Any],
    shared: SharedVariables,
    local: str,
    sync: bool,
    n_workers: float,
) -> Callable[[Any, Any], tuple[Any, Any, Any]]:
    """Graph code of a worker's push: forward and backward on its copy, then each gradient to
    its server (applied there, or added to its accumulator in synchronous mode).
    Returns (loss, stamps, the counter's value after this push: asynchronous mode)."""
    import tensorflow as tf

    order = list(range(len(variables)))[::-1]  # the last layer's gradient is ready first

    def push(x: Any, y: Any) -> tuple[Any, Any, Any]:
        with tf.device(local):
            loss, t_forward, grads, t_backward = stamped_gradients(forward, variables, x, y)
        version = tf.constant(0, tf.int64)
        if not sync:
            version = shared.next_version()  # one applied push more
        begins: list[Any] = [None] * len(order)
        ends: list[Any] = [None] * len(order)
        for i in order:
            with tf.device(local):
                t0 = stamp_after([grads[i]])
                with tf.control_dependencies([t0]):
                    grad = tf.identity(grads[i])
            with tf.device(shared.devices[i]):
                if sync:
                    done = tf.raw_ops.AssignAddVariableOp(resource=shared.accumulators[i], value=grad / n_workers)
                else:
                    done = shared.apply(i, grad, version)
            with tf.device(local):
                t1 = stamp_after([done])
            begins[i], ends[i] = t0, t1
        return loss, tf.stack([t_forward, t_backward, *begins, *ends]), version

    return push


def _pull_function(variables: list[Any], shared: SharedVariables, local: str) -> Callable[[], tuple[Any, Any]]:
    """Graph code of a worker's pull: every variable from its server into the local copy.
    Returns (stamps, the counter's value at the pull)."""
    import tensorflow as tf

    def pull() -> tuple[Any, Any]:
        with tf.device(PS0):
            version = tf.raw_ops.ReadVariableOp(resource=shared.counter, dtype=tf.int64)
        begins, ends = [], []
        for i, v in enumerate(variables):
            with tf.device(local):
                t0 = tf.timestamp()
            with tf.device(shared.devices[i]), tf.control_dependencies([t0]):
                value = tf.raw_ops.ReadVariableOp(resource=shared.handles[i], dtype=tf.float32)
            with tf.device(local):
                value = tf.ensure_shape(tf.identity(value), v.shape)  # arrived on this worker
                t1 = stamp_after([value])
                v.assign(value)
            begins.append(t0)
            ends.append(t1)
        return tf.stack([*begins, *ends]), version

    return pull
