"""hpcbench.trace.sampler (and its sources: cpu, gpu, infiniband, schedstat): real psutil, real NVML (absent
on the development machine), fake IB sysfs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpcbench.store.schema import RESOURCE_DTYPE
from hpcbench.trace.recorder import clock_offset_ns
from hpcbench.trace.sampler import Sampler, work_wait

NO_IB = "/nonexistent/sys/class/infiniband"


def busy(seconds: float) -> None:
    """Keep this thread on a CPU, so that the node's user time grows."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.fixture
def clock() -> tuple[int, int]:
    """(clock_offset_ns, epoch_ns) as a worker has them: epoch a few seconds in the past."""
    return clock_offset_ns(), time.time_ns() - 5_000_000_000


@pytest.fixture
def samplers() -> Iterator[list[Sampler]]:
    """Samplers made by a test, stopped afterwards even when it fails."""
    made: list[Sampler] = []
    yield made
    for s in made:
        s.stop()


def make(
    made: list[Sampler],
    clock: tuple[int, int],
    *,
    period_s: float = 1.0,
    gpu_index: int | None = None,
    capacity: int = 4096,
    ib_root: str = NO_IB,
    sched_root: str = "/proc/self/task",
) -> Sampler:
    """A rank-3 sampler on the test's clock (no InfiniBand unless ib_root says so)."""
    s = Sampler(
        3, period_s, clock[0], clock[1], gpu_index=gpu_index, capacity=capacity, ib_root=ib_root, sched_root=sched_root
    )
    made.append(s)
    return s


def write_fake_ib_tree(root: Path, values: dict[tuple[str, int], tuple[int, int]]) -> None:
    """A FAKE /sys/class/infiniband: <dev>/ports/<port>/counters/port_{rcv,xmit}_data (4-byte words)."""
    for (device, port), (rcv, xmit) in values.items():
        counters = root / device / "ports" / str(port) / "counters"
        counters.mkdir(parents=True, exist_ok=True)
        (counters / "port_rcv_data").write_text(f"{rcv}\n")
        (counters / "port_xmit_data").write_text(f"{xmit}\n")
        (counters / "port_rcv_packets").write_text("999999\n")  # other counters are ignored


def test_values_plausible_and_first_sample_covers_time_since_construction(
    samplers: list[Sampler], clock: tuple[int, int]
) -> None:
    s = make(samplers, clock)
    assert s.sources["cpu"] == ("/proc/stat, /proc/self/statm" if sys.platform.startswith("linux") else "psutil")
    busy(0.1)  # between construction (priming) and the first sample
    s.sample_now()
    busy(0.1)
    s.sample_now()
    rows = s.drain()
    assert rows.dtype == RESOURCE_DTYPE
    assert len(rows) == 2
    assert (rows["rank"] == 3).all()
    for column in ("cpu_user", "cpu_system", "cpu_iowait"):
        assert ((rows[column] >= 0) & (rows[column] <= 100)).all(), (column, rows[column])
    assert (rows["cpu_user"] + rows["cpu_system"] > 0).all(), rows  # this thread was busy
    assert (rows["rss_bytes"] > 10_000_000).all()  # a Python with numpy loaded
    assert (rows["ib_rx_bytes"] == -1).all()
    assert (rows["ib_tx_bytes"] == -1).all()
    assert s.sources["ib"] == f"absent: no {NO_IB}"
    assert s.errors == 0


def test_t_is_on_the_common_clock(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    offset, epoch = clock
    s = make(samplers, clock)
    refs = []
    for _ in range(3):
        before = time.perf_counter_ns()
        s.sample_now()
        after = time.perf_counter_ns()
        refs.append(((before + offset - epoch) / 1e9, (after + offset - epoch) / 1e9))
    t = s.drain()["t"]
    for value, (lo, hi) in zip(t, refs, strict=True):
        assert lo <= value <= hi
    assert (np.diff(t) > 0).all()
    # and that is wall time since epoch_ns, to well within a second
    assert abs(t[-1] - (time.time_ns() - epoch) / 1e9) < 0.5
    assert 4.5 < t[0] < 10


def test_gpu_columns(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    none = make(samplers, clock, gpu_index=None)
    assert none.sources["gpu"].startswith("absent")
    s = make(samplers, clock, gpu_index=0)
    s.sample_now()
    row = s.drain()[0]
    if s.sources["gpu"].startswith("absent"):  # this machine: no NVML library, no GPU
        assert "NVML" in s.sources["gpu"] or "nvml" in s.sources["gpu"]
        for column in ("gpu_util", "gpu_power_w", "gpu_sm_clock_mhz"):
            assert math.isnan(row[column])
        assert row["gpu_mem_bytes"] == -1
    else:  # a GPU node: real readings
        assert s.sources["gpu"].startswith("nvml: GPU 0")
        assert 0 <= row["gpu_util"] <= 100
        assert row["gpu_mem_bytes"] > 0
        assert math.isnan(row["gpu_power_w"]) or row["gpu_power_w"] > 0
        assert math.isnan(row["gpu_sm_clock_mhz"]) or row["gpu_sm_clock_mhz"] > 0
    assert s.errors == 0
    s.stop()  # nvmlShutdown where it was initialised; never raises
    assert s.errors == 0


def test_thread_samples_at_its_period_and_stops_promptly(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock, period_s=0.05)
    s.start()
    thread = s._thread
    assert thread is not None
    assert thread.daemon
    # busy until the thread has taken 6 samples of its own (on a loaded machine it may wake late:
    # waiting a fixed 0.3 s for them once saw 3)
    deadline = time.perf_counter() + 10.0
    while s._written < 7 and time.perf_counter() < deadline:
        busy(0.01)
    began = time.perf_counter()
    s.stop()
    assert time.perf_counter() - began < 1.0
    assert not thread.is_alive()
    rows = s.drain()
    # start's sample, 6 from the thread (more if it woke again before stop), stop's final one
    assert len(rows) >= 8, len(rows)
    t = rows["t"]
    assert (np.diff(t) > 0).all()
    thread_gaps = np.diff(t[:-1])[1:]  # between the thread's own samples
    # the k-th never before its deadline, k periods after start's sample (less the timer's
    # slack; one woken late may be followed closely by one on time); late only as load makes it
    own = t[1:-1] - t[0]
    assert (own >= 0.05 * np.arange(1, own.size + 1) - 0.005).all(), own
    assert np.median(thread_gaps) < 0.15, thread_gaps
    # every full period of a busy thread shows CPU use (a thread's first psutil reading does not)
    full = np.flatnonzero(np.diff(t) >= 0.04) + 1
    assert len(full) >= 4
    assert (rows["cpu_user"][full] + rows["cpu_system"][full] > 0).all(), rows
    s.stop()  # a second stop does nothing
    assert len(s.drain()) == 0


def test_stop_does_not_wait_for_the_period(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock, period_s=30.0)
    s.start()
    time.sleep(0.02)
    began = time.perf_counter()
    s.stop()
    assert time.perf_counter() - began < 1.0
    assert len(s.drain()) == 2  # start's sample and stop's


def test_drain_empties(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock)
    s.sample_now()
    assert len(s.drain()) == 1
    empty = s.drain()
    assert len(empty) == 0
    assert empty.dtype == RESOURCE_DTYPE
    s.sample_now()
    assert len(s.drain()) == 1


def test_ring_overflow_keeps_the_newest_and_counts_dropped(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    offset, epoch = clock
    s = make(samplers, clock, capacity=4)
    for _ in range(3):  # move the ring's start off slot 0
        s.sample_now()
    assert len(s.drain()) == 3
    for _ in range(6):
        s.sample_now()
    newest_from = (time.perf_counter_ns() + offset - epoch) / 1e9
    for _ in range(4):
        s.sample_now()
    rows = s.drain()
    assert len(rows) == 4
    assert s.dropped == 6
    assert (rows["t"] >= newest_from).all()
    assert (np.diff(rows["t"]) > 0).all()
    s.sample_now()
    assert len(s.drain()) == 1
    assert s.dropped == 6


def test_drain_while_sampling_loses_and_repeats_nothing(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock, period_s=0.005, capacity=64)
    s.start()
    blocks = []
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        blocks.append(s.drain())
        time.sleep(0.0005)  # a training thread lets go of the GIL now and then
    s.stop()
    blocks.append(s.drain())
    t = np.concatenate(blocks)["t"]
    assert len(t) >= 10, len(t)
    assert (np.diff(t) > 0).all()
    assert s.dropped == 0


def test_fake_ib_tree_counters_are_words_summed_over_devices_and_ports(
    samplers: list[Sampler], clock: tuple[int, int], tmp_path: Path
) -> None:
    root = tmp_path / "fake_sys_class_infiniband"
    values = {
        ("mlx5_0", 1): (1_000, 10),
        ("mlx5_0", 2): (2_000, 20),
        ("mlx5_1", 1): (3_000_000_000_000, 30),
        ("mlx5_1", 2): (4_000, 40),
    }
    write_fake_ib_tree(root, values)
    s = make(samplers, clock, ib_root=str(root))
    assert s.sources["ib"].startswith("sysfs: 4 port(s)")
    s.sample_now()
    (root / "mlx5_1" / "ports" / "2" / "counters" / "port_xmit_data").write_text("1040\n")  # +1000 words
    s.sample_now()
    rows = s.drain()
    assert rows["ib_rx_bytes"].tolist() == [4 * 3_000_000_007_000] * 2
    assert rows["ib_tx_bytes"].tolist() == [4 * 100, 4 * 1100]


def test_ib_root_without_counters_is_absent(samplers: list[Sampler], clock: tuple[int, int], tmp_path: Path) -> None:
    s = make(samplers, clock, ib_root=str(tmp_path))
    assert s.sources["ib"].startswith("absent: no port counters")
    s.sample_now()
    row = s.drain()[0]
    assert row["ib_rx_bytes"] == row["ib_tx_bytes"] == -1


def test_a_failing_source_is_counted_and_the_thread_goes_on(
    samplers: list[Sampler], clock: tuple[int, int], tmp_path: Path
) -> None:
    root = tmp_path / "fake_sys_class_infiniband"
    write_fake_ib_tree(root, {("mlx5_0", 1): (5, 6)})
    s = make(samplers, clock, period_s=0.01, ib_root=str(root))
    s.start()
    (root / "mlx5_0" / "ports" / "1" / "counters" / "port_rcv_data").unlink()  # the HCA went away
    time.sleep(0.1)
    thread = s._thread
    assert thread is not None
    assert thread.is_alive()
    s.stop()
    rows = s.drain()
    assert rows["ib_rx_bytes"][0] == 20
    assert rows["ib_rx_bytes"][-1] == -1
    assert s.errors >= 3
    assert s.sources["ib"].startswith("sysfs: 1 port(s)")
    assert "last error: FileNotFoundError" in s.sources["ib"]
    # the other sources were still read
    assert (rows["rss_bytes"] > 0).all()


def test_misuse_is_refused(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="period_s"):
        make(samplers, clock, period_s=0.0)
    with pytest.raises(ValueError, match="capacity"):
        make(samplers, clock, capacity=0)
    s = make(samplers, clock)
    s.start()
    with pytest.raises(RuntimeError):
        s.start()
    s.stop()
    with pytest.raises(RuntimeError):
        s.start()


def test_schedstat_counts_the_loops_thread_and_every_thread(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    """A thread that never sleeps is on a CPU or waiting for one for all of its wall time,
    however busy the machine, but for what the hypervisor stole (neither: the node's virtual
    CPU did not run; at most the node's steal share × its CPUs of the time): the main
    thread's run + wait covers its busy spell, and the process's sums also cover another
    thread's (one at a time: Python threads that spin together take turns at the interpreter
    lock, and sleep while they wait for it)."""
    s = make(samplers, clock)
    assert "schedstat: " in s.sources["sched"]
    s.sample_now()
    busy(0.3)
    s.sample_now()
    spun, release = threading.Event(), threading.Event()

    def spin_then_sleep() -> None:
        busy(0.3)
        spun.set()
        release.wait()  # alive at the next sample: a thread that ends takes its counts with it

    other = threading.Thread(target=spin_then_sleep)
    other.start()
    spun.wait()  # the main thread sleeps meanwhile
    s.sample_now()
    release.set()
    other.join()
    s.sample_now(thorough=False)  # as the thread samples: no file per thread
    a, b, c, d = s.drain()
    # the process's CPU time keeps an ended thread's; its wait (a sum over living threads) is left out
    assert d["sched_run_ns"] >= c["sched_run_ns"] and d["sched_wait_ns"] == -1 and d["main_wait_ns"] >= 0

    def runnable(x: np.void, y: np.void, prefix: str) -> float:
        return (
            float(y[f"{prefix}_run_ns"] - x[f"{prefix}_run_ns"] + y[f"{prefix}_wait_ns"] - x[f"{prefix}_wait_ns"]) / 1e9
        )

    def unstolen(x: np.void, y: np.void) -> float:  # of the 0.3 s spells
        stolen = float(y["cpu_steal"]) / 100 * (os.cpu_count() or 1) * float(y["t"] - x["t"])
        return 0.3 - (stolen if math.isfinite(stolen) else 0.0)

    # a sample reads its clock and the schedstat files one after another: on a busy machine the
    # thread can be preempted between them, so the interval may be short by milliseconds
    assert 0.95 * unstolen(a, b) <= runnable(a, b, "main") <= float(b["t"] - a["t"]) + 20e-3
    assert runnable(b, c, "main") < 0.1  # it slept meanwhile
    assert runnable(b, c, "sched") - runnable(b, c, "main") >= 0.95 * unstolen(b, c)  # the other thread's spell
    assert (b["main_run_ns"] <= b["sched_run_ns"]) and (c["main_run_ns"] <= c["sched_run_ns"])


def test_no_schedstat_is_absent_not_an_error(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock, sched_root="/nonexistent/proc/self/task")
    assert s.sources["sched"].startswith("absent: ")
    s.sample_now()
    (row,) = s.drain()
    assert [int(row[c]) for c in ("sched_run_ns", "sched_wait_ns", "main_run_ns", "main_wait_ns")] == [-1] * 4
    assert s.errors == 0


SPINNER = """
import subprocess, sys, time
end = time.process_time() + 0.3
if sys.argv[1] == "parent":  # start a child of its own, spin, and wait for the child's spin too
    kid = subprocess.Popen([sys.executable, __file__, "kid"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
while time.process_time() < end:
    pass
if sys.argv[1] == "parent":
    kid.stdout.readline()
print("spun", flush=True)
sys.stdin.read()  # alive until told: a process that ends takes its counts with it
if sys.argv[1] == "parent":
    kid.stdin.close()
    kid.wait()
"""


def test_descendants_cpu_time_is_counted_in_the_ranks_own_samples(
    samplers: list[Sampler], clock: tuple[int, int], tmp_path: Path
) -> None:
    """A child and its own child each spin 0.3 s of CPU time: the samples the rank takes
    itself count at least their 0.6 s, and no more than their wall time allows; the
    thread's periodic samples do not look for descendants (-1)."""
    s = make(samplers, clock, period_s=0.02)
    assert s.sources["children"].startswith("psutil descendants")
    script = tmp_path / "spinner.py"
    script.write_text(SPINNER)
    s.sample_now()
    child = subprocess.Popen([sys.executable, str(script), "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"spun\n"
        s.start()  # a synchronous sample, then the thread's own
        deadline = time.perf_counter() + 10.0
        while s._written < 4 and time.perf_counter() < deadline:
            time.sleep(0.01)
        s.stop()
    finally:
        child.communicate(timeout=30)
    rows = s.drain()
    first, second, last = rows[0], rows[1], rows[-1]
    assert first["child_run_ns"] == 0  # no descendant yet
    spun = (int(second["child_run_ns"]) - int(first["child_run_ns"])) / 1e9
    assert 0.6 <= spun <= float(second["t"] - first["t"]) * (os.cpu_count() or 1) + 0.05, spun
    assert last["child_run_ns"] >= second["child_run_ns"]  # both still alive at stop
    assert (rows["child_run_ns"][2:-1] == -1).all() and len(rows) >= 5  # the thread's samples


def test_steal_is_a_share_of_the_node_beside_the_other_states(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    s = make(samplers, clock)
    busy(0.1)
    s.sample_now()
    (row,) = s.drain()
    if sys.platform.startswith("linux"):  # the kernel counts steal, 0 on a machine of its own
        shares = [float(row[c]) for c in ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal")]
        assert all(0.0 <= x <= 100.0 for x in shares) and sum(shares) <= 100.0 + 1e-3
    else:
        assert math.isnan(row["cpu_steal"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the /proc readers are Linux's")
def test_the_proc_readers_read_what_psutil_reads(samplers: list[Sampler], clock: tuple[int, int]) -> None:
    """The node's CPU times and the process's RSS, each one read of a descriptor kept open,
    are psutil's figures (read right after: within a few clock ticks, and a few pages)."""
    import psutil  # type: ignore[import-untyped]

    s = make(samplers, clock)
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(3):  # the descriptors read fresh values every time
        busy(0.05)
        ours, theirs = s._cpu.cpu_times(), psutil.cpu_times()
        for field in ("user", "system", "idle", "iowait", "steal"):
            assert getattr(ours, field) / tick == pytest.approx(getattr(theirs, field), abs=0.05), field
        assert abs(s._cpu.rss() - psutil.Process().memory_info().rss) <= 64 * os.sysconf("SC_PAGE_SIZE")
    assert len(s._cpu.files.fds) == 2 and len(s._sched.files.fds) == 1  # /proc/stat, statm; the loop's schedstat
    s.stop()
    assert s._cpu.files.fds == [] and s._sched.files.fds == []  # closed
    s.sample_now()
    (*_, last) = s.drain()
    assert math.isnan(last["cpu_user"]) and last["rss_bytes"] == -1 and last["sched_run_ns"] == -1


def test_work_wait_weighs_each_thread_by_its_work() -> None:
    """A compute thread that ran 0.9 s and waited as long (½), beside a thread that only
    woke to hand data on (ran 10 ms, waited 990 ms for it): the threads that did the work
    waited half their runnable time, though the process's threads together waited 2/3."""
    before = {"1": (100, 100), "2": (5, 5), "4": (7, 7)}
    after = {"1": (100 + 900, 100 + 900), "2": (5 + 10, 5 + 990), "3": (50, 50), "4": (7, 7)}
    # thread 3 started meanwhile (no difference to take), thread 4 did not run
    expected = (900 * 0.5 + 10 * 990 / 1000) / 910
    assert work_wait(before, after) == pytest.approx(expected)
    assert work_wait(before, after) < 0.51 < 1890 / 2800
    assert math.isnan(work_wait(before, {"4": (7, 7)})) and math.isnan(work_wait({}, after))


HOG = """
import time
print("spinning", flush=True)
end = time.perf_counter() + 20  # killed long before
while time.perf_counter() < end:
    pass
"""


def test_a_thread_beside_more_busy_processes_than_cpus_waits_for_one(
    samplers: list[Sampler], clock: tuple[int, int]
) -> None:
    """The main thread spins 0.5 s beside 2 processes per CPU that spin too: 2C + 1 loads on
    C CPUs leave each about C / (2C + 1) of a CPU, so the threads that worked (the main one)
    waited about half their runnable time, whatever the other load; the samples the thread
    takes, and the first one, have nothing to read it from."""
    s = make(samplers, clock, period_s=0.05)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for _ in range(2 * (os.cpu_count() or 1))]  # fmt: skip
    try:
        for hog in hogs:
            assert hog.stdout is not None and hog.stdout.readline() == b"spinning\n"
        s.start()
        busy(0.5)
        s.sample_now()
        s.stop()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    rows = s.drain()
    thorough = rows[rows["sched_wait_ns"] >= 0]
    assert math.isnan(float(thorough["work_wait"][0]))  # nothing before it
    assert float(thorough["work_wait"][1]) > 0.25, thorough["work_wait"]
    assert np.isnan(rows["work_wait"][rows["sched_wait_ns"] < 0]).all()  # the thread's periodic samples
