"""Stopping a point together when its job is told to stop, keeping every iteration run.

Slurm ends a cancelled, requeued or preempted job with SIGTERM, and sends the signal asked
with `--signal` (SIGUSR2 here) ahead of the time limit; a rank that ran on until SIGKILL
lost every iteration since its last flush. Instead, on SIGTERM, SIGINT, SIGUSR1 or SIGUSR2:

* the handler only notes the signal (`StopSignals`), whatever the rank is doing;
* a thread per rank (`Stop`) sees the note, or a peer's notice for a rank the signal
  missed, tells every peer once (it got the signal itself), and posts one non-blocking
  all-gather of the iteration it proposes to stop before: the one after the iteration its
  training loop is in;
* the training loop stores its iteration and checks one attribute per iteration
  (`pending`); once set, `may_start(i)` lets it run up to its proposal, waits there for the
  agreement, then runs on up to the largest proposal, where every rank stops.

No rank waits on a peer that waits on it: the threads post the proposals, not the loops,
so a loop blocked in the framework's collective does not hold up the agreement; a loop
starts no iteration at or past its own proposal before the agreement ends; then every rank
runs up to the same largest proposal, so each framework collective of those iterations
has all its ranks. The end of the loop is a proposal too (the iteration count), so a rank
that finished never leaves a peer waiting. The steady-state step pays one attribute store
and one attribute check; the agreement itself runs once per point.

Ranks joined by MPI agree over a duplicate of its communicator; a single rank agrees with
itself. Ranks with no MPI between them (torchrun's gloo) have no non-blocking collective
here: `Stop.available` is False and the worker leaves the signals as they were.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from hpcbench.rank.collectives import Comm

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_CODE = 75  # EX_TEMPFAIL: stopped on request, every row kept, resumable
TIME_LIMIT_SIGNAL_ENV = "HPCBENCH_TIME_LIMIT_SIGNAL"  # the signal a job gets ahead of its time limit (USR2)
IDLE_S = 0.05  # how often a rank's thread looks for a signal or a peer's notice
BUSY_S = 0.002  # how often it tests the agreement once posted
_NOTICE_TAG = 17


def reason_for(signum: int, env: Mapping[str, str] | None = None) -> str:
    """What a rank can tell of why it was stopped: `time limit` for the signal the job asked
    for ahead of its limit, else `signal N (NAME)` (the executor refines it: cancelled,
    requeued, preempted)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown"
    wanted = (os.environ if env is None else env).get(TIME_LIMIT_SIGNAL_ENV, "")
    if wanted and name in (wanted, f"SIG{wanted}"):
        return "time limit"
    return f"signal {signum} ({name})"


class StopSignals:
    """Notes the first stop signal (`signum`, 0 until one comes) and does nothing else."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Replace the handlers of STOP_SIGNALS (the default's death, submitit's own) with a note."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._note)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self.signum:
            self.signum = signum


class _MPIChannel:
    """Notices and the one agreement over a duplicate of the ranks' MPI communicator."""

    def __init__(self, mpi_comm: Any) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = mpi_comm.Dup()
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._notice = bytearray(8)
        self._inbox = self._comm.Irecv(self._notice, source=MPI.ANY_SOURCE, tag=_NOTICE_TAG)
        self._status = MPI.Status()
        self._heard_from = -1
        self._sent: list[Any] = []
        self._gather: Any = None
        self._rows: Any = None

    def notice(self) -> int:
        """The signal a peer told of, 0 if none yet."""
        if self._heard_from < 0 and self._inbox.Test(self._status):
            self._heard_from = self._status.Get_source()
            return int.from_bytes(self._notice, "little") or signal.SIGTERM
        return 0

    def tell_peers(self, signum: int) -> None:
        note = signum.to_bytes(8, "little")
        self._sent = [self._comm.Isend(note, dest=r, tag=_NOTICE_TAG) for r in range(self.size) if r != self.rank]

    def post(self, row: tuple[int, int, int]) -> None:
        import numpy as np

        self._mine = np.array(row, dtype=np.int64)
        self._rows = np.zeros((self.size, 3), dtype=np.int64)
        self._gather = self._comm.Iallgather(self._mine, self._rows)

    def result(self) -> list[tuple[int, int, int]] | None:
        if self._gather is None or not self._gather.Test():
            return None
        return [(int(a), int(b), int(c)) for a, b, c in self._rows]

    def close(self, senders: list[int] | None) -> None:
        """Receive every notice sent (`senders`, known once agreed), then free what is left;
        None: no agreement (the job is being aborted): free what can be freed, wait for nothing."""
        expected = [] if senders is None else [r for r in senders if r != self.rank and r != self._heard_from]
        if self._heard_from < 0 and expected:
            self._inbox.Wait(self._status)
            expected.remove(self._status.Get_source())
        elif self._heard_from < 0:
            self._inbox.Cancel()
            if senders is not None:
                self._inbox.Wait()
        for source in expected:
            self._comm.Recv(bytearray(8), source=source, tag=_NOTICE_TAG)
        if senders is not None:
            self._mpi.Request.Waitall(self._sent)
            self._comm.Free()


class _SelfChannel:
    """One rank agrees with itself."""

    rank, size = 0, 1

    def __init__(self) -> None:
        self._row: tuple[int, int, int] | None = None

    def notice(self) -> int:
        return 0

    def tell_peers(self, signum: int) -> None:
        pass

    def post(self, row: tuple[int, int, int]) -> None:
        self._row = row

    def result(self) -> list[tuple[int, int, int]] | None:
        return None if self._row is None else [self._row]

    def close(self, senders: list[int] | None) -> None:
        pass


def _thread_multiple() -> bool:
    from mpi4py import MPI

    return bool(MPI.Query_thread() >= MPI.THREAD_MULTIPLE)


class Stop:
    """The ranks' agreement on where to stop; see the module's docstring for the protocol."""

    def __init__(self, n_iterations: int, comm: Comm, signals: StopSignals) -> None:
        self.pending = False  # the loop's one check per iteration
        self.current = -1  # the iteration the loop is in (stored by the loop)
        self.limit = n_iterations  # the loop starts no iteration at or past this
        self.signum = 0  # the agreed signal: 0 if none
        self._n = n_iterations
        self._signals = signals
        self._lock = threading.Lock()
        self._decided = threading.Event()
        self._closing = threading.Event()
        self._posted = False
        self._end = False
        self._senders: list[int] | None = None
        self._channel: _MPIChannel | _SelfChannel | None = None
        if comm.size == 1:
            self._channel = _SelfChannel()
        elif comm.mpi_comm is not None and _thread_multiple():
            self._channel = _MPIChannel(comm.mpi_comm)  # collective: every rank builds its Stop together
        self._thread = threading.Thread(target=self._watch, name="hpcbench-stop", daemon=True)

    @property
    def available(self) -> bool:
        return self._channel is not None

    def start(self) -> None:
        if self._channel is not None:
            self._thread.start()

    def may_start(self, i: int) -> bool:
        """Whether the loop may start iteration `i` (called once `pending` is set)."""
        with self._lock:
            if not self._posted or i < self.limit:
                return True
        self._wait()
        return i < self.limit

    def finish(self) -> int:
        """At the end of the loop: the iterations every rank ran (the agreed stop, or all)."""
        if self._channel is None:
            return self._n
        self._end = True
        self.pending = True
        self._wait()
        return self.limit

    def _wait(self) -> None:
        while not self._decided.wait(1.0):
            if not self._thread.is_alive():  # it said why on stderr; the worker's failure ends every rank
                raise RuntimeError("the stop agreement thread ended without an agreement")

    def close(self) -> None:
        """Receive the notices still on their way and release the channel (after `finish`)."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._channel is not None:
            self._channel.close(self._senders if self._decided.is_set() else None)

    def _watch(self) -> None:
        channel = self._channel
        assert channel is not None
        try:
            while not self._closing.is_set():
                if not self._posted:
                    own = self._signals.signum
                    signum = own or channel.notice()
                    if signum or self._end:
                        self._propose(channel, signum, own)
                elif (rows := channel.result()) is not None:
                    self._decide(rows)
                    return
                self._closing.wait(BUSY_S if self._posted else IDLE_S)
        except Exception as exc:  # noqa: BLE001 - said on stderr; the loop then raises in finish
            print(f"hpcbench.worker: stop agreement failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _propose(self, channel: _MPIChannel | _SelfChannel, signum: int, own: int) -> None:
        self.pending = True  # before reading `current`: the loop takes the lock from its next iteration on
        with self._lock:
            proposal = min(self._n, self.current + 1)
            self.limit = proposal
            self._posted = True
        if own:
            channel.tell_peers(own)
        channel.post((proposal, signum, 1 if own else 0))

    def _decide(self, rows: list[tuple[int, int, int]]) -> None:
        with self._lock:
            self.limit = max(r[0] for r in rows)
            self.signum = max(r[1] for r in rows)
            self._senders = [rank for rank, r in enumerate(rows) if r[2]]
        self._decided.set()
