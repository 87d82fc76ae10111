"""Phase timing on the GPU: CUDA events recorded on the current stream, read afterwards.

`CudaRecorder` keeps the CPU marks of `Recorder` (t_start / t_end stay host times on the
common clock) and also records a CUDA event at every mark, on the stream the work was
queued on. Phase durations then come from the events: what the device spent between the
marks, not when the host queued the kernels (the `data` phase, host work, keeps its host
time). Nothing waits for the device inside a step:
events live in a ring of `capacity` rows and are read in `drain`, between iterations, after
one synchronisation on the last event recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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

    def start(self, warmup: bool = False) -> None:
        super().start(warmup)
        row = self._row
        self._marked[row] = False
        self._events[row][_START].record()
        self._marked[row, _START] = True

    def mark(self, phase: int) -> None:
        super().mark(phase)
        self._events[self._row][phase].record()
        self._marked[self._row, phase] = True

    def stop(self, samples: int, loss: Any = None) -> None:
        self._events[self._row][_END].record()
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
        rows = super().drain()
        # Reading the next batch is host work: its host time stays. The rest is device time.
        for name in DEVICE_PHASES:
            rows[name] = gpu[:, getattr(Phase, name.upper()) - 1]
        return rows
