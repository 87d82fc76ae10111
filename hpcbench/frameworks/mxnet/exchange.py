"""How MXNet ranks exchange gradients, one class per backend, each timing every message.

Both exchanges take over a step right after `loss.backward()` has been queued and end it
with the step's last mark. Each gradient's exchange is queued at once; the engine starts it
as soon as that gradient is written, so exchange overlaps the rest of backward as in any
MXNet training loop. The moments a gradient became ready, a push was taken by the servers,
new weights arrived (or an all-reduce finished) are stamped by the engine itself
(`engine.Stamps`), not by a wait; the message rows are written from those stamps after the
step's last mark. `backward` ends when the last gradient was ready; `comm` is what remained
after that, up to `mx.nd.waitall()`.

- `KVStoreExchange` (`dist_sync`, `dist_async`): per parameter a `push` (from the gradient
  being ready until the servers took it; in dist_sync they answer once every worker's push
  is merged and the update applied) and a `pull` (from then until the new weights are in
  place). The optimizer runs on the servers (`update_on_kvstore`), inside the exchange: no
  update phase. In dist_async the servers apply each push on arrival and a worker pulls
  whatever they hold, so ranks' weights differ during training. Instead of equal weights,
  the servers count the updates they apply (one more key, `ps.VersionCounting`, pushed and
  pulled with every iteration: 4 bytes each way, inside the comm phase, not in the comm
  table): each pull returns that count, so each iteration's staleness (updates by other
  workers since this worker's previous pull) is measured (the log gives its mean and
  maximum), and before each evaluation the workers meet at a kvstore barrier and pull the
  servers' weights, which then are the same on every rank and have taken in exactly
  workers × iterations updates (checked and logged).
- `HorovodExchange` (`horovod`): one in-place all-reduce (average) per gradient, then the
  optimizer step locally (Gluon Trainer without a kvstore) and a wait: the update phase.

Only the adapter imports this module, lazily (in `build`): it needs mxnet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import gluon

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import MOMENTUM
from hpcbench.frameworks.mxnet.engine import Ref, Stamps, ref
from hpcbench.spec import Point
from hpcbench.trace.recorder import Phase, Recorder


@dataclass
class Parameters:
    """The trainable parameters, their arrays on this rank's device, and what their messages say."""

    params: list[gluon.Parameter]  # in the order the network creates them
    weights: list[Any]  # NDArrays, on the rank's first context
    grads: list[Any]
    weight_refs: list[Ref]  # for the engine's stamps: every context's copy
    grad_refs: list[Ref]
    names: list[str]
    dtypes: list[str]
    nbytes: list[int]
    # per parameter, its weight's and its gradient's copy on each of the rank's contexts
    # (one with one device; several: devices_per_rank, the kvstore reducing them)
    copies: list[list[Any]]
    grad_copies: list[list[Any]]

    def record(self, rec: Recorder, t: np.ndarray, ops: tuple[str, ...]) -> None:
        """The step's messages, from the engine's stamps (after the step's last mark): per
        parameter i, stamp k*i when its gradient was ready, then the end of each of its `ops`
        (k = 1 + len(ops)); op j runs from stamp k*i+j to k*i+j+1."""
        k, n, comm = 1 + len(ops), len(self.grads), rec.comm
        rec.add_comm(int((t[k - 1 : k * n : k] - t[0 : k * n : k]).sum()))
        if comm is None:
            return
        it = rec.iteration
        for i in range(n):
            name, dtype, nbytes = self.names[i], self.dtypes[i], self.nbytes[i]
            for j, op in enumerate(ops):
                comm.end(comm.begin(it, op, name, dtype, nbytes, int(t[k * i + j])), int(t[k * i + j + 1]))

    @classmethod
    def of(cls, params: list[gluon.Parameter], contexts: list[Any]) -> Parameters:
        copies = [[p.data(c) for c in contexts] for p in params]
        grad_copies = [[p.grad(c) for c in contexts] for p in params]
        weights = [w[0] for w in copies]
        return cls(
            params=params,
            weights=weights,
            grads=[g[0] for g in grad_copies],
            weight_refs=[ref(*w) for w in copies],
            grad_refs=[ref(*g) for g in grad_copies],
            names=[p.name for p in params],
            dtypes=[str(np.dtype(w.dtype)) for w in weights],
            nbytes=[int(w.size) * np.dtype(w.dtype).itemsize for w in weights],
            copies=copies,
            grad_copies=grad_copies,
        )


def optimizer(point: Point, rescale: float) -> Any:
    """The point's optimizer; `rescale` multiplies the gradient (MXNet's losses are summed)."""
    if point.optimizer == "adam":
        return mx.optimizer.Adam(learning_rate=point.lr, rescale_grad=rescale)
    momentum = MOMENTUM if point.optimizer == "momentum" else 0.0
    return mx.optimizer.SGD(learning_rate=point.lr, momentum=momentum, rescale_grad=rescale)


class KVStoreExchange:
    """Push and pull through MXNet's parameter server; the servers run the optimizer."""

    def __init__(self, kv: Any, params: Parameters, point: Point, rank: int, workers: int) -> None:
        from hpcbench.frameworks.mxnet.ps import VersionCounting

        self.kv, self.params, self.rank, self.workers = kv, params, rank, workers
        self.sync = point.backend == "dist_sync"
        self.stamps = Stamps(3 * len(params.weights))
        self.steps = 0  # iterations run
        self.versions: list[int] = []  # dist_async: update count seen by each pull
        n = len(params.weights)
        # dist_sync servers sum the workers' gradients, then update once: average them (each
        # worker's the sum over its contexts' batches: the kvstore sums them as it pushes).
        rescale = 1.0 / (point.rank_batch * (workers if self.sync else 1))
        opt = optimizer(point, rescale)
        if not self.sync:
            opt = VersionCounting(opt, version_key=n)
        kv.set_optimizer(opt)  # pickled to the servers: they run it (update_on_kvstore)
        keys = list(range(n))
        kv.init(keys, params.weights)  # rank 0's values (the others' are ignored), then a barrier
        kv.pull(keys, out=params.copies)
        if not self.sync:
            self._one = mx.nd.ones((1,))
            self._version = mx.nd.zeros((1,))
            kv.init(n, self._version)
        mx.nd.waitall()

    def step(self, rec: Recorder) -> None:
        """After backward is queued: the exchange, up to the step's last mark (comm)."""
        p, kv, stamps = self.params, self.kv, self.stamps
        n = len(p.grads)
        for i in range(n):
            stamps.when_written(3 * i, p.grad_refs[i])  # the gradient is computed (on every context)
            kv.push(i, p.grad_copies[i], priority=-i)  # several contexts: summed in the process, pushed once
            # The servers took the push. (Declared as a write of the gradient, so it runs
            # after the push's read; on CPU the pull lands in that buffer next.)
            stamps.when_read(3 * i + 1, p.grad_refs[i])
            kv.pull(i, out=p.copies[i], priority=-i)
            stamps.when_written(3 * i + 2, p.weight_refs[i])  # the new weights are in place
        if not self.sync:
            kv.push(n, self._one)
            kv.pull(n, out=self._version)
        mx.nd.waitall()  # comm ends: the next forward needs these weights
        end = time.perf_counter_ns()
        t = stamps.t
        rec.mark_at(Phase.BACKWARD, int(t[0 : 3 * n : 3].max()))
        rec.mark_at(Phase.COMM, end)
        self.params.record(rec, stamps.t, ("push", "pull"))
        if not self.sync:
            self.versions.append(int(self._version.asnumpy()[0]))  # ready: after the wait
        self.steps += 1

    def before_evaluation(self) -> None:
        """dist_async: meet the other workers, then take the servers' weights (the model a
        parameter-server job trains); check that every worker's every push was applied."""
        if self.sync:
            return
        kv, n = self.kv, len(self.params.weights)
        kv._barrier()  # every worker's pushes were answered: the servers applied them
        kv.pull([*range(n), n], out=[*self.params.copies, [self._version]])
        mx.nd.waitall()
        applied = int(self._version.asnumpy()[0])
        expected = self.workers * self.steps
        v = np.asarray(self.versions, dtype=np.int64)
        stale = np.diff(v, prepend=0) - 1 if len(v) else v
        print(
            f"hpcbench.mxnet: rank {self.rank}: dist_async servers applied {applied} updates "
            f"(expected {self.workers} workers x {self.steps} iterations = {expected}); staleness per "
            f"iteration (others' updates between this worker's pulls): mean {stale.mean() if len(v) else 0:.2f}, "
            f"max {stale.max() if len(v) else 0}",
            flush=True,
        )
        if applied != expected:
            raise HpcbenchError(f"dist_async: the servers applied {applied} updates, expected {expected}")


class HorovodExchange:
    """One Horovod all-reduce per gradient; the optimizer runs locally."""

    def __init__(self, hvd: Any, net: gluon.Block, params: Parameters, point: Point) -> None:
        self.hvd, self.params = hvd, params
        self.batch_size = point.batch_size
        self.stamps = Stamps(3 * len(params.weights))
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        # Trainer without a kvstore: a local update, its step rescales by 1 / batch.
        self.trainer = gluon.Trainer(params.params, optimizer(point, 1.0), kvstore=None, update_on_kvstore=False)
        mx.nd.waitall()

    def step(self, rec: Recorder) -> None:
        """After backward is queued: the exchange (comm), then the update."""
        p, hvd, stamps = self.params, self.hvd, self.stamps
        n = len(p.grads)
        for i in range(n):
            stamps.when_written(2 * i, p.grad_refs[i])
            hvd.allreduce_(p.grads[i], name=p.names[i], priority=-i)  # averages
            stamps.when_written(2 * i + 1, p.grad_refs[i])  # the all-reduce wrote it
        mx.nd.waitall()  # comm ends: the update reads the averaged gradients
        rec.mark_at(Phase.BACKWARD, int(stamps.t[0 : 2 * n : 2].max()))
        rec.mark(Phase.COMM)
        self.trainer.update(self.batch_size)
        mx.nd.waitall()  # the update phase ends when the new weights exist
        rec.mark(Phase.UPDATE)
        p.record(rec, stamps.t, ("allreduce",))

    def before_evaluation(self) -> None:
        """Nothing to do: every rank holds the same weights."""
