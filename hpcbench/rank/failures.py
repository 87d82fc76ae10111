"""How a rank says why its point failed, and how the executors find that in the logs.

A rank that fails (an exception) or sees the job stall (its watchdog) writes one account
line to stderr, in one write, stamped with the UTC time: the log is shared with the other
ranks, MPI and submitit's signal handlers, whose lines land anywhere, even inside a
traceback. When a point fails, the first account written since its run began names the
cause; the later ones are mostly ranks that lost a peer to it. A stall is the exception:
every rank of a stalled collective stalls, and only those that found a peer unreachable or
gone (the watchdog probes them) can name the cause; their accounts come first. A rank that
ran out of memory says so ("out of memory: " and its facts as JSON, rank/memory.py): the
point is then a result, `out_of_memory`, not a failure.
"""

from __future__ import annotations

import datetime
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path

from hpcbench.rank.memory import OutOfMemory

# a stall account whose probe found a lost peer (hpcbench.rank.peers.summary's words)
_NAMES_LOST_PEER = re.compile(r"; peers (?:unreachable|gone \(connection refused\)): ")
_ACCOUNT = re.compile(
    r"hpcbench\.worker: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00) "
    r"(rank \d+ of point \S+ (?:failed|stalled|out of memory): .*\S)"
)
OUT_OF_MEMORY = "out of memory"
_OOM_ACCOUNT = re.compile(rf"rank \d+ of point \S+ {OUT_OF_MEMORY}: (.*)")
HINT_CHARS = 480  # a reason stays one line (a stall's names its message and peers); the log has the rest


def describe(exc: BaseException) -> str:
    """The last line of the exception's traceback (`module.Type: message`), on one line."""
    return " ".join("".join(traceback.format_exception_only(type(exc), exc)).split())


def write_account(rank: int, point_id: str, what: str) -> None:
    """Write `rank R of point P <what>` as one stamped line on stderr (`what` starts with
    "failed: ", "stalled: " or "out of memory: ")."""
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
    return bool(_OOM_ACCOUNT.match(account)) or " failed: " in account or bool(_NAMES_LOST_PEER.search(account))


def _accounts(
    logs: Iterable[Path], since: datetime.datetime | None, tail_bytes: int
) -> list[tuple[bool, datetime.datetime, str]]:
    """(says no why, when, account) of every account in the ends of `logs` written at or after
    `since`, in that order: the first says why, and is the earliest that does."""
    found: list[tuple[bool, datetime.datetime, str]] = []
    for log in logs:
        for line in _tail(log, tail_bytes):
            if m := _ACCOUNT.search(line):
                when = datetime.datetime.fromisoformat(m.group(1))
                if since is None or when >= since:
                    found.append((not _says_why(m.group(2)), when, m.group(2)))
    return sorted(found)


def failure_hint(logs: Iterable[Path], since: datetime.datetime | None = None, tail_bytes: int = 65536) -> str:
    """The earliest account in the ends of `logs` written at or after `since` (an aware
    datetime: when the run began; None: any) that says why (see the module doc), else the
    earliest account; '' if there is none."""
    found = _accounts(logs, since, tail_bytes)
    return found[0][2][:HINT_CHARS] if found else ""


def write_out_of_memory(point_id: str, oom: OutOfMemory) -> None:
    """The account of a rank that ran out of memory: its facts, as JSON, on one line."""
    write_account(oom.rank, point_id, f"{OUT_OF_MEMORY}: {oom.to_json()}")


def out_of_memory(
    logs: Iterable[Path], since: datetime.datetime | None = None, tail_bytes: int = 65536
) -> OutOfMemory | None:
    """What the rank that ran out of memory said, where the earliest account that says why
    (written at or after `since`) is one of running out of memory; else None (a failure,
    a stall, or no account)."""
    found = _accounts(logs, since, tail_bytes)
    if not found or found[0][0]:
        return None
    m = _OOM_ACCOUNT.match(found[0][2])
    if m is None:
        return None
    try:
        return OutOfMemory.from_json(m.group(1))
    except (ValueError, KeyError, TypeError):
        return None
