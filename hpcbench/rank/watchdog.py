"""Ends a point whose rank stops making progress, instead of letting the job hang.

A rank stuck in a collective waits for a peer forever; the peer may be stuck itself, or gone
with its node's link. Every rank runs this thread: when no iteration has finished for
`timeout_s`, it finds out what it waits in and whom it can still reach, says so on stderr (an
account, see hpcbench.rank.failures) and aborts the whole job (MPI_Abort, or exit under
torchrun), so the point ends failed with that reason. The account names:

* the message the rank is in (the oldest one begun and not ended: collective, tensor, bytes,
  iteration); else the collective step outside the exchange it is in (a flush of recorded rows,
  a test pass: see `during`); else that it is in none (stuck in compute or data);
* its peers as a probe of each found them (hpcbench.rank.peers): unreachable (a link down, a
  partition), gone (their process ended), or answering with their own last iteration and
  message.

The training loop only stores a timestamp per iteration; the probes are answered by a thread
of their own and sent only once a stall is seen.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from hpcbench.rank.collectives import Comm
from hpcbench.rank.failures import write_account
from hpcbench.rank.peers import PROBE_S, REFUSED, UNREACHABLE, Contact, Responder, probe, summary

EXIT_CODE = 3


class Watchdog:
    def __init__(self, timeout_s: float, comm: Comm, point_id: str, in_flight: Callable[[], str] | None = None) -> None:
        """`in_flight`: the message this rank waits in, as text ('' when none), read from the
        watchdog's thread (CommRecorder.in_flight)."""
        self.timeout_s = timeout_s
        self._comm = comm
        self._point_id = point_id
        self._in_flight = in_flight
        self._last = time.monotonic()
        self._iteration = -1
        self._doing = ""  # the collective step outside the exchange under way ('' when none)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpcbench-watchdog", daemon=True)
        self._responder: Responder | None = None
        self._contacts: list[Contact] = []
        self.lost_peers = False  # the stall's probe found a peer unreachable or gone

    def start(self) -> None:
        """Collective, before the timed loop: the ranks exchange where they answer probes."""
        if self._comm.size > 1:
            with contextlib.suppress(OSError):  # no port to answer on: peers will see this rank unreachable
                self._responder = Responder(self._comm.rank, self.state)
            mine = self._responder.contact() if self._responder is not None else None
            self._contacts = [c for c in self._comm.allgather(mine) if c is not None]
        self._last = time.monotonic()
        self._thread.start()

    def beat(self, iteration: int) -> None:
        """An iteration finished (two stores: cheap enough for every iteration)."""
        self._last = time.monotonic()
        self._iteration = iteration

    @contextlib.contextmanager
    def during(self, step: str) -> Iterator[None]:
        """Around a collective step between iterations (a flush, a test pass): a stall in it is
        named as that step (two stores, off the timed phases)."""
        self._doing = step
        try:
            yield
        finally:
            self._doing = ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._responder is not None:
            self._responder.close()

    def waiting_in(self) -> str:
        """'waiting in MESSAGE', 'in STEP' (see `during`) or '' when the rank is in neither."""
        flight = ""
        if self._in_flight is not None:
            with contextlib.suppress(IndexError, ValueError):  # raced a drain: say nothing rather than fail
                flight = self._in_flight()
        if flight:
            return f"waiting in {flight}"
        doing = self._doing
        return f"in {doing}" if doing else ""

    def state(self) -> str:
        """What this rank is doing, as its answer to a peer's probe."""
        flight = self.waiting_in()
        return f"last finished iteration {self._iteration}" + (f", {flight}" if flight else "")

    def account(self, idle: float) -> str:
        """The stall's account: how long, what in, which peers (probed now, up to PROBE_S)."""
        flight = self.waiting_in()
        what = (
            f"stalled: no iteration finished for {idle:.0f} s (limit {self.timeout_s:g} s, "
            f"last finished iteration {self._iteration}); "
        )
        what += flight or "in no message (stuck outside the exchange)"
        self.lost_peers = False
        if self._contacts:
            replies = probe(self._contacts, self._comm.rank)
            self.lost_peers = any(r.outcome in (UNREACHABLE, REFUSED) for r in replies)
            what += "; peers " + summary(replies)
        return what

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                what = self.account(idle)
                if self._stop.is_set():  # the loop ended while the peers were probed
                    return
                write_account(self._comm.rank, self._point_id, what)
                # Every peer answered: this rank cannot name the cause. The ranks that lost a peer
                # are still probing it (PROBE_S); let them write their accounts before this abort
                # ends them (unless the loop went on after all).
                if self._contacts and not self.lost_peers and self._stop.wait(PROBE_S + 2):
                    return
                self._comm.abort(EXIT_CODE)
                return


def watched(watchdog: Watchdog | None, step: str) -> contextlib.AbstractContextManager[None]:
    """`watchdog.during(step)`, or nothing when no watchdog runs."""
    return watchdog.during(step) if watchdog is not None else contextlib.nullcontext()
