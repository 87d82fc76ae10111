"""Per-message communication events, recorded from inside the backends' hooks.

`begin` runs where the message is handed to the backend (the training thread), `end` where
its completion is seen (often the backend's own thread); both are stores into preallocated
arrays. Strings (op, tensor name, dtype) are interned to small ints on the hot path and
turned back into text in `drain`, between iterations.
"""

from __future__ import annotations

import time

import numpy as np

from hpcbench.store.schema import COMM_DTYPE

INITIAL_CAPACITY = 4096


class CommRecorder:
    def __init__(self, rank: int, clock_offset: int, epoch_ns: int, capacity: int = INITIAL_CAPACITY) -> None:
        self.rank = rank
        self._offset = clock_offset - epoch_ns
        self._strings: dict[str, int] = {}
        self._text: list[bytes] = []
        self._alloc(capacity)
        self._n = 0

    def _alloc(self, capacity: int) -> None:
        self._cap = capacity
        self._iteration = np.zeros(capacity, dtype=np.int32)
        self._bytes = np.zeros(capacity, dtype=np.int64)
        self._t0 = np.zeros(capacity, dtype=np.int64)
        self._t1 = np.zeros(capacity, dtype=np.int64)
        self._codes = np.zeros((capacity, 4), dtype=np.int32)  # op, name, dtype, axis

    def _grow(self) -> None:
        # More messages between two flushes than expected: double (rare, amortised).
        old: tuple[np.ndarray, ...] = (self._iteration, self._bytes, self._t0, self._t1, self._codes)
        self._alloc(self._cap * 2)
        new: tuple[np.ndarray, ...] = (self._iteration, self._bytes, self._t0, self._t1, self._codes)
        for i, prev in enumerate(old):  # not zip(strict=): the Caffe environment's ranks run Python 3.9
            new[i][: len(prev)] = prev

    def _intern(self, text: str) -> int:
        code = self._strings.get(text)
        if code is None:
            code = self._strings[text] = len(self._text)
            self._text.append(text.encode()[:48])
        return code

    def begin(
        self, iteration: int, op: str, name: str, dtype: str, nbytes: int, t_ns: int = 0, axis: str = "dp"
    ) -> int:
        """A message handed to the backend at `t_ns` (perf_counter_ns; default now) on the
        group of mesh axis `axis`; its slot for `end`."""
        i = self._n
        if i == self._cap:
            self._grow()
        self._t0[i] = t_ns or time.perf_counter_ns()
        self._iteration[i] = iteration
        self._bytes[i] = nbytes
        codes = self._codes[i]
        codes[0] = self._intern(op)
        codes[1] = self._intern(name)
        codes[2] = self._intern(dtype)
        codes[3] = self._intern(axis)
        self._n = i + 1
        return i

    def end(self, slot: int, t_ns: int = 0) -> None:
        """The message's completion seen at `t_ns` (default now; any thread)."""
        self._t1[slot] = t_ns or time.perf_counter_ns()

    def __len__(self) -> int:
        return self._n

    def in_flight(self) -> str:
        """The oldest message begun and not ended since the last drain, as text ('' if none):
        what a stalled rank waits in, for its watchdog (another thread; a read that races a
        drain or an `end` only makes the answer stale)."""
        n = self._n
        waiting = np.flatnonzero(self._t1[:n] == 0)
        if not len(waiting):
            return ""
        i = int(waiting[0])
        op, name, _, axis = (self._text[c].decode(errors="replace") for c in self._codes[i])
        op = op if axis == "dp" else f"{op} ({axis})"
        more = f", {len(waiting) - 1} more after it" if len(waiting) > 1 else ""
        return f"{op} {name} ({int(self._bytes[i])} B, iteration {int(self._iteration[i])}{more})"

    def drain(self) -> np.ndarray:
        """Recorded messages as COMM_DTYPE rows (messages never completed have t_end = t_start)."""
        n = self._n
        rows = np.zeros(n, dtype=COMM_DTYPE)
        rows["rank"] = self.rank
        rows["iteration"] = self._iteration[:n]
        rows["bytes"] = self._bytes[:n]
        t0, t1 = self._t0[:n], self._t1[:n]
        rows["t_start"] = (t0 + self._offset) / 1e9
        rows["t_end"] = (np.where(t1 > 0, t1, t0) + self._offset) / 1e9
        text = np.array(self._text or [b""], dtype="S48")
        for column, field in enumerate(("op", "name", "dtype", "axis")):
            rows[field] = text[self._codes[:n, column]]
        self._t1[:n] = 0
        self._n = 0
        return rows
