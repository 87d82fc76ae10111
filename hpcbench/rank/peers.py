"""Which peers a stalled rank can still reach, so that a stall names the peer that was lost.

A rank stuck in a collective cannot tell from MPI or gloo which peer it waits for. Every rank
therefore answers a probe: a thread blocked in `accept` on a TCP port the OS picks (no work
until a probe comes), which writes one line, the rank and what it is doing (its last
finished iteration, the message it is in), and closes. The ranks' addresses and ports are
exchanged once, before the timed loop. When its watchdog sees a stall, a rank probes every
peer at once for at most `PROBE_S`:

* `answered`: the peer's thread replied (the network to it works; it is as stuck as we are,
  or not);
* `silent`: the connection was accepted (the network works) but no line came in time;
* `refused`: nothing listens there any more: the peer's process is gone;
* `unreachable`: no connection in time, or the network said the host cannot be reached: a
  link down, a partition, a node gone.

A connection is accepted by the kernel, so a loaded peer still counts as reachable. Nothing
here runs in a training step.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROBE_S = 3.0  # how long a stalled rank waits for its peers' answers
ANSWERED, SILENT, UNREACHABLE, REFUSED = "answered", "silent", "unreachable", "refused"
_RANK_OF = {ANSWERED: 3, SILENT: 2, UNREACHABLE: 1, REFUSED: 0}  # best outcome over a peer's addresses
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Contact:
    """Where a rank answers probes."""

    rank: int
    addresses: tuple[str, ...]
    port: int


@dataclass(frozen=True)
class Reply:
    """What a probe of one peer found: `outcome` (ANSWERED, ...), the address it concerns and,
    when answered, the peer's own line."""

    rank: int
    outcome: str
    address: str
    state: str = ""


def local_addresses() -> tuple[str, ...]:
    """This host's (this network namespace's) IPv4 addresses, loopback only when there is
    nothing else: a peer in another namespace reaches its own loopback, not ours."""
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = array.array("B", struct.pack("256s", name.encode()[:15]))
            try:
                fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            found.append(socket.inet_ntoa(request.tobytes()[20:24]))
    outside = [a for a in found if not a.startswith("127.")]
    return tuple(outside or found or ["127.0.0.1"])


class Responder:
    """Answers probes with `rank` and `state()` on a port of its own (see the module doc)."""

    def __init__(self, rank: int, state: Callable[[], str]) -> None:
        self._rank = rank
        self._state = state
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("", 0))
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="hpcbench-peer-answer", daemon=True)
        self._thread.start()

    def contact(self) -> Contact:
        return Contact(self._rank, local_addresses(), self.port)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            with conn, contextlib.suppress(OSError):
                conn.settimeout(1.0)
                line = f"{self._rank}\t{self._state()}".replace("\n", " ")
                conn.sendall(line.encode(errors="replace") + b"\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._sock.close()
        self._thread.join(timeout=2)


def _parse(rank: int, data: bytes) -> str | None:
    """The state in a peer's line, or None when the line is not that rank's (another
    namespace's process on the same address and port)."""
    who, _, state = data.partition(b"\n")[0].decode(errors="replace").partition("\t")
    return state if who == str(rank) else None


class _Probe:
    """The probes of one stall, on one selector (see `probe`)."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.best: dict[int, Reply] = {}

    def note(self, reply: Reply) -> None:
        held = self.best.get(reply.rank)
        if held is None or _RANK_OF[reply.outcome] > _RANK_OF[held.outcome]:
            self.best[reply.rank] = reply

    def connect(self, rank: int, address: str, port: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((address, port))
        if err in (0, errno.EINPROGRESS):
            self.sel.register(s, selectors.EVENT_WRITE, (rank, address, bytearray()))
            self.note(Reply(rank, UNREACHABLE, address))  # until it connects
        else:
            s.close()
            self.note(Reply(rank, REFUSED if err == errno.ECONNREFUSED else UNREACHABLE, address))

    def _done(self, s: socket.socket) -> None:
        self.sel.unregister(s)
        s.close()

    def event(self, s: socket.socket, events: int, rank: int, address: str, buf: bytearray) -> None:
        if events & selectors.EVENT_WRITE:  # connected, or refused
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if not err:
                self.note(Reply(rank, SILENT, address))
                self.sel.modify(s, selectors.EVENT_READ, (rank, address, buf))
                return
            self._done(s)
            held = self.best[rank]
            if err == errno.ECONNREFUSED and held.outcome == UNREACHABLE and held.address == address:
                self.best[rank] = Reply(rank, REFUSED, address)
            return
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        buf += data
        if data and b"\n" not in buf:
            return
        self._done(s)
        state = _parse(rank, bytes(buf))
        if state is not None:
            self.note(Reply(rank, ANSWERED, address, state))

    def run(self, timeout_s: float) -> list[Reply]:
        deadline = time.monotonic() + timeout_s
        while self.sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, events in self.sel.select(left):
                assert isinstance(key.fileobj, socket.socket)
                self.event(key.fileobj, events, *key.data)
        for key in list(self.sel.get_map().values()):
            assert isinstance(key.fileobj, socket.socket)
            key.fileobj.close()
        self.sel.close()
        return [self.best[r] for r in sorted(self.best)]


def probe(contacts: Sequence[Contact], me: int, timeout_s: float = PROBE_S) -> list[Reply]:
    """Probe every peer in `contacts` but `me`, all at once, for at most `timeout_s`; one
    Reply per peer, in rank order."""
    p = _Probe()
    for c in contacts:
        if c.rank != me:
            for address in c.addresses:
                p.connect(c.rank, address, c.port)
    return p.run(timeout_s)


def _ranks(replies: Sequence[Reply], limit: int = 6) -> str:
    """`rank 2 (10.0.0.4)` or `ranks 1 (10.0.0.3), 5 (10.0.0.7) and 3 more`."""
    shown = ", ".join(f"{r.rank} ({r.address})" for r in replies[:limit])
    more = f" and {len(replies) - limit} more" if len(replies) > limit else ""
    return f"{'rank' if len(replies) == 1 else 'ranks'} {shown}{more}"


def summary(replies: Sequence[Reply]) -> str:
    """The probe in a few words, the lost peers first: `unreachable: rank 2 (10.0.0.4);
    gone: ...; answered: ranks 0, 1 (last finished iteration 56, in allreduce ...)`."""
    parts = []
    lost = [r for r in replies if r.outcome == UNREACHABLE]
    gone = [r for r in replies if r.outcome == REFUSED]
    silent = [r for r in replies if r.outcome == SILENT]
    answered = [r for r in replies if r.outcome == ANSWERED]
    if lost:
        parts.append(f"unreachable: {_ranks(lost)}")
    if gone:
        parts.append(f"gone (connection refused): {_ranks(gone)}")
    if silent:
        parts.append(f"reached, no answer: {_ranks(silent)}")
    if answered:
        states: dict[str, list[int]] = {}
        for r in answered:
            states.setdefault(r.state, []).append(r.rank)
        common = max(states, key=lambda s: len(states[s]))
        ranks = states[common]
        shown = ", ".join(map(str, ranks[:6])) + (f" and {len(ranks) - 6} more" if len(ranks) > 6 else "")
        others = f"; {len(answered) - len(ranks)} more answered otherwise" if len(ranks) < len(answered) else ""
        parts.append(f"answered: rank{'s' if len(ranks) > 1 else ''} {shown} ({common}){others}")
    if len(lost) > 1 and not answered and not silent and not gone:
        parts.append("this rank reaches none of its peers: its own link is the likely fault")
    return "; ".join(parts)
