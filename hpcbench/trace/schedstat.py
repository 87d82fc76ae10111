"""The resource sampler's "sched" and "children" sources: the rank's time on a CPU and its
threads' time waiting for one (Linux's ``schedstat``), and its descendants' time on a CPU.

``sched_run_ns``: the process CPU-time clock (all threads, ended ones included);
``sched_wait_ns``: ``/proc/self/task/*/schedstat``'s wait summed over the living threads;
``main_run_ns`` / ``main_wait_ns``: the ``schedstat`` of the thread that built the reader
(the rank's training loop), read through a descriptor kept open until `close`;
``work_wait``: the threads' wait share weighted by their work (`work_wait`) since the
previous thorough sample; ``child_run_ns``: every thread of every descendant process alive
at the sample. ``sched_wait_ns``, ``work_wait`` and ``child_run_ns`` are read only in a
thorough sample (a file per thread or per process); -1 (NaN) in the others.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from hpcbench.store.schema import CHILD_RUN, SCHED_COLUMNS, WORK_WAIT
from hpcbench.trace.sources import KeptFiles, SourceLog, describe


def _split_schedstat(text: bytes) -> tuple[int, int]:
    fields = text.split()
    return int(fields[0]), int(fields[1])


def read_schedstat(path: str) -> tuple[int, int]:
    """(run ns, run-queue wait ns): the first two fields of a thread's `schedstat`."""
    with open(path, "rb") as f:
        return _split_schedstat(f.read())


def thread_schedstats(tasks: Path) -> dict[str, tuple[int, int]]:
    """{thread id: (run ns, run-queue wait ns)} of every thread under `tasks` (/proc/PID/task):
    the first two fields of its `schedstat`. A thread that ends while it is read is left out;
    no thread at all raises OSError."""
    out: dict[str, tuple[int, int]] = {}
    for task in os.scandir(tasks):
        try:
            out[task.name] = read_schedstat(os.path.join(task.path, "schedstat"))
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    if not out:
        raise OSError(f"no thread schedstat under {tasks}")
    return out


def sum_schedstat(tasks: Path) -> tuple[int, int]:
    """(run ns, run-queue wait ns) summed over the threads under `tasks` (`thread_schedstats`)."""
    counts = thread_schedstats(tasks).values()
    return sum(r for r, _ in counts), sum(w for _, w in counts)


def work_wait(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float:
    """The run-queue wait share of the threads between two `thread_schedstats`, each thread
    weighted by its time on a CPU: Σ Δrun·Δwait / (Δrun + Δwait) / Σ Δrun over the threads in
    both. A thread that did the work counts as its share of it; one that woke briefly, however
    long it waited to, hardly at all. NaN where no such thread ran."""
    weighted = ran = 0.0
    for tid, (run, wait) in after.items():
        if tid not in before:
            continue
        d_run, d_wait = run - before[tid][0], wait - before[tid][1]
        if d_run > 0 and d_wait >= 0:
            weighted += d_run * d_wait / (d_run + d_wait)
            ran += d_run
    return weighted / ran if ran > 0 else math.nan


class SchedReader:
    """The "sched" source (the threads under `root`, /proc/self/task) and the "children" one
    (the descendants of `process`, a psutil.Process, or None without psutil)."""

    def __init__(self, log: SourceLog, root: str, process: Any) -> None:
        self._log = log
        self._process = process
        self._root: Path | None = None
        self._threads: dict[str, tuple[int, int]] | None = None  # at the last thorough sample (work_wait)
        self.files = KeptFiles()
        self._main_fd = -1
        log.set("children", "absent: no schedstat")
        main = os.path.join(root, str(threading.get_native_id()), "schedstat")
        try:
            sum_schedstat(Path(root))
            self._main_fd = self.files.open(main)
            _split_schedstat(os.pread(self._main_fd, 256, 0))
        except (OSError, ValueError, IndexError) as exc:
            self._main_fd = -1
            log.set("sched", f"absent: {describe(exc)}")
            return
        self._root = Path(root)
        log.set("sched", f"process CPU clock; schedstat: {root}/*/schedstat, main thread {main}")
        self._proc_root = self._root.parent.parent  # /proc, for the descendants' threads
        if process is None:
            log.set("children", "absent: no psutil")
        else:
            log.set("children", f"psutil descendants, {self._proc_root}/PID/task/*/schedstat")

    def read(self, row: Any, thorough: bool) -> None:
        """The sched columns, then ``child_run_ns``; not `thorough`: only what costs no file per thread."""
        self._read_sched(row, thorough)
        self._read_children(row, thorough)

    def _read_sched(self, row: Any, thorough: bool) -> None:
        for column in SCHED_COLUMNS:
            row[column] = -1
        row[WORK_WAIT] = math.nan
        if self._root is None or self._main_fd < 0:  # no schedstat, or closed
            return
        try:
            row["sched_run_ns"] = time.process_time_ns()
            row["main_run_ns"], row["main_wait_ns"] = _split_schedstat(os.pread(self._main_fd, 256, 0))
            if thorough:
                threads = thread_schedstats(self._root)
                row["sched_wait_ns"] = sum(w for _, w in threads.values())
                if self._threads is not None:
                    row[WORK_WAIT] = work_wait(self._threads, threads)
                self._threads = threads
        except (OSError, ValueError, IndexError) as exc:  # the main thread ended: counts unknown
            self._log.note_error("sched", exc)

    def _read_children(self, row: Any, thorough: bool) -> None:
        row[CHILD_RUN] = -1
        if not thorough or self._process is None or self._root is None:
            return
        try:
            children = self._process.children(recursive=True)
        except Exception as exc:  # noqa: BLE001 - /proc unreadable: this row's value stays -1
            self._log.note_error("children", exc)
            return
        run = 0
        for child in children:
            try:
                run += sum_schedstat(self._proc_root / str(child.pid) / "task")[0]
            except (OSError, ValueError, IndexError):  # it ended meanwhile: it takes its time with it
                continue
        row[CHILD_RUN] = run

    def close(self) -> None:
        """Close the main thread's file: the sched columns are -1 from now on (the descendants
        are still read)."""
        self._main_fd = -1
        self.files.close()
