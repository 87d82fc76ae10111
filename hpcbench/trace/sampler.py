"""Resource sampling: one background thread per rank ("thread per rank"), rows of RESOURCE_DTYPE.

Every rank runs its own `Sampler`: a daemon thread that wakes at a fixed period (default
1.0 s, settable) and records one row of `hpcbench.store.schema.RESOURCE_DTYPE`:

- ``t``: seconds since ``epoch_ns`` on the common clock, exactly as the iteration tables
  (see `hpcbench.trace.recorder`): ``(perf_counter_ns() + clock_offset_ns - epoch_ns) / 1e9``,
  read when the sample starts; the sources are read right after it.
- ``cpu_user`` / ``cpu_system`` / ``cpu_iowait`` / ``cpu_steal``: percent of the whole node's
  CPU time (all cores, as sysstat reports it) spent in each state since the previous sample
  of this sampler; steal is the time a hypervisor ran something else while the node's
  virtual CPUs wanted to run (NaN where the kernel does not count it). Computed here from
  two readings of the node's CPU times (on Linux the first line of /proc/stat, elsewhere
  `psutil.cpu_times()`) with psutil's own formula (per-field deltas clamped at 0, guest
  time not counted twice), not with
  `psutil.cpu_times_percent(interval=None)`: that keeps its "previous reading" per calling
  thread (so the samples taken by `start`/`stop` on the caller's thread and those of the
  sampler thread would have different baselines, and a thread's first call returns all
  zeros), and it divides by at least one second of CPU time (so with cores × period < 1 s
  every percentage comes out too small). The baseline is primed when the sampler is
  created: the first sample (the one `start` takes) covers the time since construction.
- ``rss_bytes``: the rank's own resident set size (on Linux /proc/self/statm's resident pages
  × the page size, what `psutil.Process().memory_info().rss` reports; psutil's elsewhere).
- ``gpu_*``: the rank's GPU through NVML (nvidia-ml-py's `pynvml`) when ``gpu_index`` is
  given: utilization percent, memory used on the whole device (bytes), power (W) and SM
  clock (MHz). NVML is initialised once, at construction, and shut down by `stop`.
- ``ib_rx_bytes`` / ``ib_tx_bytes``: ``port_rcv_data`` / ``port_xmit_data`` summed over every
  port of every device under ``/sys/class/infiniband`` (RoCE devices appear there too),
  converted to bytes. The counters are cumulative since the HCA was reset: rates are the
  differences between rows.
- ``sched_run_ns``: the rank process's time on a CPU, all its threads, ended ones included
  (the process CPU-time clock, which the kernel keeps from the same counts as
  ``schedstat``), ns, cumulative. ``sched_wait_ns``: its threads' time runnable but waiting
  for a CPU, summed over ``/proc/self/task/*/schedstat`` (Linux), ns, cumulative: a thread
  that ends takes its counts with it, so a difference can be negative when threads came and
  went, and is read as unknown. ``main_run_ns`` / ``main_wait_ns``: both of the thread that
  built the sampler (the rank's training loop), from its ``schedstat``. Their differences
  between two rows say how many CPUs the rank ran on and what share of the time its loop
  wanted a CPU it waited for one (the cost of CPU contention).
- ``work_wait``: the run-queue wait share of the rank's threads since the previous sample
  that read every thread, each thread weighted by its time on a CPU (`work_wait`): the wait
  of the threads that did the work, whichever they were (a framework's own pool, the loop),
  where ``sched_wait_ns`` also counts the waits of threads that only woke to hand data on
  (gloo's: on a busy host each wake-up waits for a CPU, though it hardly runs). NaN in the
  periodic samples and the first sample.
- ``child_run_ns``: the time on a CPU of the rank's descendant processes (every thread of
  each), ns, cumulative over the ones alive at the sample: the servers a parameter-server
  backend starts, a framework's compute process. They belong to the job, not to the
  other work that shared its host. A child that ends takes its counts with it, as a thread
  does.

``sched_wait_ns``, ``work_wait`` and ``child_run_ns`` are read in the samples the rank's own thread takes
(`start`, `sample_now`: when warm-up ends and when the timed loop ends, `stop`), and are -1
(``work_wait`` NaN) in the thread's periodic ones: they read a file per thread or per process (the descendants
are found by a scan of the process table). Every read releases Python's interpreter lock,
and a sampler thread beside a loop that holds the lock waits up to the interpreter's switch
interval (5 ms) to take it back after each one. So the periodic samples read three files,
each through a descriptor kept open until `stop` (one read each: /proc/stat,
/proc/self/statm, the main thread's ``schedstat``), plus NVML's calls. Measured on a
16-core GPU node (an H200's), a PyTorch process of 33 threads beside a busy loop, asking
for a 0.05 s period: samples every 0.05 s; 0.725-0.75 s apart when every file was opened,
read to its end and closed (psutil's readers, every thread's ``schedstat``, as before).

A source that is missing (no psutil, no NVML library or GPU, no InfiniBand) gives NaN
(float columns) or -1 (integer columns) and ``sources[name] = "absent: <reason>"``; nothing
raises. A source that fails during a sample gives NaN / -1 in that row, increments
``errors`` and appends ``"; last error: ..."`` to its ``sources`` entry; the thread goes on.

Storage is one preallocated array of ``capacity`` rows used as a ring: a sample fills a
preallocated scratch row, then copies it into the ring under a lock held only for the index
bookkeeping and that one-row copy. `drain` returns the rows recorded since the last drain,
oldest first. If more than ``capacity`` rows are recorded between two drains the oldest
are overwritten: the newest ``capacity`` are kept and ``dropped`` counts the lost ones
(cumulative over the sampler's life).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hpcbench.store.schema import CHILD_RUN, RESOURCE_DTYPE, SCHED_COLUMNS, WORK_WAIT

_CPU_COLUMNS = ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal")
_GPU_FLOAT_COLUMNS = ("gpu_util", "gpu_power_w", "gpu_sm_clock_mhz")
_GUEST_FIELDS = ("guest", "guest_nice") if sys.platform.startswith("linux") else ()


class _CpuTimes(NamedTuple):
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


_IB_WORD_BYTES = 4  # port_rcv_data / port_xmit_data count 32-bit words (IB PortRcvData / PortXmitData)
_JOIN_TIMEOUT_S = 5.0  # a sample takes milliseconds; this only bounds a hung source (e.g. NVML)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


class Sampler:
    """Samples CPU, memory, GPU and InfiniBand counters of one rank in a background thread.

    Attributes:
        sources: how each source ("cpu", "gpu", "ib", "sched", "children") is read, or ``"absent: <reason>"``.
        errors: number of failures while reading a source (each also noted in `sources`).
        dropped: rows overwritten in the ring before a `drain` could return them.
    """

    def __init__(
        self,
        rank: int,
        period_s: float,
        clock_offset_ns: int,
        epoch_ns: int,
        gpu_index: int | None = None,
        capacity: int = 4096,
        ib_root: str = "/sys/class/infiniband",
        sched_root: str = "/proc/self/task",
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.rank = rank
        self.period_s = float(period_s)
        self.capacity = capacity
        self.sources: dict[str, str] = {}
        self.errors = 0
        self.dropped = 0
        self._offset_ns = clock_offset_ns - epoch_ns
        self._described: dict[str, str] = {}  # each source's description before any error

        self._ring = np.zeros(capacity, dtype=RESOURCE_DTYPE)
        self._written = 0  # rows ever written into the ring
        self._read = 0  # rows ever drained or dropped: ring holds rows [_read, _written)
        self._lock = threading.Lock()  # index bookkeeping (and the one-row copy) only
        self._scratch = np.zeros(1, dtype=RESOURCE_DTYPE)
        self._row = self._scratch[0]  # a structured scalar: a writable view into _scratch
        self._row["rank"] = rank
        self._sample_lock = threading.Lock()  # one sample at a time (thread vs. start/stop/tests)

        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

        self._open_cpu()
        self._open_gpu(gpu_index)
        self._open_ib(ib_root)
        self._open_sched(sched_root)

    # --- sources ---------------------------------------------------------------------------

    def _set_source(self, name: str, description: str) -> None:
        self._described[name] = description
        self.sources[name] = description

    def _note_error(self, name: str, exc: BaseException) -> None:
        self.errors += 1
        base = self._described.get(name, name)
        self.sources[name] = f"{base}; last error: {_describe(exc)}"

    def _open_cpu(self) -> None:
        self._psutil: Any = None
        self._process: Any = None
        self._cpu_last: Any = None
        self._fds: list[int] = []  # kept open until stop: one read per sample each
        try:
            import psutil  # type: ignore[import-untyped]

            self._process = psutil.Process()
            self._cpu_times, self._rss, how = self._proc_readers(psutil)
            self._cpu_last = self._cpu_times()  # priming: the first sample covers the time since now
        except Exception as exc:  # noqa: BLE001 - no psutil (or no /proc): the CPU columns stay NaN / -1
            self._set_source("cpu", f"absent: {_describe(exc)}")
            return
        self._psutil = psutil
        self._set_source("cpu", how)

    def _proc_readers(self, psutil: Any) -> tuple[Callable[[], Any], Callable[[], int], str]:
        """(the node's CPU times, the process's RSS, how): on Linux one read each of /proc/stat's
        first line and /proc/self/statm, through descriptors kept open; elsewhere psutil's."""
        try:
            stat, statm = self._open_fd("/proc/stat"), self._open_fd("/proc/self/statm")
        except OSError:
            return psutil.cpu_times, lambda: int(self._process.memory_info().rss), "psutil"
        page = os.sysconf("SC_PAGE_SIZE")

        def cpu_times() -> _CpuTimes:
            ticks = [int(x) for x in os.pread(stat, 512, 0).split(b"\n", 1)[0].split()[1:]]  # after b"cpu"
            return _CpuTimes(*(ticks + [0] * len(_CpuTimes._fields))[: len(_CpuTimes._fields)])  # old kernels: fewer

        return cpu_times, lambda: int(os.pread(statm, 128, 0).split()[1]) * page, "/proc/stat, /proc/self/statm"

    def _open_fd(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        self._fds.append(fd)
        return fd

    def _open_gpu(self, index: int | None) -> None:
        self._nvml: Any = None
        self._gpu: Any = None
        self._gpu_reads: list[tuple[str, Callable[[], float]]] = []
        if index is None:
            self._set_source("gpu", "absent: no GPU index given")
            return
        try:
            import pynvml
        except ImportError as exc:
            self._set_source("gpu", f"absent: {_describe(exc)}")
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self._set_source("gpu", f"absent: {_describe(exc)}")
            return
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # noqa: BLE001 - no such GPU, no permission, ...
            self._set_source("gpu", f"absent: GPU {index}: {_describe(exc)}")
            self._shutdown_nvml(pynvml)
            return
        if isinstance(name, bytes):  # older nvidia-ml-py returns bytes
            name = name.decode(errors="replace")
        self._nvml, self._gpu = pynvml, handle
        reads: list[tuple[str, Callable[[], float]]] = [
            ("gpu_util", lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            ("gpu_mem_bytes", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)),
            ("gpu_power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),  # mW -> W
            ("gpu_sm_clock_mhz", lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))),
        ]
        # Probe each metric once: one a GPU does not support (power on some boards) stays
        # NaN / -1 for good instead of counting an error at every sample.
        missing = []
        for column, read in reads:
            try:
                read()
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, ...
                missing.append(f"{column}: {_describe(exc)}")
            else:
                self._gpu_reads.append((column, read))
        description = f"nvml: GPU {index} ({name})"
        if missing:
            description += " without " + ", ".join(missing)
        self._set_source("gpu", description)

    def _shutdown_nvml(self, nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - nothing to do about it but say so
            self._note_error("gpu", exc)

    def _open_ib(self, ib_root: str) -> None:
        root = Path(ib_root)
        # The counter files are found once: HCAs and ports do not come and go during a job.
        self._ib_rx = [str(p) for p in sorted(root.glob("*/ports/*/counters/port_rcv_data"))]
        self._ib_tx = [str(p) for p in sorted(root.glob("*/ports/*/counters/port_xmit_data"))]
        if not root.is_dir():
            self._set_source("ib", f"absent: no {ib_root}")
        elif not self._ib_rx and not self._ib_tx:
            self._set_source("ib", f"absent: no port counters under {ib_root}")
        else:
            self._set_source("ib", f"sysfs: {len(self._ib_rx)} port(s) under {ib_root}")

    def _open_sched(self, root: str) -> None:
        self._sched_root: Path | None = None
        self._threads: dict[str, tuple[int, int]] | None = None  # at the last thorough sample (work_wait)
        self._main_fd = -1
        self._set_source("children", "absent: no schedstat")
        main = os.path.join(root, str(threading.get_native_id()), "schedstat")
        try:
            sum_schedstat(Path(root))
            self._main_fd = self._open_fd(main)
            _split_schedstat(os.pread(self._main_fd, 256, 0))
        except (OSError, ValueError, IndexError) as exc:
            self._main_fd = -1
            self._set_source("sched", f"absent: {_describe(exc)}")
            return
        self._sched_root = Path(root)
        self._set_source("sched", f"process CPU clock; schedstat: {root}/*/schedstat, main thread {main}")
        self._proc_root = self._sched_root.parent.parent  # /proc, for the descendants' threads
        if self._process is None:
            self._set_source("children", "absent: no psutil")
        else:
            self._set_source("children", f"psutil descendants, {self._proc_root}/PID/task/*/schedstat")

    @staticmethod
    def _sum_counters(paths: list[str]) -> int:
        total = 0
        for path in paths:
            with open(path, "rb") as f:
                total += int(f.read())
        # The counters are in 4-byte words (IB PortRcvData / PortXmitData count octets / 4).
        # Kernels expose the 64-bit extended counters where the HCA has them; on very old
        # HCAs they are 32-bit and saturate at 2**32 - 1 words (16 GiB).
        return total * _IB_WORD_BYTES

    # --- sampling --------------------------------------------------------------------------

    def sample_now(self, thorough: bool = True) -> None:
        """Take one sample synchronously and append it to the ring (used by start/stop, the
        loop's window edges, tests); not `thorough`: `sched_wait_ns` and `child_run_ns` are
        left out (-1), as in the thread's periodic samples."""
        with self._sample_lock:
            self._sample(thorough)

    def _sample(self, thorough: bool) -> None:
        row = self._row
        row["t"] = (time.perf_counter_ns() + self._offset_ns) / 1e9
        self._read_cpu(row)
        self._read_gpu(row)
        self._read_ib(row)
        self._read_sched(row, thorough)
        self._read_children(row, thorough)
        with self._lock:
            if self._written - self._read >= self.capacity:  # full: the oldest row goes
                self._read += 1
                self.dropped += 1
            self._ring[self._written % self.capacity] = row
            self._written += 1

    def _read_cpu(self, row: Any) -> None:
        psutil = self._psutil
        if psutil is None:
            for column in _CPU_COLUMNS:
                row[column] = math.nan
            row["rss_bytes"] = -1
            return
        try:
            now = self._cpu_times()
            last, self._cpu_last = self._cpu_last, now
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
            for column in _CPU_COLUMNS:
                row[column] = math.nan
            self._note_error("cpu", exc)
        try:
            row["rss_bytes"] = self._rss()
        except Exception as exc:  # noqa: BLE001
            row["rss_bytes"] = -1
            self._note_error("cpu", exc)

    def _read_gpu(self, row: Any) -> None:
        for column in _GPU_FLOAT_COLUMNS:
            row[column] = math.nan
        row["gpu_mem_bytes"] = -1
        for column, read in self._gpu_reads:
            try:
                row[column] = read()
            except Exception as exc:  # noqa: BLE001 - any NVMLError: this row's value stays NaN / -1
                self._note_error("gpu", exc)

    def _read_sched(self, row: Any, thorough: bool) -> None:
        for column in SCHED_COLUMNS:
            row[column] = -1
        row[WORK_WAIT] = math.nan
        if self._sched_root is None or self._main_fd < 0:  # no schedstat, or stopped
            return
        try:
            row["sched_run_ns"] = time.process_time_ns()
            row["main_run_ns"], row["main_wait_ns"] = _split_schedstat(os.pread(self._main_fd, 256, 0))
            if thorough:
                threads = thread_schedstats(self._sched_root)
                row["sched_wait_ns"] = sum(w for _, w in threads.values())
                if self._threads is not None:
                    row[WORK_WAIT] = work_wait(self._threads, threads)
                self._threads = threads
        except (OSError, ValueError, IndexError) as exc:  # the main thread ended: counts unknown
            self._note_error("sched", exc)

    def _close_files(self) -> None:
        self._main_fd = -1
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._psutil = None  # the CPU columns are NaN / -1 from now on

    def _read_children(self, row: Any, thorough: bool) -> None:
        row[CHILD_RUN] = -1
        if not thorough or self._process is None or self._sched_root is None:
            return
        try:
            children = self._process.children(recursive=True)
        except Exception as exc:  # noqa: BLE001 - /proc unreadable: this row's value stays -1
            self._note_error("children", exc)
            return
        run = 0
        for child in children:
            try:
                run += sum_schedstat(self._proc_root / str(child.pid) / "task")[0]
            except (OSError, ValueError, IndexError):  # it ended meanwhile: it takes its time with it
                continue
        row[CHILD_RUN] = run

    def _read_ib(self, row: Any) -> None:
        if not self._ib_rx and not self._ib_tx:
            row["ib_rx_bytes"] = row["ib_tx_bytes"] = -1
            return
        try:
            row["ib_rx_bytes"] = self._sum_counters(self._ib_rx)
            row["ib_tx_bytes"] = self._sum_counters(self._ib_tx)
        except Exception as exc:  # noqa: BLE001 - a vanished or unreadable counter file
            row["ib_rx_bytes"] = row["ib_tx_bytes"] = -1
            self._note_error("ib", exc)

    # --- thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        period_ns = round(self.period_s * 1e9)
        deadline = time.perf_counter_ns() + period_ns
        # Event.wait, not sleep: stop() wakes the thread at once.
        while not self._stop_event.wait(max(0.0, (deadline - time.perf_counter_ns()) / 1e9)):
            try:
                self.sample_now(thorough=False)
            except Exception as exc:  # noqa: BLE001 - sources catch their own; this is the last net
                self._note_error("sampler", exc)
            deadline += period_ns
            now = time.perf_counter_ns()
            if deadline <= now:  # fell behind (slow source, suspended process): skip, do not burst
                deadline += ((now - deadline) // period_ns + 1) * period_ns

    def start(self) -> None:
        """Take one sample now, then start the daemon sampling thread (one sample per period)."""
        if self._thread is not None or self._stopped:
            raise RuntimeError("a Sampler is started once")
        self.sample_now()
        self._thread = threading.Thread(target=self._run, name=f"hpcbench-sampler-{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread, take a final sample and shut NVML down; later calls do nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        thread = self._thread
        if thread is not None:
            thread.join(_JOIN_TIMEOUT_S)
            if thread.is_alive():  # stuck in a source: leave it (a daemon) and its NVML handle alone
                self._note_error("sampler", TimeoutError(f"sampler thread still running after {_JOIN_TIMEOUT_S} s"))
                return
        self.sample_now()
        self._close_files()
        nvml = self._nvml
        if nvml is not None:
            self._nvml = self._gpu = None
            self._gpu_reads = []
            self._shutdown_nvml(nvml)

    def drain(self) -> np.ndarray:
        """Rows (RESOURCE_DTYPE) recorded since the last drain, oldest first; safe while sampling."""
        with self._lock:
            first, end = self._read, self._written
            out = np.empty(end - first, dtype=RESOURCE_DTYPE)
            start = first % self.capacity
            head = min(end - first, self.capacity - start)
            out[:head] = self._ring[start : start + head]
            out[head:] = self._ring[: end - first - head]
            self._read = end
        return out
