"""Signals from Slurm on the real test cluster: `scancel --signal=TERM` and `scancel` of a running
point, `scontrol requeue` of one (what preemption with PreemptMode=REQUEUE does), and the
time limit's warning signal. The ranks stop together and keep every row although none was
flushed yet, the point is recorded `stopped` with the reason (or, requeued, runs again and
completes), and `resume` completes a stopped point, keeping the stopped attempt aside."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.manifest import DONE, STOPPED, Manifest
from hpcbench.testing.crash import SUBMITIT_TASK, in_loop, rank_pids, wait_ranks_gone
from tests.conftest import run_module
from tests.slurm.conftest import slurm_spec, wait_for_state, wait_until_finished
from tests.slurm.test_slurm_faults import start_now_when_requeued

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# A 2-rank srun point of at least 20 s (2000 iterations of at least 10 ms each), whose rows
# are never flushed before its end: every row a stopped file holds was written by the stop.
ITERATIONS = 2000
POINT = {"framework": "synthetic", "backend": "none", "model": "sleep", "warmup": 0, "launcher": "srun"}


def stop_spec(name: str, iterations: int = ITERATIONS, **fixed: object) -> str:
    options = {"flush_every": 10 * iterations, "sample_period_s": 0.1}
    extra = {"forward_s": 0.01, "comm_bytes": 4096}
    return slurm_spec(
        name, {"ranks_per_node": [2]}, iterations=iterations, extra=extra, options=options, **{**POINT, **fixed}
    )


def ranks_in_loop(out: Path, log: Path, timeout: float = 120) -> None:
    """Until both ranks (submitit task processes, the worker inside) are in their timed loop."""
    deadline = time.monotonic() + timeout
    while not (len(rank_pids(out, SUBMITIT_TASK)) == 2 and in_loop(log)):
        assert time.monotonic() < deadline, "the ranks did not reach their timed loop"
        time.sleep(0.05)


def check_stopped(data: PointData, reason: str) -> int:
    assert data.stopped and data.attrs["stop_reason"] == reason, (data.status, data.attrs.get("stop_reason"))
    stopped_at = int(data.attrs["iterations_written"])
    it = data.iterations
    assert it.shape == (2, stopped_at) and 0 < stopped_at < int(data.attrs["n_iterations"])
    assert (it["t_start"] > 0).all() and (it["t_end"] > it["t_start"]).all()
    assert (np.diff(it["t_start"], axis=1) > 0).all()
    assert len(data.comm) == 2 * stopped_at, "every all-reduce of every kept iteration, from both ranks"
    return stopped_at


def resume_completes(out: Path, stopped_at: int) -> None:
    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    wait_until_finished(out, timeout=300)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE and entry.attempts == 2, entry.reason
    assert read_point(out / entry.result).complete
    (aside,) = out.glob(f"{entry.id}.attempt*.h5")
    assert read_point(aside).iterations.shape == (2, stopped_at), "the stopped attempt is kept as it was"


@pytest.mark.parametrize(
    ("scancel", "reason"),
    [(["--signal=TERM"], "signal 15 (SIGTERM)"), ([], "cancelled")],
    ids=["signal-TERM", "cancel"],
)
def test_scancel_stops_the_ranks_together_and_resume_completes(
    scancel: list[str], reason: str, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(stop_spec("scancel"))), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    wait_for_state(out, entry.id, "running")
    ranks_in_loop(out, Path(entry.log))
    time.sleep(1.0)
    subprocess.run(["scancel", *scancel, entry.job_id], check=True)

    assert wait_until_finished(out).returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED, entry.reason
    assert entry.reason == f"{reason}; see {entry.log}"
    stopped_at = check_stopped(read_point(out / entry.result), reason)
    wait_ranks_gone(out, 60, "their job", SUBMITIT_TASK)
    resume_completes(out, stopped_at)


def test_requeue_keeps_the_stopped_run_and_the_rerun_completes(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(stop_spec("requeue"))), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    wait_for_state(out, entry.id, "running")
    ranks_in_loop(out, Path(entry.log))
    time.sleep(1.0)
    subprocess.run(["scontrol", "requeue", entry.job_id], check=True)
    start_now_when_requeued(entry.job_id)

    wait_until_finished(out, timeout=400)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE, entry.reason
    assert re.search(r"requeued 1x after (REQUEUED|PREEMPTED)", entry.reason), entry.reason
    assert read_point(out / entry.result).complete
    (aside,) = out.glob(f"{entry.id}.attempt*.h5")  # the run the requeue stopped, every row kept
    kept = read_point(aside)
    check_stopped(kept, str(kept.attrs.get("stop_reason")))
    assert kept.attrs["stop_reason"] in ("requeued", "signal 15 (SIGTERM)")


def test_time_limit_signal_stops_the_ranks_and_resume_resubmits(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    # USR2 10 s before the 1-minute limit; the point would need at least 1000 s
    spec = stop_spec("limit", iterations=100_000, slurm={"time": 1, "signal_delay_s": 10})
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(spec)), "--out", str(out)).returncode == 0
    assert wait_until_finished(out, timeout=300).returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == STOPPED, entry.reason
    assert entry.reason == f"time limit; see {entry.log}"
    check_stopped(read_point(out / entry.result), "time limit")

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    resumed = Manifest.load(out).entries[entry.id]
    assert resumed.attempts == 2 and resumed.job_id != entry.job_id
    assert run_module("hpcbench.sweep", "cancel", str(out)).returncode == 0
