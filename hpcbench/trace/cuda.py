"""Timing on the GPU: CUDA events recorded on the stream the work is queued on, read afterwards.

`CudaRecorder` keeps the CPU marks of `Recorder` (t_start / t_end stay host times on the
common clock) and also records a CUDA event at every mark, on the stream the work was
queued on. Phase durations then come from the events: what the device spent between the
marks, not when the host queued the kernels (the `data` phase, host work, keeps its host
time). A phase marked several times ends at its last mark, on the device too (re-recording
an event moves it): the exchanges' hooks mark `backward` each time a gradient is ready.
Marks are recorded on the stream current when the iteration started (the training stream,
which autograd's threads also run backward on), looked up once per iteration: looking it
up costs microseconds, a good part of what a mark would otherwise cost.
Nothing waits for the device inside a step: events live in a ring of `capacity` rows and
are read in `drain`, between iterations, after one synchronisation on the last event recorded.

`CudaCommRecorder` times each gradient message on the device. With NCCL, a collective's
future completes on the host as soon as the collective is queued, so host clocks would
time the queueing (microseconds), not the transfer. Instead an event is recorded where the
message is handed over (on the stream that produced the gradients) and another where its
completion is seen: inside the future's callback, whose current stream waits for the
collective's kernels. A message's `t_start` stays the host time it was handed over and
`t_end - t_start` is the device time from then until the collective finished.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcbench.trace.messages import INITIAL_CAPACITY, CommRecorder
from hpcbench.trace.recorder import _END, _N_MARKS, _START, Phase, Recorder

DEVICE_PHASES = ("h2d", "forward", "backward", "comm", "update")


class CudaRecorder(Recorder):
    def __init__(self, capacity: int, clock_offset: int, epoch_ns: int, device: Any) -> None:
        super().__init__(capacity, clock_offset, epoch_ns)
        import torch

        self._torch = torch
        self._device = device
        # one preallocated event per mark slot: no allocation on the hot path
        self._events = [
            [torch.cuda.Event(enable_timing=True) for _ in range(_N_MARKS)]  # type: ignore[no-untyped-call]
            for _ in range(capacity)
        ]
        self._marked = np.zeros((capacity, _N_MARKS), dtype=bool)
        self._stream: Any = None

    def start(self, warmup: bool = False) -> None:
        super().start(warmup)
        row = self._row
        self._stream = self._torch.cuda.current_stream(self._device)
        self._marked[row] = False
        self._events[row][_START].record(self._stream)
        self._marked[row, _START] = True

    def mark(self, phase: int) -> None:
        super().mark(phase)
        self._events[self._row][phase].record(self._stream)
        self._marked[self._row, phase] = True

    def stop(self, samples: int, loss: Any = None) -> None:
        self._events[self._row][_END].record(self._stream)
        self._marked[self._row, _END] = True
        super().stop(samples, loss)

    def drain(self) -> np.ndarray:
        n = len(self)
        if n:
            self._events[n - 1][_END].synchronize()  # the device has reached the last mark
        gpu = np.zeros((n, Phase.UPDATE), dtype=np.float64)
        for i in range(n):
            events, marked = self._events[i], self._marked[i]
            previous = events[_START]
            for phase in range(Phase.DATA, Phase.UPDATE + 1):
                if marked[phase]:
                    gpu[i, phase - 1] = previous.elapsed_time(events[phase]) / 1e3  # ms -> s
                    previous = events[phase]
        losses = self._loss[:n]
        if n and all(isinstance(v, self._torch.Tensor) for v in losses):
            # one copy to the host for the block, not one wait for the device per iteration
            self._loss[:n] = self._torch.stack([v.reshape(()).float() for v in losses]).cpu().tolist()
        first = self.first
        rows = super().drain()
        # Reading the next batch is host work: its host time stays. The rest is device time.
        for name in DEVICE_PHASES:
            rows[name] = gpu[:, getattr(Phase, name.upper()) - 1]
        if isinstance(self.comm, CudaCommRecorder):  # the messages' device time, not their queueing
            rows["comm_total"] = self.comm.device_totals(first, n)
        return rows


class CudaCommRecorder(CommRecorder):
    """Per-message events timed on the device (see the module's docstring).

    Two preallocated CUDA events per message slot, grown with the slots; `drain` (between
    iterations) waits for each completed message's end event and reads the durations.
    Drain the phase recorder first: its `comm_total` column sums these durations.
    """

    def __init__(self, rank: int, clock_offset: int, epoch_ns: int, capacity: int = INITIAL_CAPACITY) -> None:
        import torch

        self._torch = torch
        self._began: list[Any] = []
        self._ended: list[Any] = []
        self._resolved = 0  # slots whose end time is already the device's
        super().__init__(rank, clock_offset, epoch_ns, capacity)

    def _alloc(self, capacity: int) -> None:
        super()._alloc(capacity)
        for events in (self._began, self._ended):  # keep the events of slots already in use
            events.extend(self._new_event() for _ in range(capacity - len(events)))

    def _new_event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def begin(self, iteration: int, op: str, name: str, dtype: str, nbytes: int, t_ns: int = 0) -> int:
        slot = super().begin(iteration, op, name, dtype, nbytes, t_ns)
        self._began[slot].record()
        return slot

    def end(self, slot: int, t_ns: int = 0) -> None:
        """Call where the current stream waits for the message (a CUDA future's callback)."""
        self._ended[slot].record()
        super().end(slot, t_ns)

    def _resolve(self) -> None:
        """End times of the messages recorded so far become start + device duration."""
        for i in range(self._resolved, self._n):
            if self._t1[i]:  # completed (a message never completed keeps t_end = t_start)
                self._ended[i].synchronize()
                self._t1[i] = self._t0[i] + round(self._began[i].elapsed_time(self._ended[i]) * 1e6)
        self._resolved = self._n

    def device_totals(self, first: int, count: int) -> np.ndarray:
        """Seconds of device time of the messages of iterations first .. first+count-1."""
        self._resolve()
        n = self._n
        iteration = self._iteration[:n] - first
        inside = (iteration >= 0) & (iteration < count) & (self._t1[:n] > 0)
        durations = (self._t1[:n] - self._t0[:n])[inside] / 1e9
        return np.bincount(iteration[inside], weights=durations, minlength=count)[:count]

    def drain(self) -> np.ndarray:
        self._resolve()
        self._resolved = 0
        return super().drain()
