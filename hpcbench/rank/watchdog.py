"""Ends a point whose rank stops making progress, instead of letting the job hang.

A rank stuck in a collective waits for a peer forever; the peer may be stuck itself. Every
rank runs this thread: when no iteration has finished for `timeout_s`, it says so on
stderr (an account, see hpcbench.rank.failures) and aborts the whole job (MPI_Abort, or exit
under torchrun), so the point ends failed with that reason. The training loop only stores a timestamp per iteration.
"""

from __future__ import annotations

import threading
import time

from hpcbench.rank.collectives import Comm
from hpcbench.rank.failures import write_account

EXIT_CODE = 3


class Watchdog:
    def __init__(self, timeout_s: float, comm: Comm, point_id: str) -> None:
        self.timeout_s = timeout_s
        self._comm = comm
        self._point_id = point_id
        self._last = time.monotonic()
        self._iteration = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpcbench-watchdog", daemon=True)

    def start(self) -> None:
        self._last = time.monotonic()
        self._thread.start()

    def beat(self, iteration: int) -> None:
        """An iteration finished (two stores: cheap enough for every iteration)."""
        self._last = time.monotonic()
        self._iteration = iteration

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                write_account(
                    self._comm.rank,
                    self._point_id,
                    f"stalled: no iteration finished for {idle:.0f} s (limit {self.timeout_s:g} s, "
                    f"last finished iteration {self._iteration})",
                )
                self._comm.abort(EXIT_CODE)
                return
