"""Per-iteration phase timing with preallocated buffers.

Recording is a store of `perf_counter_ns()` into a slot of a preallocated int64 array (a
few hundred nanoseconds, no allocation); conversion to the stored layout happens in
`drain`, between iterations, when a block is written out. Nothing here synchronises with
other ranks or with a device.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from hpcbench.store.schema import ITERATION_DTYPE, PHASES
from hpcbench.trace.messages import CommRecorder


class Phase:
    """Column of each phase's end mark; column 0 is the iteration's start, 7 its end.

    Plain ints, not an IntEnum: indexing an array with an enum member costs twice as much,
    and these indices sit on the hot path.
    """

    DATA = 1
    H2D = 2
    FORWARD = 3
    BACKWARD = 4
    COMM = 5
    UPDATE = 6


_START, _END = 0, 7
_N_MARKS = 8
_COLUMNS = {name: getattr(Phase, name.upper()) for name in PHASES}
assert sorted(_COLUMNS.values()) == list(range(1, 7))


def clock_offset_ns() -> int:
    """Wall clock minus this process's monotonic clock: maps perf_counter_ns to a shared clock."""
    # Take the pair whose reads are closest together, to bound the error by that gap.
    best = None
    for _ in range(5):
        a = time.perf_counter_ns()
        wall = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    assert best is not None
    return best[1]


class Recorder:
    """Phase marks of up to `capacity` iterations, then `drain()`.

    Protocol per iteration: `start(warmup)`, any increasing subset of `mark(phase)`
    (unmarked phases last 0 s), optionally `add_comm(ns)`, then `stop(samples, loss)`.
    """

    def __init__(self, capacity: int, clock_offset: int, epoch_ns: int) -> None:
        self.capacity = capacity
        self._marks = np.zeros((capacity, _N_MARKS), dtype=np.int64)
        self._comm_total = np.zeros(capacity, dtype=np.int64)
        self._samples = np.zeros(capacity, dtype=np.int32)
        self._warmup = np.zeros(capacity, dtype=bool)
        self._loss: list[Any] = [None] * capacity
        self._row = 0
        self._cur = self._marks[0]
        self._first = 0  # iteration index of row 0
        self._offset = clock_offset - epoch_ns
        self.comm: CommRecorder | None = None  # per-message events, where the backend exposes them

    @property
    def full(self) -> bool:
        return self._row >= self.capacity

    @property
    def first(self) -> int:
        return self._first

    @property
    def iteration(self) -> int:
        """Index of the iteration being recorded (between start and stop)."""
        return self._first + self._row

    def __len__(self) -> int:
        return self._row

    def start(self, warmup: bool = False) -> None:
        self._cur = cur = self._marks[self._row]
        cur[:] = 0
        cur[_START] = time.perf_counter_ns()
        self._warmup[self._row] = warmup
        self._comm_total[self._row] = 0

    def mark(self, phase: int) -> None:
        self._cur[phase] = time.perf_counter_ns()

    def mark_at(self, phase: int, t_ns: int) -> None:
        """A phase end measured elsewhere (e.g. in a communication hook), on perf_counter_ns."""
        self._cur[phase] = t_ns

    def add_comm(self, duration_ns: int) -> None:
        self._comm_total[self._row] += duration_ns

    def stop(self, samples: int, loss: Any = None) -> None:
        self._cur[_END] = time.perf_counter_ns()
        self._samples[self._row] = samples
        self._loss[self._row] = loss
        self._row += 1

    def drain(self) -> np.ndarray:
        """The recorded rows in ITERATION_DTYPE, and an empty buffer for the next block."""
        n = self._row
        marks = self._marks[:n].copy()
        # An unmarked phase (0) ends where the previous one ended: a running maximum fills it.
        np.maximum.accumulate(marks, axis=1, out=marks)
        rows = np.zeros(n, dtype=ITERATION_DTYPE)
        rows["t_start"] = (marks[:, _START] + self._offset) / 1e9
        rows["t_end"] = (marks[:, _END] + self._offset) / 1e9
        durations = np.diff(marks[:, : Phase.UPDATE + 1], axis=1) / 1e9
        for name, column in _COLUMNS.items():
            rows[name] = durations[:, column - 1]
        rows["comm_total"] = self._comm_total[:n] / 1e9
        rows["samples"] = self._samples[:n]
        rows["warmup"] = self._warmup[:n]
        rows["loss"] = [np.nan if v is None else float(v) for v in self._loss[:n]]
        self._loss[:n] = [None] * n
        self._first += n
        self._row = 0
        return rows


class NullRecorder(Recorder):
    """Same interface, records nothing: the 'recording off' arm of the overhead benchmark."""

    def start(self, warmup: bool = False) -> None:
        pass

    def mark(self, phase: int) -> None:
        pass

    def mark_at(self, phase: int, t_ns: int) -> None:
        pass

    def add_comm(self, duration_ns: int) -> None:
        pass

    def stop(self, samples: int, loss: Any = None) -> None:
        pass
