"""MXNet 1.9 (Gluon): the parameter server (kvstore `dist_sync`, `dist_async`) and Horovod.

One custom loop for every backend, with the same phase boundaries as the other adapters.
MXNet runs operations asynchronously (a Python call only queues work for its dependency
engine), so a phase ends on the host only when its results exist. The loop waits exactly
where a phase ends and at no other place:

- forward: `loss.asnumpy()` (the loss must exist; backward needs it anyway);
- backward and comm: no wait between them. Each gradient's exchange is queued right after
  `backward()` and overlaps the rest of backward; the engine stamps when each gradient
  was ready and each message ended (`engine.Stamps`: three stamps per parameter with a
  kvstore, two with Horovod, about 12 µs each on the 2-core development VM). `backward`
  ends when the last gradient was ready; `comm` is what remained after that, up to
  `mx.nd.waitall()`: the next forward needs the new weights, so waiting there costs
  nothing the training would not wait for;
- update (Horovod only): the local optimizer step, then a wait. With a kvstore the
  optimizer runs on the servers (`update_on_kvstore`), inside the exchange: no update phase.

Backends (`exchange.py` times each one's messages):

- `dist_sync`, `dist_async`: MXNet's parameter server (ps-lite), its scheduler and servers
  started by the ranks (`kvstore.py`; `extra: {servers: N}`, default 1). Every launched rank
  is a worker; data shards follow hpcbench's rank, and the kvstore rank of every hpcbench
  rank is recorded (`mxnet_kvstore_ranks`). Messages: a `push` and a `pull` per parameter
  and iteration (bytes = the parameter's). In `dist_async` ranks' weights differ during
  training; what is checked instead (every push applied; staleness) is in `exchange.py`.
- `horovod`: `horovod.mxnet`. Initial weights broadcast from rank 0; one in-place
  all-reduce (average) per gradient, queued into the engine right after backward; the
  optimizer runs locally (Gluon Trainer without a kvstore). Launched by mpirun / srun (MPI
  bookkeeping) or horovodrun (bookkeeping over Horovod itself, `_horovod.HorovodComm`).

Several devices per rank (`devices_per_rank` D > 1, kvstore backends): a context per device
(`cpu(0)` .. `cpu(D-1)`, or the rank's D GPUs), the network on all of them, each context's
forward and backward on its `batch_size` samples; every push hands the kvstore each
context's gradient, which it sums in the process before its one push to the servers, and
every pull writes the new weights to each context (MXNet's own multi-device training).

Threads: `point.threads` sets OMP / MKL / OpenBLAS threads (one operator's parallelism)
before MXNet is imported, as the launcher does; `MXNET_CPU_WORKER_NTHREADS` (operators run
at once) stays at MXNet's default, 1, unless the point's `environ` sets it. Both are
recorded. Every rank seeds MXNet and numpy with the point's seed, so initial weights are
equal; the kvstore (rank 0's values) or Horovod's broadcast makes sure of it.

MXNet is imported only inside methods (with `exchange.py`, `layers.py` and `engine.py`, which
need it): this module is registered in interpreters without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import (
    FRAMEWORKS,
    Framework,
    LauncherNeed,
    Problem,
    checksum,
    model_for,
    transformers_refused,
)
from hpcbench.frameworks.mxnet import kvstore
from hpcbench.frameworks.mxnet.kvstore import KVSTORES
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

if TYPE_CHECKING:
    from hpcbench.frameworks.mxnet.exchange import HorovodExchange, KVStoreExchange, Parameters

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@FRAMEWORKS.register
class MXNetFramework(Framework):
    name = "mxnet"
    requires = ("mxnet",)
    backends = (*KVSTORES, "horovod")
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {"horovod": ("horovod.mxnet",)}
    models = zoo.IMAGE_NAMES
    refusals: ClassVar[Mapping[str, str]] = transformers_refused(
        "MXNet 1.9.1 (its last release) has a fused self-attention (interleaved_matmul_selfatt_*) for CUDA only: "
        "on the CPU a transformer would be built of batch_dot and softmax, which would misreport the framework"
    )
    datasets = data.NAMES
    traits: ClassVar[Mapping[str, Traits]] = {
        # a push and a pull per parameter to the kvstore's servers, which run the optimizer
        "dist_sync": Traits(parameter_server=True),
        "dist_async": Traits(parameter_server=True, asynchronous=True),
        "horovod": Traits(grouping="fusion", background_thread=True),
    }
    several_devices = KVSTORES  # a context per device, the kvstore summing their gradients before its push
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {
        **{kind: LauncherNeed("the kvstore roles are set up over MPI") for kind in KVSTORES},
        "horovod": LauncherNeed("Horovod starts its ranks", horovod=True),
    }

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

    def __init__(self) -> None:
        self._kv: Any = None
        self._hvd: Any = None
        self._roles: kvstore.Roles | None = None
        self._comm: Comm | None = None  # bookkeeping comm of our own (horovodrun)
        self._exchange: KVStoreExchange | HorovodExchange | None = None
        self._kv_ranks: list[int] = []
        self._servers = 0
        self._rank = 0
        self._size = 1
        self._local_rank = 0
        self._contexts: list[Any] = []

    # ----------------------------------------------------------------------------------
    # Distributed set-up.

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
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
        self._start_kvstore(point, renv, self.mpi_ranks(point, comm))

    def _start_kvstore(self, point: Point, renv: RankEnv, comm: Comm) -> None:
        self._servers = servers = kvstore.servers_for(point, renv)
        places = kvstore.rendezvous(servers, renv, comm)
        roles = self._roles = kvstore.Roles(comm, self.init_timeout_s())
        roles.launch(places, servers, comm.rank)
        self._kv = kvstore.create_kvstore(point.backend, renv.size)
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
        from hpcbench.frameworks.mxnet.exchange import HorovodExchange, KVStoreExchange, Parameters

        # one context per device the rank drives (devices_per_rank; the first evaluates)
        devices, first = point.devices_per_rank, self._local_rank * point.devices_per_rank
        gpu = point.device == "cuda"
        self._contexts = [mx.gpu(first + d) if gpu else mx.cpu(d) for d in range(devices)]
        self._ctx = self._contexts[0]
        model = self._model = model_for(point)
        self.load_data(point, model, self._rank, self._size)
        mx.random.seed(point.seed)  # the same initial weights on every rank
        net = self._net = mx_layers.build(model)
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=self._contexts)
        net.hybridize(static_alloc=True, static_shape=True)
        self._params: Parameters = Parameters.of(mx_layers.trainable(net), self._contexts)
        self._loss = gluon.loss.SoftmaxCrossEntropyLoss() if model.classes else gluon.loss.L2Loss()
        self._xs = [mx.nd.zeros((point.batch_size, *model.input), ctx=c) for c in self._contexts]
        self._ys = [mx.nd.zeros((point.batch_size,), ctx=c, dtype="int64") for c in self._contexts]
        if self._kv is not None:
            self._exchange = KVStoreExchange(self._kv, self._params, point, self._rank, self._size)
        else:
            self._exchange = HorovodExchange(self._hvd, net, self._params, point)

    # ----------------------------------------------------------------------------------
    # The timed step.

    def _forward(self, rec: Recorder) -> float:
        from mxnet import autograd

        x, y = self.batches.next()
        rec.mark(Phase.DATA)
        # Into preallocated arrays; a copy from numpy is synchronous in MXNet (it waits until
        # the array is free, which it is: the previous step ended with a wait). The direct
        # copy, not `x[:] = ...`, whose index handling costs several times the copy.
        # With several contexts, each its part of the batch (batch_size samples).
        b = len(y) // len(self._xs)
        for d, (xd, yd) in enumerate(zip(self._xs, self._ys, strict=True)):
            xd._sync_copyfrom(x[d * b : (d + 1) * b])
            yd._sync_copyfrom(y[d * b : (d + 1) * b])
        rec.mark(Phase.H2D)
        with autograd.record():
            losses = []
            for xd, yd in zip(self._xs, self._ys, strict=True):
                target = yd if self._model.classes else xd.reshape((b, -1))
                losses.append(self._loss(self._net(xd), target))
        # Wait for the loss: the forward phase ends when its result exists (phase boundary).
        value = np.concatenate([loss.asnumpy() for loss in losses])
        rec.mark(Phase.FORWARD)
        autograd.backward(losses)
        return float(value.mean())

    def step(self, rec: Recorder) -> Any:
        loss = self._forward(rec)
        assert self._exchange is not None, "build() first"
        self._exchange.step(rec)  # backward, comm (and update): the step's last marks
        return loss

    # ----------------------------------------------------------------------------------
    # Evaluation and checks.

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        if self._exchange is not None:
            self._exchange.before_evaluation()
        yield

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        import mxnet as mx

        xs = mx.nd.array(x, ctx=self._ctx)
        out = self._net(xs)
        if not self._model.classes:
            return float(self._loss(out, xs.reshape((len(y), -1))).sum().asscalar()), 0
        ys = mx.nd.array(y, ctx=self._ctx, dtype="int64")
        loss = self._loss(out, ys)
        correct = int((out.argmax(axis=1).asnumpy().astype(np.int64) == y).sum())
        return float(loss.sum().asscalar()), correct

    def parameter_checksum(self) -> float:
        return checksum(w.asnumpy() for w in self._params.weights)

    def versions(self) -> dict[str, str]:
        import mxnet as mx

        out = {
            "mxnet": mx.__version__,
            "mxnet_omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
            "mxnet_cpu_worker_nthreads": os.environ.get("MXNET_CPU_WORKER_NTHREADS", ""),
        }
        out["mxnet_contexts"] = ", ".join(str(c) for c in self._contexts)
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
        if self._roles is not None:
            # Before the store closes: the servers leave once it has, and the guard, polling
            # meanwhile, would take that for a server lost during training.
            self._roles.leaving()
        if self._kv is not None:
            # Closing the store is a barrier of all workers, servers and scheduler; then the
            # servers and the scheduler leave by themselves. (The exchange holds it too.)
            self._kv = self._exchange = None
            gc.collect()
        if self._roles is not None:
            self._roles.stop()
            self._roles = None
        if self._hvd is not None:
            self._hvd.shutdown()
