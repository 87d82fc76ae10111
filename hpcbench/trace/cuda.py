"""Timing on the GPU: CUDA events recorded on the stream the work is queued on, read afterwards.

`CudaRecorder` keeps the CPU marks of `Recorder` (t_start / t_end stay host times on the
common clock) and also records a CUDA event at the marks that bound a device phase, on the
stream the work was queued on. Phase durations then come from the events: what the device
spent between the marks, not when the host queued the kernels (the `data` phase, host
work, keeps its host time). A phase marked several times ends at its last mark, on the
device too (re-recording an event moves it): the exchanges' hooks mark `backward` each
time a gradient is ready. Marks are recorded on the stream current when the iteration
started (the training stream, which autograd's threads also run backward on), looked up
once per iteration. Nothing waits for the device inside a step: events live in a ring of
`capacity` rows and are read in `drain`, between iterations, after one synchronisation on
the last event recorded.

A mark is on the hot path of a step that, for a small model, is the host's launch time
alone, so it does as little as it can (in a tight loop on an H200's host, an iteration's
start, six marks and stop cost 17 µs, half of what an event at every mark, a stream looked
up through `torch.cuda.current_stream` and the Python wrapper of `Event.record` cost; in a
LeNet-5 step the events cost several times that: docs/benchmarks.md). Only the marks that
bound a device phase record an event: the iteration's start (the device's h2d begins there:
the `data` phase is host work and queues nothing) and the end of each phase from h2d on;
`data`'s mark and `stop` are host marks alone. Whether a phase was marked is read from its
host mark. The current stream is looked up by its id and kept, and events are recorded
through the C method.

`device_every` (default 1: every iteration) records the events on every N-th iteration only
(those whose index is a multiple of N) and keeps the host marks' times for the others, for the
phases and for the messages: fewer calls into the CUDA runtime inside a launch-bound step, at
the price of device times for a sample of the iterations only. `device_rows` of the last
`drain` says which rows are the device's.

`CudaCommRecorder` times each gradient message on the device. With NCCL, a collective's
future completes on the host as soon as the collective is queued, so host clocks would
time the queueing (microseconds), not the transfer. Instead an event is recorded where the
message is handed over (on the stream that produced the gradients) and another where its
completion is seen: inside the future's callback, whose current stream waits for the
collective's kernels. A message's `t_start` stays the host time it was handed over and
`t_end - t_start` is the device time from then until the collective finished.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hpcbench.trace.messages import INITIAL_CAPACITY, CommRecorder
from hpcbench.trace.recorder import _START, Phase, Recorder

DEVICE_PHASES = ("h2d", "forward", "backward", "comm", "update")


class _CurrentStream:
    """A device's current stream as a `torch.cuda.Stream`, kept per stream id: a lookup is
    one C call (`torch.cuda.current_stream` also builds a new Python object every time)."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        index = torch.device(device).index if device is not None else None
        self._index = torch.cuda.current_device() if index is None else index
        self._lookup = torch._C._cuda_getCurrentStream
        self._streams: dict[tuple[int, int, int], Any] = {}

    def __call__(self) -> Any:
        key = self._lookup(self._index)
        stream = self._streams.get(key)
        if stream is None:
            stream_id, index, kind = key
            stream = self._streams[key] = self._torch.cuda.Stream(  # type: ignore[no-untyped-call]
                stream_id=stream_id, device_index=index, device_type=kind
            )
        return stream


def _every(device_every: int) -> int:
    if device_every < 1:
        raise ValueError(f"device_every must be >= 1 (every N-th iteration timed on the device), got {device_every}")
    return device_every


def _record_method() -> Any:
    """`Event.record(stream)` without the Python wrapper's frame (and its stream lookup)."""
    import torch

    return torch._C._CudaEventBase.record


class CudaRecorder(Recorder):
    def __init__(self, capacity: int, clock_offset: int, epoch_ns: int, device: Any, device_every: int = 1) -> None:
        super().__init__(capacity, clock_offset, epoch_ns)
        import torch

        self.device_every = _every(device_every)
        self._device_rows = np.zeros(capacity, dtype=bool)  # rows whose events were recorded
        self._timing = True  # the iteration being recorded records events
        self.device_rows = np.zeros(0, dtype=bool)  # of the last drain

        self._torch = torch
        self._current_stream = _CurrentStream(device)
        self._record = _record_method()
        self._elapsed = torch._C._CudaEventBase.elapsed_time
        # one preallocated event per device mark of each row: no allocation on the hot path
        # (column _START, then each phase's end; DATA's column stays unused)
        self._events = [
            [torch.cuda.Event(enable_timing=True) for _ in range(Phase.UPDATE + 1)]  # type: ignore[no-untyped-call]
            for _ in range(capacity)
        ]
        self._row_events: list[Any] = self._events[0]
        self._stream: Any = None

    def start(self, warmup: bool = False) -> None:
        super().start(warmup)
        row = self._row
        self._timing = timing = self.device_every == 1 or (self._first + row) % self.device_every == 0
        self._device_rows[row] = timing
        if timing:
            self._stream = stream = self._current_stream()
            self._row_events = events = self._events[row]
            self._record(events[_START], stream)

    def mark(self, phase: int) -> None:
        self._cur[phase] = time.perf_counter_ns()
        if self._timing and phase != Phase.DATA:
            self._record(self._row_events[phase], self._stream)

    def mark_at(self, phase: int, t_ns: int) -> None:
        """A host time measured elsewhere; on the device the phase ends where this is called."""
        super().mark_at(phase, t_ns)
        if self._timing and phase != Phase.DATA:
            self._record(self._row_events[phase], self._stream)

    def drain(self) -> np.ndarray:
        n = len(self)
        device_rows = self._device_rows[:n].copy()
        marked = self._marks[:n] != 0  # start() zeroes a row: a phase was marked iff its host mark is set
        marked[:, Phase.DATA] = False  # a host mark alone
        marked &= device_rows[:, None]  # a row of host marks only records no event
        timed = np.flatnonzero(device_rows)
        if timed.size:
            i = int(timed[-1])
            last = int(np.flatnonzero(marked[i, : Phase.UPDATE + 1])[-1])
            self._events[i][last].synchronize()  # the device has reached the last mark
        # each marked phase's device time runs from the previous marked column (START at least)
        columns = np.arange(Phase.UPDATE + 1)
        previous = np.maximum.accumulate(np.where(marked[:, : Phase.UPDATE + 1], columns, 0), axis=1)
        rows_i, phases = np.nonzero(marked[:, Phase.H2D : Phase.UPDATE + 1])
        phases += Phase.H2D
        froms = previous[rows_i, phases - 1]
        events, elapsed = self._events, self._elapsed
        gpu = np.zeros((n, Phase.UPDATE), dtype=np.float64)
        gpu[rows_i, phases - 1] = [
            elapsed(events[i][a], events[i][b])
            for i, a, b in zip(rows_i.tolist(), froms.tolist(), phases.tolist(), strict=True)
        ]
        gpu /= 1e3  # ms -> s
        losses = self._loss[:n]
        if n and all(isinstance(v, self._torch.Tensor) and v.shape == losses[0].shape for v in losses):
            # one stack and one copy to the host for the block (14 µs per row with a reshape
            # and a cast of each), not one wait for the device per iteration
            self._loss[:n] = self._torch.stack(losses).reshape(n).float().cpu().tolist()
        first = self.first
        rows = super().drain()
        # Reading the next batch is host work: its host time stays. The rest is device time
        # (on the rows timed on the device; the others keep their host marks' times).
        for name in DEVICE_PHASES:
            rows[name] = np.where(device_rows, gpu[:, getattr(Phase, name.upper()) - 1], rows[name])
        self.device_rows = device_rows
        if isinstance(self.comm, CudaCommRecorder):  # the messages' device time, not their queueing
            rows["comm_total"] = self.comm.device_totals(first, n)
        return rows


class CudaCommRecorder(CommRecorder):
    """Per-message events timed on the device (see the module's docstring).

    Two preallocated CUDA events per message slot, grown with the slots; `drain` (between
    iterations) waits for each completed message's end event and reads the durations. With
    `device_every` N > 1 only the messages of every N-th iteration are timed so; the others
    keep their host times.
    Drain the phase recorder first: its `comm_total` column sums these durations.
    """

    def __init__(
        self,
        rank: int,
        clock_offset: int,
        epoch_ns: int,
        capacity: int = INITIAL_CAPACITY,
        device: Any = None,
        device_every: int = 1,
    ) -> None:
        """`device`: the training device (default: the current one when this is made);
        `device_every`: time the messages of every N-th iteration on the device, the others
        by their host times (as `CudaRecorder`'s)."""
        import torch

        self._torch = torch
        self.device_every = _every(device_every)
        self._began: list[Any] = []
        self._ended: list[Any] = []
        self._timed: list[bool] = []  # per slot: its events were recorded
        self._resolved = 0  # slots whose end time is already the device's
        self._current_stream = _CurrentStream(device)
        self._record = _record_method()
        super().__init__(rank, clock_offset, epoch_ns, capacity)

    def _alloc(self, capacity: int) -> None:
        super()._alloc(capacity)
        for events in (self._began, self._ended):  # keep the events of slots already in use
            events.extend(self._new_event() for _ in range(capacity - len(events)))
        self._timed.extend([True] * (capacity - len(self._timed)))

    def _new_event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def begin(
        self, iteration: int, op: str, name: str, dtype: str, nbytes: int, t_ns: int = 0, axis: str = "dp"
    ) -> int:
        slot = super().begin(iteration, op, name, dtype, nbytes, t_ns, axis)
        timed = self._timed[slot] = self.device_every == 1 or iteration % self.device_every == 0
        if timed:
            self._record(self._began[slot], self._current_stream())
        return slot

    def end(self, slot: int, t_ns: int = 0) -> None:
        """Call where the current stream waits for the message (a CUDA future's callback)."""
        if self._timed[slot]:
            self._record(self._ended[slot], self._current_stream())
        super().end(slot, t_ns)

    def _resolve(self) -> None:
        """End times of the messages recorded so far become start + device duration."""
        for i in range(self._resolved, self._n):
            if self._t1[i] and self._timed[i]:  # completed (one never completed keeps t_end = t_start)
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
