"""How a rank says why its point failed, and how the executors find that in the logs.

A rank that fails (an exception) or sees the job stall (its watchdog) writes one account
line to stderr, in one write, stamped with the UTC time: the log is shared with the other
ranks, MPI and submitit's signal handlers, whose lines land anywhere, even inside a
traceback. When a point fails, the first account written since its run began names the
cause; the later ones are mostly ranks that lost a peer to it. A stall is the exception:
every rank of a stalled collective stalls, and only those that found a peer unreachable or
gone (the watchdog probes them) can name the cause; their accounts come first.
"""

from __future__ import annotations

import datetime
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path

# a stall account whose probe found a lost peer (hpcbench.rank.peers.summary's words)
_NAMES_LOST_PEER = re.compile(r"; peers (?:unreachable|gone \(connection refused\)): ")
_ACCOUNT = re.compile(
    r"hpcbench\.worker: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00) (rank \d+ of point \S+ (?:failed|stalled): .*\S)"
)
HINT_CHARS = 480  # a reason stays one line (a stall's names its message and peers); the log has the rest


def describe(exc: BaseException) -> str:
    """The last line of the exception's traceback (`module.Type: message`), on one line."""
    return " ".join("".join(traceback.format_exception_only(type(exc), exc)).split())


def write_account(rank: int, point_id: str, what: str) -> None:
    """Write `rank R of point P <what>` as one stamped line on stderr (`what` starts with
    "failed: " or "stalled: ")."""
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
    sys.stderr.write(f"hpcbench.worker: {stamp} rank {rank} of point {point_id} {what}\n")
    sys.stderr.flush()


def _tail(log: Path, tail_bytes: int) -> list[str]:
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _says_why(account: str) -> bool:
    """A failure, or a stall that names a lost peer; not a stall whose peers all answered."""
    return " failed: " in account or bool(_NAMES_LOST_PEER.search(account))


def failure_hint(logs: Iterable[Path], since: datetime.datetime | None = None, tail_bytes: int = 65536) -> str:
    """The earliest account in the ends of `logs` written at or after `since` (an aware
    datetime: when the run began; None: any) that says why (see the module doc), else the
    earliest account; '' if there is none."""
    found: list[tuple[bool, datetime.datetime, str]] = []
    for log in logs:
        for line in _tail(log, tail_bytes):
            if m := _ACCOUNT.search(line):
                when = datetime.datetime.fromisoformat(m.group(1))
                if since is None or when >= since:
                    found.append((not _says_why(m.group(2)), when, m.group(2)))
    return min(found)[2][:HINT_CHARS] if found else ""
