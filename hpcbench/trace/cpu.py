"""The resource sampler's "cpu" source: the node's CPU shares and the rank's resident set size.

``cpu_user`` / ``cpu_system`` / ``cpu_iowait`` / ``cpu_steal`` are computed from two readings
of the node's CPU times (on Linux the first line of /proc/stat, elsewhere
`psutil.cpu_times()`) with psutil's own formula (per-field deltas clamped at 0, guest time
not counted twice); ``rss_bytes`` is /proc/self/statm's resident pages × the page size on
Linux (what `psutil.Process().memory_info().rss` reports), psutil's elsewhere. On Linux both
files are read through descriptors kept open until `close`. Why not
`psutil.cpu_times_percent`: see `hpcbench.trace.sampler`.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from hpcbench.trace.sources import KeptFiles, SourceLog, describe

CPU_COLUMNS = ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal")
_GUEST_FIELDS = ("guest", "guest_nice") if sys.platform.startswith("linux") else ()


class CpuTimes(NamedTuple):
    """/proc/stat's cpu line, in clock ticks (psutil's names; shares need no unit)."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    guest: int  # included in user, and guest_nice in nice: counted once
    guest_nice: int


class CpuReader:
    """The "cpu" source. Its first reading is taken at construction: the first sample covers
    the time since then. `process` is this rank's psutil.Process (None without psutil)."""

    def __init__(self, log: SourceLog) -> None:
        self._log = log
        self.process: Any = None
        self.files = KeptFiles()  # kept open until close: one read per sample each
        self._active = False
        self._last: Any = None
        try:
            import psutil  # type: ignore[import-untyped]

            self.process = psutil.Process()
            self.cpu_times, self.rss, how = self._proc_readers(psutil)
            self._last = self.cpu_times()  # priming: the first sample covers the time since now
        except Exception as exc:  # noqa: BLE001 - no psutil (or no /proc): the CPU columns stay NaN / -1
            log.set("cpu", f"absent: {describe(exc)}")
            return
        self._active = True
        log.set("cpu", how)

    def _proc_readers(self, psutil: Any) -> tuple[Callable[[], Any], Callable[[], int], str]:
        """(the node's CPU times, the process's RSS, how): on Linux one read each of /proc/stat's
        first line and /proc/self/statm, through descriptors kept open; elsewhere psutil's."""
        try:
            stat, statm = self.files.open("/proc/stat"), self.files.open("/proc/self/statm")
        except OSError:
            return psutil.cpu_times, lambda: int(self.process.memory_info().rss), "psutil"
        page = os.sysconf("SC_PAGE_SIZE")

        def cpu_times() -> CpuTimes:
            ticks = [int(x) for x in os.pread(stat, 512, 0).split(b"\n", 1)[0].split()[1:]]  # after b"cpu"
            return CpuTimes(*(ticks + [0] * len(CpuTimes._fields))[: len(CpuTimes._fields)])  # old kernels: fewer

        return cpu_times, lambda: int(os.pread(statm, 128, 0).split()[1]) * page, "/proc/stat, /proc/self/statm"

    def read(self, row: Any) -> None:
        if not self._active:
            for column in CPU_COLUMNS:
                row[column] = math.nan
            row["rss_bytes"] = -1
            return
        try:
            now = self.cpu_times()
            last, self._last = self._last, now
            total = 0.0
            for field in now._fields:
                if field not in _GUEST_FIELDS:  # on Linux guest time is already in user / nice
                    total += max(0.0, getattr(now, field) - getattr(last, field))
            scale = 100.0 / total if total > 0 else 0.0
            row["cpu_user"] = min(100.0, max(0.0, now.user - last.user) * scale)
            row["cpu_system"] = min(100.0, max(0.0, now.system - last.system) * scale)
            for column in ("cpu_iowait", "cpu_steal"):  # Linux notions: NaN elsewhere
                field = column[4:]
                if hasattr(now, field):
                    row[column] = min(100.0, max(0.0, getattr(now, field) - getattr(last, field)) * scale)
                else:
                    row[column] = math.nan
        except Exception as exc:  # noqa: BLE001 - a failing source must not stop the sampler
            for column in CPU_COLUMNS:
                row[column] = math.nan
            self._log.note_error("cpu", exc)
        try:
            row["rss_bytes"] = self.rss()
        except Exception as exc:  # noqa: BLE001
            row["rss_bytes"] = -1
            self._log.note_error("cpu", exc)

    def close(self) -> None:
        """Close the files: the CPU columns are NaN / -1 from now on."""
        self.files.close()
        self._active = False
