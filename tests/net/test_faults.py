"""Network faults under a running point: a real 3-rank MPI point (synthetic workload, real
all-reduces of `comm_bytes`), one rank per node of the network lab (one network namespace per
node, mpirun reaching them through its remote shell), while a fault strikes node 3 (or nodes 1
and 2) once a few blocks are flushed.

Each fault ends one way, known in advance:

* a link blip shorter than the stall timeout, 30 % packet loss, a throttled link: the point
  completes (TCP retransmits through a blip and through loss, a slow link is only slow); every
  row is there, and the fault shows in them (the blip's gap, the throttled iterations' time
  against the link's rate, the drops counted by the rules);
* the link down for longer than the stall timeout, a partition: the point fails within its
  stall timeout + MARGIN_S, with the watchdog's account naming the stalled collective and the
  peer that cannot be reached; every block flushed before the fault is in the file; no rank or
  MPI daemon is left; once the fault is lifted, `resume` completes the point.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from hpcbench.executors.local import LINGER_S
from hpcbench.rank.peers import PROBE_S
from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, Entry, Manifest
from hpcbench.testing.crash import BATCH, FLUSH_EVERY, check_flushed_rows, rank_pids
from hpcbench.testing.faults import Faults, ensure_nftables
from hpcbench.testing.netlab import Lab
from tests.conftest import ROOT, run_module, skip_unless_required

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

NODES = 3  # rank r runs on node r + 1; the faults strike node 3 (rank 2) or nodes 1 and 2

STALL_S = 10.0
# After the stall timeout: the watchdog's probe of its peers (PROBE_S), the launcher outliving
# its ranks while it waits for the daemon of a node it lost (LINGER_S), and a loaded 2-core machine.
MARGIN_S = PROBE_S + LINGER_S + 30
FORWARD_S = 0.01
PACKETS = 200  # crossing a lossy link's rules: enough to measure the share dropped


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        skip_unless_required("the network lab needs root and iproute2")
    with Lab(nodes=NODES, subnet="10.233.0.0/24", prefix="hbf") as lab:
        yield lab


@pytest.fixture
def faults(lab: Lab) -> Iterator[Faults]:
    ensure_nftables()
    with Faults(lab) as faults:
        yield faults


def write_spec(lab: Lab, tmp_path: Path, iterations: int, comm_bytes: int, stall_s: float) -> Path:
    """A spec of one 3-rank point whose mpirun places one rank on each node of the lab."""
    subnet = str(lab.subnet)
    profile = {
        "description": "the network lab: one rank per node namespace",
        "mpirun_args": [
            "--host", ",".join(f"{n.namespace}:1" for n in lab.nodes),
            "--mca", "plm_rsh_agent", str(lab.rsh_agent(tmp_path)), "--mca", "btl", "self,tcp",
            "--mca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet,
        ],
        "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
    }  # fmt: skip
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(profile))
    spec: dict[str, Any] = {
        "name": "faults", "executor": "local", "profile": str(tmp_path / "lab.yaml"),
        "matrix": {"ranks_per_node": [NODES]},
        "fixed": {"framework": "synthetic", "backend": "none", "model": "sleep", "launcher": "mpirun",
                  "batch_size": BATCH, "iterations": iterations, "warmup": 0,
                  "extra": {"forward_s": FORWARD_S, "comm_bytes": comm_bytes}},
        "options": {"flush_every": FLUSH_EVERY, "stall_timeout_s": stall_s, "timeout_s": 400},
    }  # fmt: skip
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(spec: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def flushed(out: Path, sweep: subprocess.Popen[str], at_least: int, timeout: float = 180) -> int:
    """Wait until the running point has flushed `at_least` iterations; how many it has."""
    deadline = time.monotonic() + timeout
    while True:
        assert sweep.poll() is None, "the point ended before the fault"
        assert time.monotonic() < deadline, "no rows flushed in time"
        for path in out.glob("*.h5"):
            try:  # without HDF5's file lock, which the running writer holds
                with h5py.File(path, "r", locking=False) as f:
                    written = int(f.attrs.get("iterations_written", 0))
                    if written >= at_least:
                        return written
            except OSError:  # being created: look again
                pass
        time.sleep(0.1)


def ended(sweep: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        output, _ = sweep.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        sweep.kill()
        output, _ = sweep.communicate()
        pytest.fail(f"the sweep hung: {output[-3000:]}")
    return output


def entry_of(out: Path) -> Entry:
    (entry,) = Manifest.load(out).entries.values()
    return entry


def no_strays(out: Path, tmp_path: Path) -> None:
    """No rank of the point, no MPI daemon started through this test's remote shell, is left."""
    gone = time.monotonic() + 30
    while True:
        ranks = rank_pids(out)
        daemons = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    argv = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if str(tmp_path).encode() in argv and b"orted" in argv:
                    daemons.append(int(proc.name))
        if not ranks and not daemons:
            return
        assert time.monotonic() < gone, f"left behind: ranks {ranks}, daemons {daemons}"
        time.sleep(0.2)


def wall(data: PointData, t: np.ndarray) -> np.ndarray:
    """Seconds on the point's clock as wall-clock time (time.time())."""
    return t + int(data.attrs["epoch_ns"]) / 1e9


def check_complete(out: Path, iterations: int) -> PointData:
    entry = entry_of(out)
    assert entry.state == DONE, entry.reason
    data = read_point(out / entry.result)
    assert data.complete and data.iterations.shape == (NODES, iterations)
    assert (data.iterations["samples"] == BATCH).all()
    return data


def check_failed_cleanly(out: Path, tmp_path: Path, before: int, struck: float, end: float) -> str:
    """Failed within the stall timeout + margin, every block flushed before the fault kept, nothing
    left behind; the reason."""
    assert end - struck < STALL_S + MARGIN_S, f"ended {end - struck:.0f} s after the fault"
    entry = entry_of(out)
    assert entry.state == FAILED, entry.reason
    written = check_flushed_rows(out / entry.result, NODES)
    assert written >= before, f"{before} rows flushed before the fault, {written} in the file"
    no_strays(out, tmp_path)
    return entry.reason


def resume_completes(out: Path, iterations: int) -> None:
    res = run_module("hpcbench.sweep", "resume", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    check_complete(out, iterations)
    assert list(out.glob("*.attempt1.h5")), "the failed attempt is kept beside"


def test_a_link_blip_shorter_than_the_stall_timeout_is_ridden_out(lab: Lab, faults: Faults, tmp_path: Path) -> None:
    blip, iterations = 3.0, 400
    out = tmp_path / "sweep"
    sweep = start(write_spec(lab, tmp_path, iterations, 1024, STALL_S), out)
    flushed(out, sweep, 4 * FLUSH_EVERY)
    faults.link_down(3, seconds=blip)
    struck = time.time()  # the link is down from just before this until `blip` s after
    ended(sweep)
    data = check_complete(out, iterations)
    # No all-reduce can finish without node 3: no iteration ends on any rank while its link is
    # down (1 s of slack at the start for an iteration whose all-reduce was just done), and the
    # loop ran on both sides of the blip.
    ends = wall(data, data.iterations["t_end"])
    assert not ((ends > struck + 1) & (ends < struck + blip)).any(), np.sort(ends.ravel() - struck)
    assert (ends < struck).any() and (ends > struck + blip).any()
    no_strays(out, tmp_path)


def names_the_stalled_collective(reason: str) -> None:
    """The account names the collective each rank in it waits in: the iteration's all-reduce,
    or the flush of rows (a collective write) that ends the block of the iteration after the
    last one it finished. Where the fault lands depends on timing, and the stalled rank and
    the peers that answered its probe may be an iteration apart (CI saw rank 1 waiting in
    iteration 20's all-reduce while rank 0 was still in the flush ending iteration 19); each
    rank's account must be exact against its own last finished iteration."""
    accounts = re.findall(r"last finished iteration (\d+)(.*?)(?=last finished iteration|\Z)", reason)
    assert accounts, reason
    named = 0
    for last, rest in accounts:
        current = int(last) + 1
        message = re.match(r"\)?[;,] waiting in allreduce tensor0 \(1024 B, iteration (\d+)", rest)
        flush = re.match(r"\)?[;,] in the flush of iterations (\d+)-(\d+) \(a collective \w+ write\)", rest)
        if message:
            assert int(message[1]) == current, reason
        if flush:
            assert (int(flush[1]), int(flush[2])) == (current - FLUSH_EVERY + 1, current), reason
        named += bool(message or flush)
    assert named, reason


def test_a_link_down_longer_than_the_stall_timeout_fails_naming_the_lost_node(
    lab: Lab, faults: Faults, tmp_path: Path
) -> None:
    iterations = 600
    out = tmp_path / "sweep"
    sweep = start(write_spec(lab, tmp_path, iterations, 1024, STALL_S), out)
    before = flushed(out, sweep, 4 * FLUSH_EVERY)
    struck = time.monotonic()
    down = faults.link_down(3)
    ended(sweep)
    reason = check_failed_cleanly(out, tmp_path, before, struck, time.monotonic())
    assert "stalled: no iteration finished for" in reason and f"(limit {STALL_S:g} s" in reason, reason
    names_the_stalled_collective(reason)
    assert f"unreachable: rank 2 ({lab.node(3).address})" in reason, reason
    down.undo()
    resume_completes(out, iterations)


def test_a_partition_fails_naming_the_peer_across_it(lab: Lab, faults: Faults, tmp_path: Path) -> None:
    iterations = 600
    out = tmp_path / "sweep"
    sweep = start(write_spec(lab, tmp_path, iterations, 1024, STALL_S), out)
    before = flushed(out, sweep, 4 * FLUSH_EVERY)
    struck = time.monotonic()
    cut = faults.partition(1, 2)
    ended(sweep)
    reason = check_failed_cleanly(out, tmp_path, before, struck, time.monotonic())
    names_the_stalled_collective(reason)
    # ranks 0 and 1 each lose the other; rank 2 still reaches both
    across = {0: f"unreachable: rank 1 ({lab.node(2).address})", 1: f"unreachable: rank 0 ({lab.node(1).address})"}
    assert any(f": rank {r} of point" in reason and across[r] in reason for r in across), reason
    assert "rank 2 (" not in reason.partition("unreachable:")[2].partition(";")[0], reason
    cut.undo()
    resume_completes(out, iterations)


def test_thirty_percent_packet_loss_slows_but_completes(lab: Lab, faults: Faults, tmp_path: Path) -> None:
    """TCP retransmits what is lost; a stall would need one segment lost 9 times in a row
    (0.3^9 = 2e-5) for the retransmission backoff (200 ms doubling) to pass the 60 s limit."""
    iterations = 400
    out = tmp_path / "sweep"
    sweep = start(write_spec(lab, tmp_path, iterations, 1024, 60.0), out)
    flushed(out, sweep, 4 * FLUSH_EVERY)
    with faults.drop(3, 0.3) as loss:
        # At least 6 s, and until enough packets have crossed the rules to measure the share, for
        # at most 15 s: the retransmission backoff can hold all traffic for seconds (88 packets
        # in 6 s seen), and a loss of 15 s cannot back it off past the 60 s stall limit.
        time.sleep(6)
        deadline = time.monotonic() + 9
        while loss.counts()[0] < PACKETS and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    ended(sweep)
    check_complete(out, iterations)
    seen, dropped = loss.counts()
    assert seen >= 50, f"only {seen} packets crossed node 3's rules"
    sigma = (0.3 * 0.7 / seen) ** 0.5  # binomial: the share dropped of `seen` packets
    assert abs(dropped / seen - 0.3) < 4 * sigma, (seen, dropped)
    no_strays(out, tmp_path)


@pytest.mark.quiet  # a rate measured on the throttled link
def test_a_throttled_link_is_slow_at_its_rate_and_completes(lab: Lab, faults: Faults, tmp_path: Path) -> None:
    rate_mbit, nbytes, iterations = 10.0, 256 * 1024, 300
    out = tmp_path / "sweep"
    sweep = start(write_spec(lab, tmp_path, iterations, nbytes, STALL_S), out)
    flushed(out, sweep, 4 * FLUSH_EVERY)
    with faults.throttle(3, rate_mbit):
        began = time.time()
        time.sleep(5)
        lifted = time.time()
    ended(sweep)
    data = check_complete(out, iterations)
    # Every rank's sum needs the part of node 3's buffer it does not hold: at least 2/3 of it
    # leaves node 3 each iteration, at the link's rate (HTB's burst is spent on the first ones).
    floor = 0.5 * nbytes * 8 / (rate_mbit * 1e6)
    it = data.iterations[0]
    inside = (wall(data, it["t_start"]) > began + 1) & (wall(data, it["t_end"]) < lifted)
    assert inside.sum() >= 3, f"{inside.sum()} iterations ran inside the throttled window"
    took = (it["t_end"] - it["t_start"])[inside]
    assert np.median(took) >= floor, (np.median(took), floor)
    no_strays(out, tmp_path)
