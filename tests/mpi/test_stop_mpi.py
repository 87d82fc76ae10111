"""Stopping together on real MPI: SIGTERM (or the time limit's SIGUSR2) to one rank or to every
rank of a running point, to the sweep process, or the sweep's own time limit.

Whatever rank the signal reaches and whenever, every rank finishes the iteration in
progress, the ranks agree on one iteration and stop after it, every row up to it is written
although no block was flushed yet (`flush_every` is larger than the run), the file and the
manifest say `stopped` with the reason, no process is left, and `resume` completes the
point, keeping the stopped attempt aside as it was.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hpcbench.rank.collectives import SelfComm
from hpcbench.rank.stop import EXIT_CODE, Stop, StopSignals, reason_for
from hpcbench.store import schema
from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.manifest import DONE, STOPPED, Manifest
from hpcbench.testing.crash import BATCH, in_loop, rank_pids, wait_ranks_gone
from tests.conftest import ROOT, run_module, spec_text

pytestmark = pytest.mark.mpi

# Each iteration lasts at least FORWARD_S (the synthetic workload never returns early), so a
# run lasts at least 10 s: the tests strike at most 2 s into it, whatever the load.
ITERATIONS = 2500
FORWARD_S = 0.004
TENSORS = 2  # all-reduces per iteration: a rank that stopped alone would leave its peers waiting in them


def stop_spec(name: str, ranks: int, exchange: bool = True, iterations: int = ITERATIONS, **options: object) -> str:
    """A synthetic point whose steps are real all-reduces between the ranks (or, without
    `exchange`, no collective at all, rank r 1 + r/2 times as slow: the ranks drift apart),
    never flushed before the end."""
    extra: dict[str, object] = {"forward_s": FORWARD_S}
    extra.update({"comm_bytes": 4096, "comm_tensors": TENSORS} if exchange else {"rank_scale": 0.5})
    return spec_text(
        name, {"ranks_per_node": [ranks]}, framework="synthetic", backend="none", model="sleep",
        launcher="mpirun", iterations=iterations, warmup=0, batch_size=BATCH, extra=extra,
        options={"flush_every": ITERATIONS, "sample_period_s": 0.05, **options},
    )  # fmt: skip


def start_sweep(
    spec: Path, out: Path, ranks: int, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], list[int]]:
    """The sweep, running, and its ranks' pids once they are in their timed loop."""
    sweep = subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        pids = rank_pids(out)
        if len(pids) == ranks and any(in_loop(log) for log in out.glob("logs/*.log")):
            return sweep, pids
        if sweep.poll() is not None or time.monotonic() > deadline:
            sweep.kill()
            pytest.fail(f"ranks did not reach their loop: {sweep.communicate(timeout=60)}")
        time.sleep(0.02)


def finish(sweep: subprocess.Popen[str], out: Path) -> tuple[int, str]:
    try:
        stdout, stderr = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    wait_ranks_gone(out)
    return sweep.returncode, stdout + stderr


def check_stopped(data: PointData, ranks: int, reason: str, exchange: bool = True) -> int:
    """Every rank's rows cover every iteration up to one common stop, all valid. Returns it."""
    assert data.status == schema.STATUS_STOPPED
    assert data.attrs["stop_reason"] == reason
    stopped_at = int(data.attrs["iterations_written"])
    assert 0 <= stopped_at < int(data.attrs["n_iterations"])
    it = data.iterations
    assert it.shape == (ranks, stopped_at), "every rank stopped after the same iteration, every row written"
    assert (it["t_start"] > 0).all() and (it["t_end"] > it["t_start"]).all()
    assert (it["samples"] == BATCH).all()
    assert (np.diff(it["t_start"], axis=1) > 0).all()
    if exchange:  # every all-reduce of every kept iteration, from every rank
        assert len(data.comm) == ranks * stopped_at * TENSORS
        assert (data.comm["iteration"] < stopped_at).all()
        for r in range(ranks):
            mine = data.comm[data.comm["rank"] == r]
            assert np.array_equal(np.bincount(mine["iteration"], minlength=stopped_at), np.full(stopped_at, TENSORS))
    assert len(data.resources) > 0, "resource samples are written too"
    return stopped_at


def check_resume_completes(out: Path, stopped_at: int) -> None:
    """`resume` reruns the point to completion; the stopped attempt stays aside as it was."""
    res = run_module("hpcbench.sweep", "resume", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resuming 1 of 1 points" in res.stdout
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE and entry.attempts == 2 and entry.reason == ""
    assert read_point(out / entry.result).complete
    (aside,) = out.glob(f"{entry.id}.attempt*.h5")
    kept = read_point(aside)
    assert kept.stopped and kept.iterations.shape[1] == stopped_at


@pytest.mark.parametrize(
    ("ranks", "whom", "exchange"),
    [(3, "one", True), (3, "all", True), (3, "one", False), (1, "one", True)],
    ids=["one-of-3", "all-of-3", "one-of-3-drifting", "single-rank"],
)
def test_sigterm_stops_every_rank_at_one_iteration_and_keeps_every_row(
    ranks: int, whom: str, exchange: bool, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    rng = random.Random(f"{ranks}{whom}{exchange}")
    out = tmp_path / "sweep"
    sweep, pids = start_sweep(write_spec(stop_spec("stop", ranks, exchange)), out, ranks)
    time.sleep(rng.uniform(0.5, 2.0))
    for pid in pids if whom == "all" else [rng.choice(pids)]:
        os.kill(pid, signal.SIGTERM)
    rc, output = finish(sweep, out)
    assert rc == 1, output  # not every point is done
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED, entry.reason
    assert entry.reason.startswith("signal 15 (SIGTERM); see ") and entry.log in entry.reason
    stopped_at = check_stopped(read_point(out / entry.result), ranks, "signal 15 (SIGTERM)", exchange)
    log = (out / entry.log).read_text()
    assert f"stopped after {stopped_at} of {ITERATIONS} iterations (signal 15 (SIGTERM))" in log
    if ranks > 1:
        assert f"Exit code:    {EXIT_CODE}" in log, "every rank exits with the stop's own code"
    check_resume_completes(out, stopped_at)


def test_the_time_limit_signal_is_named(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    spec = write_spec(stop_spec("usr2", 2))
    sweep, pids = start_sweep(spec, out, 2, env={"HPCBENCH_TIME_LIMIT_SIGNAL": "USR2"})
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGUSR2)
    rc, output = finish(sweep, out)
    assert rc == 1, output
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED and entry.reason.startswith("time limit; see "), entry.reason
    check_stopped(read_point(out / entry.result), 2, "time limit")


def test_sweep_interrupted_stops_its_point_and_resume_completes_it(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    spec = write_spec(stop_spec("interrupt", 2))
    sweep, _ = start_sweep(spec, out, 2)
    time.sleep(1.0)
    sweep.send_signal(signal.SIGTERM)  # as a CI timeout or `kill` would
    rc, output = finish(sweep, out)
    assert rc == 128 + signal.SIGTERM, output
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED, entry.reason
    assert entry.reason.startswith("cancelled: the sweep was interrupted; see "), entry.reason
    stopped_at = check_stopped(read_point(out / entry.result), 2, "cancelled: the sweep was interrupted")
    check_resume_completes(out, stopped_at)


def test_the_sweeps_time_limit_stops_the_point(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    # timeout_s counts from the launch: past start-up (seconds), long before the run's end (>= 100 s)
    out = tmp_path / "sweep"
    sweep, _ = start_sweep(write_spec(stop_spec("limit", 2, iterations=10 * ITERATIONS, timeout_s=20)), out, 2)
    rc, output = finish(sweep, out)
    assert rc == 1, output
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED, entry.reason
    assert entry.reason.startswith("time limit: timed out after 20 s; see "), entry.reason
    check_stopped(read_point(out / entry.result), 2, "time limit: timed out after 20 s")


@pytest.mark.parametrize("noted_at", [-1, 0, 7])
def test_the_loop_stops_exactly_where_the_agreement_says(noted_at: int) -> None:
    """In process, one rank: whenever the signal is noted (before the loop: -1), the loop runs
    on to the agreed iteration, and no further, and the agreement names the signal."""
    signals = StopSignals()
    stop = Stop(10_000, SelfComm(), signals)
    if noted_at < 0:
        signals._note(signal.SIGUSR2, None)  # what the handler does
    stop.start()
    ran = 0
    for i in range(10_000):
        stop.current = i
        if stop.pending and not stop.may_start(i):
            break
        if i == noted_at:
            signals._note(signal.SIGTERM, None)
        time.sleep(0.001)  # a step
        ran += 1
    assert stop.finish() == ran
    assert ran >= noted_at + 1, "the iteration in progress is finished"
    assert stop.signum == (signal.SIGUSR2 if noted_at < 0 else signal.SIGTERM)
    stop.close()
    assert reason_for(stop.signum, {}) == f"signal {stop.signum} ({signal.Signals(stop.signum).name})"
    assert reason_for(signal.SIGUSR2, {"HPCBENCH_TIME_LIMIT_SIGNAL": "USR2"}) == "time limit"
