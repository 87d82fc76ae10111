"""MXNet 1.9 (Gluon): the parameter server (kvstore `dist_sync`, `dist_async`) and Horovod.

One custom loop for every backend, with the same phase boundaries as the other adapters.
MXNet runs operations asynchronously (a Python call only queues work for its dependency
engine), so a phase ends on the host only when its results exist. The loop waits exactly
where a phase ends and at no other place:

- forward: `loss.asnumpy()` (the loss must exist; backward needs it anyway);
- backward and comm: no wait between them. Each gradient's exchange is queued right after
  `backward()` and the engine starts it as soon as that gradient is written, so exchange
  overlaps the rest of backward as it does in any MXNet training loop. The moments a
  gradient became ready, a push was taken by the servers, new weights arrived (or an
  all-reduce finished) are stamped by the engine itself (`engine.Stamps`), not by a
  wait (three stamps per parameter with a kvstore, two with Horovod, about 12 µs each on
  the 2-core development VM; the message rows are written after the step's last mark).
  `backward` ends when the last gradient was ready; `comm` is what remained after that,
  up to `mx.nd.waitall()`: the next forward needs the new weights, so waiting there costs
  nothing the training would not wait for;
- update (Horovod only): the local optimizer step, then a wait. With a kvstore the
  optimizer runs on the servers (`update_on_kvstore`), inside the exchange: no update phase.

Backends:

- `dist_sync`, `dist_async`: MXNet's parameter server (ps-lite). Every launched rank is a
  worker that runs the timed loop and writes its rows. Extra processes play the other
  roles: rank 0 starts the scheduler on a free port and broadcasts its address over MPI
  (127.0.0.1 on one host; else its address on the route to the other nodes, or
  `HPCBENCH_MASTER_ADDR`; ps-lite's `DMLC_INTERFACE` picks the nodes' own interface);
  `extra: {servers: N}` (default 1) servers are started by the first N ranks in the order
  (local rank, node): local rank 0 of every node first, so servers spread over nodes. They
  are `python -c "import mxnet"` with `DMLC_ROLE` set (importing MXNet runs that role),
  die with the rank that started them (PR_SET_PDEATHSIG), abort the job when one dies
  early, and leave on their own when the workers close the store at teardown. ps-lite
  numbers workers in its own order (it cannot be told hpcbench's), so the kvstore rank of
  every hpcbench rank is recorded (`mxnet_kvstore_ranks`); data shards follow hpcbench's
  rank. Messages: a `push` and a `pull` per parameter and iteration (bytes = the
  parameter's); push from the gradient being ready until the servers took it (in
  dist_sync they answer once every worker's push is merged and the update applied), pull
  from then until the new weights are in place.
  In `dist_async` the servers apply each push on arrival and a worker pulls whatever they
  hold, so ranks' weights differ during training and the usual check (equal parameters on
  all ranks) does not apply. Instead the servers count the updates they apply (one more
  key, `ps.VersionCounting`, pushed and pulled with every iteration: 4 bytes each way,
  inside the comm phase, not in the comm table): each pull returns that count, so each
  iteration's staleness (updates by other workers since this worker's previous pull) is
  measured (the log gives its mean and maximum), and before each evaluation the workers
  meet at a kvstore barrier and pull the servers' weights, which then are the same on
  every rank and have taken in exactly workers × iterations updates (checked and logged).
  `kvstore='horovod'` is refused: MXNet 1.9 returns a local store for it (and for any
  unknown name) without an error, and every worker would train alone. For the same
  reason a created store is checked to be distributed and to count every worker.
- `horovod`: `horovod.mxnet`. Initial weights broadcast from rank 0; one in-place
  all-reduce (average) per gradient, queued into the engine right after backward,
  timed per message by engine stamps; the optimizer runs locally (Gluon Trainer without a
  kvstore). Launched by mpirun / srun (MPI bookkeeping) or horovodrun (bookkeeping over
  Horovod itself, `_horovod.HorovodComm`).

Threads: `point.threads` sets OMP / MKL / OpenBLAS threads (one operator's parallelism)
before MXNet is imported, as the launcher does; `MXNET_CPU_WORKER_NTHREADS` (operators run
at once) stays at MXNet's default, 1, unless the point's `environ` sets it. Both are
recorded. Every rank seeds MXNet and numpy with the point's seed, so initial weights are
equal; the kvstore (rank 0's values) or Horovod's broadcast makes sure of it.

MXNet is imported only inside methods: this module is registered in interpreters without it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import FRAMEWORKS, Evaluation, Framework, Problem, checksum, model_for, shard_for
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.rank.net import free_port
from hpcbench.spec import Point
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

KVSTORES = ("dist_sync", "dist_async")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
DEFAULT_SERVERS = 1
INIT_TIMEOUT_S = 300.0  # HPCBENCH_INIT_TIMEOUT_S: the kvstore must be up by then
ROLE_STOP_S = 20.0  # servers and scheduler leave by themselves once workers close the store
_PR_SET_PDEATHSIG = 1


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


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


_LIBC = _libc()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the rank that started it dies (even by SIGKILL)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _address_towards(peer: str) -> str:
    """This host's address on the route to `peer` (not what its own name resolves to, which
    on many systems is a loopback address such as 127.0.1.1). No packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(peer), 9))
        address: str = s.getsockname()[0]
        return address


class _Roles:
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
        # (e.g. this very file, run from hpcbench/frameworks) shadows the real one.
        code = "import sys; sys.path[:] = [p for p in sys.path if p]; import mxnet"
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        self.procs.append((role, proc))

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

    def stop(self) -> None:
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
    return str(Path(__file__).resolve().parent.parent.parent)


@FRAMEWORKS.register
class MXNetFramework(Framework):
    name = "mxnet"
    requires = ("mxnet",)
    backends = (*KVSTORES, "horovod")
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {"horovod": ("horovod.mxnet",)}
    models = zoo.NAMES
    datasets = data.NAMES

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        extra = dict(point.extra)
        allowed = ["servers"] if point.backend in KVSTORES else []
        for key, value in extra.items():
            if key not in allowed:
                yield "extra", f"{key!r} is not an mxnet {point.backend} setting", ", ".join(allowed) or "none"
            elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= point.ranks:
                yield "extra", f"servers: {value!r} is not a whole number from 1 to the point's ranks", "1 ... ranks"
        launchers = ("mpirun", "srun") if point.backend in KVSTORES else ("mpirun", "srun", "horovodrun")
        if point.launcher not in launchers:
            why = "the kvstore roles are set up over MPI" if point.backend in KVSTORES else "Horovod starts its ranks"
            yield "launcher", f"mxnet {point.backend} cannot run under {point.launcher!r}: {why}", ", ".join(launchers)

    def __init__(self) -> None:
        self._point: Point | None = None
        self._kv: Any = None
        self._hvd: Any = None
        self._roles: _Roles | None = None
        self._comm: Comm | None = None  # bookkeeping comm of our own (horovodrun)
        self._kv_ranks: list[int] = []
        self._servers = 0
        self._rank = 0
        self._size = 1
        self._local_rank = 0
        self._steps = 0  # iterations run
        self._versions: list[int] = []  # dist_async: update count seen by each pull

    # ----------------------------------------------------------------------------------
    # Distributed set-up.

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        self._point = point
        self._rank, self._size, self._local_rank = renv.rank, renv.size, renv.local_rank
        # Before mxnet is imported: its OpenMP pool and engine read these once.
        if point.threads is not None:
            for var in THREAD_VARIABLES:
                os.environ[var] = str(point.threads)
        os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
        if point.backend in KVSTORES:
            os.environ["DMLC_ROLE"] = "worker"  # importing mxnet as a worker starts no server
        import mxnet as mx

        mx.random.seed(point.seed)
        np.random.seed(point.seed)
        if point.backend == "horovod":
            import horovod.mxnet as hvd

            hvd.init()
            if renv.source == "single":  # started by Horovod's own (Gloo) launcher: its layout
                self._rank, self._size, self._local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
            elif hvd.size() != renv.size or hvd.rank() != renv.rank:
                raise HpcbenchError(
                    f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the launcher {renv.rank} of {renv.size}"
                )
            self._hvd = hvd
            if comm is None:
                from hpcbench.frameworks._horovod import HorovodComm

                self._comm = HorovodComm(hvd)
            return
        if comm is None:
            raise HpcbenchError(
                f"mxnet {point.backend} needs MPI to set up its kvstore roles: launch with mpirun or srun"
            )
        self._start_kvstore(point, renv, comm)

    def _start_kvstore(self, point: Point, renv: RankEnv, comm: Comm) -> None:
        servers = int(dict(point.extra).get("servers", DEFAULT_SERVERS))
        if not 1 <= servers <= renv.size:
            raise HpcbenchError(f"mxnet: servers must be 1 to {renv.size}, not {servers}")
        self._servers = servers
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
        roles = self._roles = _Roles(comm, float(os.environ.get("HPCBENCH_INIT_TIMEOUT_S", INIT_TIMEOUT_S)))
        child = dict(os.environ)
        # The servers unpickle the workers' optimizer (`ps.py`): they must import hpcbench.
        child["PYTHONPATH"] = os.pathsep.join(p for p in (child.get("PYTHONPATH"), _hpcbench_root()) if p)
        if comm.rank == 0:
            roles.start("scheduler", {**child, "DMLC_ROLE": "scheduler"})
        order = sorted(range(renv.size), key=lambda r: (places[r][0], places[r][1], r))
        if comm.rank in order[:servers]:
            roles.start("server", {**child, "DMLC_ROLE": "server"})
        roles.guard()
        self._kv = create_kvstore(point.backend, renv.size)
        roles.ready()
        self._kv_ranks = comm.allgather(int(self._kv.rank))

    def bookkeeping_comm(self) -> Comm | None:
        return self._comm

    # ----------------------------------------------------------------------------------
    # Model, optimizer, data.

    def build(self, point: Point) -> None:
        import mxnet as mx
        from mxnet import gluon

        from hpcbench.frameworks.mxnet import layers as mx_layers
        from hpcbench.frameworks.mxnet.engine import Stamps, ref

        self._ctx = mx.gpu(self._local_rank) if point.device == "cuda" else mx.cpu()
        model = self._model = model_for(point)
        shard = self._shard = shard_for(point, model, self._rank, self._size)
        self._batches = data.Batches(
            shard.train, point.batch_size, point.seed, self._rank, point.dataset != "synthetic"
        )
        mx.random.seed(point.seed)  # the same initial weights on every rank
        net = self._net = mx_layers.build(model)
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=self._ctx)
        net.hybridize(static_alloc=True, static_shape=True)
        self._params = params = mx_layers.trainable(net)
        self._weights = [p.data(self._ctx) for p in params]
        self._grads = [p.grad(self._ctx) for p in params]
        self._weight_refs = [ref(w) for w in self._weights]
        self._grad_refs = [ref(g) for g in self._grads]
        self._names = [p.name for p in params]
        self._dtypes = [str(np.dtype(w.dtype)) for w in self._weights]
        self._nbytes = [int(w.size) * np.dtype(w.dtype).itemsize for w in self._weights]
        self._loss = gluon.loss.SoftmaxCrossEntropyLoss() if model.classes else gluon.loss.L2Loss()
        self._x = mx.nd.zeros((point.batch_size, *model.input), ctx=self._ctx)
        self._y = mx.nd.zeros((point.batch_size,), ctx=self._ctx, dtype="int64")
        self._stamps = Stamps(3 * len(params))
        n = len(params)
        if self._kv is not None:
            sync = point.backend == "dist_sync"
            # dist_sync servers sum the workers' gradients, then update once: average them.
            rescale = 1.0 / (point.batch_size * (self._size if sync else 1))
            optimizer = self._optimizer(point, rescale)
            if not sync:
                from hpcbench.frameworks.mxnet.ps import VersionCounting

                optimizer = VersionCounting(optimizer, version_key=n)
            kv = self._kv
            kv.set_optimizer(optimizer)  # pickled to the servers: they run it (update_on_kvstore)
            keys = list(range(n))
            kv.init(keys, self._weights)  # rank 0's values (the others' are ignored), then a barrier
            kv.pull(keys, out=self._weights)
            if not sync:
                self._one = mx.nd.ones((1,))
                self._version = mx.nd.zeros((1,))
                kv.init(n, self._version)
            mx.nd.waitall()
        else:
            hvd = self._hvd
            hvd.broadcast_parameters(net.collect_params(), root_rank=0)
            # Trainer without a kvstore: a local update, its step rescales by 1 / batch.
            self._trainer = gluon.Trainer(params, self._optimizer(point, 1.0), kvstore=None, update_on_kvstore=False)
            mx.nd.waitall()

    @staticmethod
    def _optimizer(point: Point, rescale: float) -> Any:
        import mxnet as mx

        if point.optimizer == "adam":
            return mx.optimizer.Adam(learning_rate=point.lr, rescale_grad=rescale)
        momentum = 0.9 if point.optimizer == "momentum" else 0.0
        return mx.optimizer.SGD(learning_rate=point.lr, momentum=momentum, rescale_grad=rescale)

    def steps_per_epoch(self) -> int:
        return self._batches.steps_per_epoch

    # ----------------------------------------------------------------------------------
    # The timed step.

    def _forward(self, rec: Recorder) -> float:
        from mxnet import autograd

        x, y = self._batches.next()
        rec.mark(Phase.DATA)
        # Into preallocated arrays; a copy from numpy is synchronous in MXNet (it waits until
        # the array is free, which it is: the previous step ended with a wait). The direct
        # copy, not `x[:] = ...`, whose index handling costs several times the copy.
        self._x._sync_copyfrom(x)
        self._y._sync_copyfrom(y)
        rec.mark(Phase.H2D)
        with autograd.record():
            out = self._net(self._x)
            target = self._y if self._model.classes else self._x.reshape((x.shape[0], -1))
            loss = self._loss(out, target)
        # Wait for the loss: the forward phase ends when its result exists (phase boundary).
        value = loss.asnumpy()
        rec.mark(Phase.FORWARD)
        loss.backward()
        return float(value.mean())

    def step(self, rec: Recorder) -> Any:
        import mxnet as mx

        loss = self._forward(rec)
        stamps, t = self._stamps, self._stamps.t
        grads, weights = self._grads, self._weights
        n = len(grads)
        if self._kv is not None:
            kv = self._kv
            for i in range(n):
                stamps.when_written(3 * i, self._grad_refs[i])  # the gradient is computed
                kv.push(i, grads[i], priority=-i)
                # The servers took the push. (Declared as a write of the gradient, so it runs
                # after the push's read; on CPU the pull lands in that buffer next.)
                stamps.when_read(3 * i + 1, self._grad_refs[i])
                kv.pull(i, out=weights[i], priority=-i)
                stamps.when_written(3 * i + 2, self._weight_refs[i])  # the new weights are in place
            if self._point is not None and self._point.backend == "dist_async":
                kv.push(n, self._one)
                kv.pull(n, out=self._version)
            mx.nd.waitall()  # comm ends: the next forward needs these weights
            end = time.perf_counter_ns()
            rec.mark_at(Phase.BACKWARD, int(t[0 : 3 * n : 3].max()))
            rec.mark_at(Phase.COMM, end)
            self._record_kv(rec)
            if self._point is not None and self._point.backend == "dist_async":
                self._versions.append(int(self._version.asnumpy()[0]))  # ready: after the wait
        else:
            hvd = self._hvd
            for i in range(n):
                stamps.when_written(2 * i, self._grad_refs[i])
                hvd.allreduce_(grads[i], name=self._names[i], priority=-i)  # averages
                stamps.when_written(2 * i + 1, self._grad_refs[i])  # the all-reduce wrote it
            mx.nd.waitall()  # comm ends: the update reads the averaged gradients
            rec.mark_at(Phase.BACKWARD, int(t[0 : 2 * n : 2].max()))
            rec.mark(Phase.COMM)
            self._trainer.update(self._x.shape[0])
            mx.nd.waitall()  # the update phase ends when the new weights exist
            rec.mark(Phase.UPDATE)
            self._record_allreduce(rec)
        self._steps += 1
        return loss

    def _record_kv(self, rec: Recorder) -> None:
        """The step's messages, from the engine's stamps (after the step's last mark)."""
        comm, t = rec.comm, self._stamps.t
        n = len(self._grads)
        rec.add_comm(int((t[2 : 3 * n : 3] - t[0 : 3 * n : 3]).sum()))
        if comm is None:
            return
        it = rec.iteration
        for i in range(n):
            name, dtype, nbytes = self._names[i], self._dtypes[i], self._nbytes[i]
            ready, pushed, pulled = int(t[3 * i]), int(t[3 * i + 1]), int(t[3 * i + 2])
            comm.end(comm.begin(it, "push", name, dtype, nbytes, ready), pushed)
            comm.end(comm.begin(it, "pull", name, dtype, nbytes, pushed), pulled)

    def _record_allreduce(self, rec: Recorder) -> None:
        comm, t = rec.comm, self._stamps.t
        n = len(self._grads)
        rec.add_comm(int((t[1 : 2 * n : 2] - t[0 : 2 * n : 2]).sum()))
        if comm is None:
            return
        it = rec.iteration
        for i in range(n):
            slot = comm.begin(it, "allreduce", self._names[i], self._dtypes[i], self._nbytes[i], int(t[2 * i]))
            comm.end(slot, int(t[2 * i + 1]))

    # ----------------------------------------------------------------------------------
    # Evaluation and checks.

    def _sync_async_weights(self) -> None:
        """dist_async: meet the other workers, then take the servers' weights (the model a
        parameter-server job trains); check that every worker's every push was applied."""
        import mxnet as mx

        kv, n = self._kv, len(self._weights)
        kv._barrier()  # every worker's pushes were answered: the servers applied them
        kv.pull([*range(n), n], out=[*self._weights, self._version])
        mx.nd.waitall()
        applied = int(self._version.asnumpy()[0])
        expected = self._size * self._steps
        v = np.asarray(self._versions, dtype=np.int64)
        stale = np.diff(v, prepend=0) - 1 if len(v) else v
        print(
            f"hpcbench.mxnet: rank {self._rank}: dist_async servers applied {applied} updates "
            f"(expected {self._size} workers x {self._steps} iterations = {expected}); staleness per "
            f"iteration (others' updates between this worker's pulls): mean {stale.mean() if len(v) else 0:.2f}, "
            f"max {stale.max() if len(v) else 0}",
            flush=True,
        )
        if applied != expected:
            raise HpcbenchError(f"dist_async: the servers applied {applied} updates, expected {expected}")

    def evaluate(self) -> Evaluation | None:
        import mxnet as mx

        if self._point is not None and self._point.backend == "dist_async":
            self._sync_async_weights()
        correct = total = 0
        loss_sum = 0.0
        count = 0
        for x, y in data.eval_batches(self._shard.test, self._point.batch_size if self._point else 32):
            xs = mx.nd.array(x, ctx=self._ctx)
            out = self._net(xs)
            if self._model.classes:
                ys = mx.nd.array(y, ctx=self._ctx, dtype="int64")
                loss = self._loss(out, ys)
                correct += int((out.argmax(axis=1).asnumpy().astype(np.int64) == y).sum())
                total += len(y)
            else:
                loss = self._loss(out, xs.reshape((len(y), -1)))
            loss_sum += float(loss.sum().asscalar())
            count += len(y)
        return Evaluation(correct, total, loss_sum / max(count, 1))

    def parameter_checksum(self) -> float:
        return checksum(w.asnumpy() for w in self._weights)

    def versions(self) -> dict[str, str]:
        import mxnet as mx

        out = {
            "mxnet": mx.__version__,
            "mxnet_omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
            "mxnet_cpu_worker_nthreads": os.environ.get("MXNET_CPU_WORKER_NTHREADS", ""),
        }
        if self._kv is not None:
            out["mxnet_kvstore"] = str(self._kv.type)
            out["mxnet_kvstore_servers"] = str(self._servers)
            # kvstore rank of hpcbench rank 0, 1, ...: ps-lite numbers workers in its own order
            out["mxnet_kvstore_ranks"] = ",".join(map(str, self._kv_ranks))
        if self._hvd is not None:
            import horovod

            out["mxnet_kvstore"] = "none (horovod.mxnet)"
            out["horovod"] = horovod.__version__
        return out

    def teardown(self) -> None:
        import gc

        import mxnet as mx

        mx.nd.waitall()
        if self._kv is not None:
            # Closing the store is a barrier of all workers, servers and scheduler; then the
            # servers and the scheduler leave by themselves.
            self._kv = None
            gc.collect()
        if self._roles is not None:
            self._roles.stop()
            self._roles = None
        if self._hvd is not None:
            self._hvd.shutdown()
