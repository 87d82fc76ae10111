"""One sweep command at a time per sweep directory (an advisory lock the kernel drops on exit).

`SWEEP_DIR/.lock` holds the lock, and says who holds it: its first line is the holder's pid and
command (`run`, which runs or submits points: `run` and `resume`; `cancel`). `hpcbench cancel`
stops a local sweep that is running (`request_cancel`): it appends a `cancel PID` line, then
sends the holder SIGTERM; the holder, told to stop, finds the line (`cancel_requested`) and
records the points it stops as cancelled by the user rather than interrupted. The file is
emptied whenever the lock is taken, so a request never outlives the sweep it was made to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpcbench.errors import HpcbenchError

LOCK_FILE = ".lock"
RUN = "run"  # the holder runs or submits points (run, resume)
CANCEL = "cancel"  # the holder is `hpcbench cancel`; also the first word of a cancel request
TAKE_S = 0.5  # how long a busy lock is tried again (a `status` looking at it holds it for an instant)

_held: dict[str, int] = {}  # the locks this process holds: lock file (resolved) -> descriptor


def _key(path: Path) -> str:
    return os.path.realpath(path)


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str  # RUN, CANCEL, or "" where the lock file does not say


def _open(path: Path, flags: int) -> int:
    """The lock file, never through a symbolic link (an `O_CREAT` would make or truncate its target)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HpcbenchError(f"{path} is a symbolic link; the sweep lock is never taken through one") from None
        raise


def _lines(fd: int) -> list[str]:
    return os.pread(fd, 4096, 0).decode(errors="replace").splitlines()


def _written(fd: int) -> tuple[int, str] | None:
    """The pid and command on the lock file's first line; None where it holds none."""
    lines = _lines(fd)
    words = lines[0].split() if lines else []
    if not words or not words[0].isdigit():
        return None
    return int(words[0]), (words[1] if len(words) > 1 else "")


def _kernel_holders(fd: int) -> list[int]:
    """The pids that /proc/locks names as holding a flock on this file (Linux); [] where unknown."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device and fields[4].isdigit():
            pids.append(int(fields[4]))
    return [pid for pid in pids if pid > 0]


@contextmanager
def sweep_lock(directory: Path, command: str = RUN) -> Iterator[None]:
    """Hold `directory`'s lock as `command`, or refuse (HpcbenchError) naming who holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    try:
        _take(fd, directory)
        os.ftruncate(fd, 0)  # a cancel request made to an earlier holder goes with it
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    key = _key(path)
    _held[key] = fd
    try:
        yield
    finally:
        _held.pop(key, None)
        os.close(fd)  # releases the lock


def _take(fd: int, directory: Path) -> None:
    deadline = time.monotonic() + TAKE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
        found = _written(fd)
        who = f"pid {found[0]}" if found else "pid unknown"
        by = "hpcbench cancel" if found and found[1] == CANCEL else "another hpcbench.sweep"
        raise HpcbenchError(f"{directory} is in use by {by} ({who}); wait for it to finish")


def holder(directory: Path) -> Holder | None:
    """Who holds `directory`'s lock right now (another process), without taking it; None if nobody."""
    path = directory / LOCK_FILE
    if _key(path) in _held:
        return None  # this process holds it
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two lookers never refuse each other
        except BlockingIOError:
            pass
        else:
            return None  # nobody held it (closing the descriptor releases it)
        written = _written(fd)
        kernel = _kernel_holders(fd)
        if written is not None and (not kernel or written[0] in kernel):
            return Holder(*written)
        if kernel:
            return Holder(kernel[0], "")
        return Holder(written[0], "") if written else None
    finally:
        os.close(fd)


def in_use(directory: Path) -> bool:
    """Whether another sweep command holds `directory`'s lock right now (without taking it)."""
    return holder(directory) is not None


def request_cancel(directory: Path, running: Holder) -> bool:
    """Ask the sweep command `running`, which holds `directory`'s lock, to stop as cancelled:
    a `cancel PID` line in the lock file, then SIGTERM. False if a cancel was asked already
    (it is on its way: a second SIGTERM would kill the ranks at once)."""
    if not _signal(directory, running, 0):  # may it be signalled? (it may have ended meanwhile)
        return False
    fd = _open(directory / LOCK_FILE, os.O_RDWR | os.O_APPEND)
    try:
        if _asked(fd):
            return False
        os.write(fd, f"{CANCEL} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    now = holder(directory)
    if now is None or now.pid != running.pid:  # it ended meanwhile: its pid may be another process's now
        return False
    return _signal(directory, running, signal.SIGTERM)


def _signal(directory: Path, running: Holder, signum: int) -> bool:
    try:
        os.kill(running.pid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        raise HpcbenchError(f"the sweep running in {directory} (pid {running.pid}) is not yours to stop") from None
    return True


def _asked(fd: int) -> bool:
    """Whether the lock file holds a cancel request (a line after the holder's)."""
    return any(line.split()[:1] == [CANCEL] for line in _lines(fd)[1:])


def cancel_requested() -> bool:
    """Whether `hpcbench cancel` asked this process to stop: a cancel line in a lock it holds."""
    for fd in list(_held.values()):
        with contextlib.suppress(OSError):
            if _asked(fd):
                return True
    return False


def wait_released(directory: Path, running: Holder, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Wait up to `timeout_s` for `running` to let go of `directory`'s lock; whether it did."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = holder(directory)
        if now is None or now.pid != running.pid:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
