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

Each source is read by its own module: cpu.py (the "cpu" source: CPU shares and RSS),
gpu.py (NVML), infiniband.py (sysfs counters), schedstat.py ("sched" and "children");
sources.py keeps their record. This module is the sampler: its thread, its ring and the
order a sample reads them in.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from hpcbench.store.schema import RESOURCE_DTYPE
from hpcbench.trace.cpu import CpuReader
from hpcbench.trace.gpu import GpuReader
from hpcbench.trace.infiniband import IbReader
from hpcbench.trace.schedstat import SchedReader, read_schedstat, sum_schedstat, thread_schedstats, work_wait
from hpcbench.trace.sources import SourceLog

__all__ = ["Sampler", "read_schedstat", "sum_schedstat", "thread_schedstats", "work_wait"]

_JOIN_TIMEOUT_S = 5.0  # a sample takes milliseconds; this only bounds a hung source (e.g. NVML)


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
        self._log = SourceLog()
        self.sources = self._log.sources
        self.dropped = 0
        self._offset_ns = clock_offset_ns - epoch_ns

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

        self._cpu = CpuReader(self._log)
        self._gpu = GpuReader(self._log, gpu_index)
        self._ib = IbReader(self._log, ib_root)
        self._sched = SchedReader(self._log, sched_root, self._cpu.process)

    @property
    def errors(self) -> int:
        return self._log.errors

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
        self._cpu.read(row)
        self._gpu.read(row)
        self._ib.read(row)
        self._sched.read(row, thorough)
        with self._lock:
            if self._written - self._read >= self.capacity:  # full: the oldest row goes
                self._read += 1
                self.dropped += 1
            self._ring[self._written % self.capacity] = row
            self._written += 1

    # --- thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        period_ns = round(self.period_s * 1e9)
        deadline = time.perf_counter_ns() + period_ns
        # Event.wait, not sleep: stop() wakes the thread at once.
        while not self._stop_event.wait(max(0.0, (deadline - time.perf_counter_ns()) / 1e9)):
            try:
                self.sample_now(thorough=False)
            except Exception as exc:  # noqa: BLE001 - sources catch their own; this is the last net
                self._log.note_error("sampler", exc)
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
                self._log.note_error("sampler", TimeoutError(f"sampler thread still running after {_JOIN_TIMEOUT_S} s"))
                return
        self.sample_now()
        self._cpu.close()
        self._sched.close()
        self._gpu.close()

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
