"""Timestamps taken by MXNet's dependency engine: when an array became ready, without waiting.

MXNet runs every operation asynchronously: a Python call only queues it, and a wait
(`wait_to_read`, `waitall`) inside a step would serialise what the engine overlaps (the
gradient pushes or all-reduces of early layers run while backward still computes later
ones). To time each gradient message without such a wait, a tiny operation is queued
behind the message with the engine's own dependency tracking (`MXEnginePushSyncND`): one
that *reads* an array runs as soon as every queued write of it has finished (the gradient
computed, the pulled weights arrived); one that *writes* it runs when every queued read of
it has finished (a push has sent it). The operation only stores `perf_counter_ns()` into a
preallocated slot. It runs on the engine's prioritised CPU workers (the threads MXNet's own
kvstore operations use), not on the compute workers, so it neither waits behind queued
compute nor takes a compute thread. Its cost, measured on the 2-core development VM: about
6 µs to queue (the engine's own bookkeeping; the Python side is 0.5 µs) and 6 µs for the
callback, which takes the GIL on an engine thread; an elementwise MXNet operation costs
30 µs there. A C callback would save the second part, but needs a compiled helper.

Only `exchange.py` imports this module (the adapter imports that one lazily): it needs mxnet.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import mxnet as mx
import numpy as np

_SYNC_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)  # EngineSyncFunc(RunContext*, param)
_CPU_PRIORITIZED = 3  # mxnet::FnProperty::kCPUPrioritized (include/mxnet/engine.h)
_STAMP_PRIORITY = 1 << 20  # ahead of anything else queued on those workers
_DEVICE_TYPES = {"cpu": 1, "gpu": 2, "cpu_pinned": 3, "cpu_shared": 5}  # mxnet::Context::DeviceType


class Stamps:
    """Up to `capacity` engine timestamps per step, slot-addressed, reset by `clear`."""

    def __init__(self, capacity: int, ctx: Any = None) -> None:
        ctx = ctx or mx.cpu()
        self.t = np.zeros(capacity, dtype=np.int64)
        self._lib = mx.base._LIB
        self._push = self._lib.MXEnginePushSyncND
        self._callback = _SYNC_FUNC(self._stamp)  # kept alive as long as the engine may call it
        # The engine copies the Context it is given; a stamp only reads a clock, so the
        # context matters for scheduling only (a GPU array's stamp runs after its GPU op).
        self._ctx = (ctypes.c_int32 * 2)(_DEVICE_TYPES.get(ctx.device_type, 1), ctx.device_id)
        self._prop = ctypes.c_int(_CPU_PRIORITIZED)
        self._empty = (ctypes.c_void_p * 1)()

    def _stamp(self, _rctx: int | None, param: int | None) -> None:
        self.t[(param or 0) - 1] = time.perf_counter_ns()

    def clear(self) -> None:
        self.t[:] = 0

    def _queue(self, slot: int, reads: Any, n_reads: int, writes: Any, n_writes: int) -> None:
        rc = self._push(
            self._callback,
            ctypes.c_void_p(slot + 1),  # a slot number, not a pointer: 0 would arrive as NULL
            None,
            ctypes.byref(self._ctx),
            reads,
            n_reads,
            writes,
            n_writes,
            ctypes.byref(self._prop),
            _STAMP_PRIORITY,
            None,
        )
        if rc != 0:
            raise mx.base.MXNetError(mx.base.py_str(self._lib.MXGetLastError()))

    def when_written(self, slot: int, array: Ref) -> None:
        """Stamp `slot` once every write queued so far on `array` (each of its arrays) has finished (it is ready)."""
        self._queue(slot, array, len(array), self._empty, 0)

    def when_read(self, slot: int, array: Ref) -> None:
        """Stamp `slot` once every read and write queued so far on `array` (each of its arrays) has finished."""
        self._queue(slot, self._empty, 0, array, len(array))


Ref = Any  # a ctypes array holding NDArray handles: one array's, or its copies' on several contexts (see `ref`)


def ref(*arrays: Any) -> Ref:
    """What `Stamps` takes for `arrays` (one array, or its copies on a rank's contexts): made
    once, off the hot path (the arrays must outlive its uses; their handles are stable for
    their lifetime)."""
    return (ctypes.c_void_p * len(arrays))(*(a.handle for a in arrays))
