"""ChainerMN's gradient averaging, with every message timed.

`TimedMean` wraps a communicator's methods on the instance (its class stays ChainerMN's):

- `multi_node_mean_grad(model, zero_fill)`, which the multi-node optimizer calls before the
  actual optimizer's update: it learns which gradient array is which parameter, runs the
  communicator's own averaging, and marks the end of the `comm` phase when it returns, so
  the optimizer's update that follows is the `update` phase;
- `naive` (CPU): `_multi_node_mean(sendbuf, recvbuf)`, which the naive communicator calls
  once per parameter (an MPI all-reduce through mpi4py, then the division by the ranks):
  one message each, named after the parameter, bytes those of its gradient;
- `pure_nccl` (GPU): the communicator packs every gradient into one buffer for one NCCL
  all-reduce: one message (`all`, every gradient's bytes), ended after the default stream
  has been synchronised (NCCL runs asynchronously on it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpcbench.trace.recorder import Phase, Recorder


class TimedMean:
    def __init__(self, communicator: Any, fused: bool, synchronize: Callable[[], None] | None = None) -> None:
        self.communicator = communicator
        self.rec: Recorder | None = None  # the current step's recorder, set by the adapter
        self._fused = fused
        self._synchronize = synchronize
        self._names: dict[int, str] = {}
        self._mean_grad = communicator.multi_node_mean_grad
        communicator.multi_node_mean_grad = self.mean_grad
        if not fused:
            self._mean = communicator._multi_node_mean
            communicator._multi_node_mean = self.mean

    def _begin(self, name: str, dtype: str, nbytes: int) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        rec = self.rec
        if rec is None or rec.comm is None:
            return -1, t0
        return rec.comm.begin(rec.iteration, "allreduce", name, dtype, nbytes, t0), t0

    def _end(self, slot: int, t0: int) -> None:
        t1 = time.perf_counter_ns()
        rec = self.rec
        if rec is None:
            return
        if rec.comm is not None:
            rec.comm.end(slot, t1)
        rec.add_comm(t1 - t0)

    def mean(self, sendbuf: Any, recvbuf: Any) -> Any:
        """One parameter's all-reduce (naive communicator), timed."""
        name = self._names.get(id(recvbuf), "?")
        slot, t0 = self._begin(name, str(recvbuf.dtype), int(recvbuf.nbytes))
        out = self._mean(sendbuf, recvbuf)
        self._end(slot, t0)
        return out

    def mean_grad(self, model: Any, zero_fill: bool = False) -> None:
        """Every gradient averaged over the ranks (the communicator's own method), timed."""
        grads = [(name, p.grad) for name, p in model.namedparams() if p.grad is not None]
        self._names = {id(g): name.lstrip("/") for name, g in grads}
        if self._fused:
            slot, t0 = self._begin("all", str(grads[0][1].dtype) if grads else "", sum(int(g.nbytes) for _, g in grads))
            self._mean_grad(model, zero_fill)
            if self._synchronize is not None:
                self._synchronize()
            self._end(slot, t0)
        else:
            self._mean_grad(model, zero_fill)
        if self.rec is not None:
            self.rec.mark(Phase.COMM)
