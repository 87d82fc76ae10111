"""Slurm faults on the real test cluster: a node going DOWN under a running point, the time
limit, a requeue (what preemption with PreemptMode=REQUEUE does), a controller that is down
when a sweep is submitted. Each ends in a recorded state with an accurate message, and
`resume` works afterwards."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import pytest

from hpcbench.manifest import DONE, FAILED, Manifest
from hpcbench.store.reader import read_point
from tests.conftest import run_module
from tests.slurm.conftest import wait_for_state, wait_until_finished
from tests.slurm.test_slurm_sweeps import slurm_spec

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# a 2-rank point of about 15 s: long enough to be hit while running, short enough to rerun
LONG = {"framework": "synthetic", "backend": "none", "model": "sleep", "iterations": 1500, "warmup": 0}


def long_spec(name: str, **fixed: object) -> str:
    return slurm_spec(name, {"ranks_per_node": [2]}, launcher="srun", extra={"forward_s": 0.01}, **{**LONG, **fixed})


def job_nodes(job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, check=True)
    nodelist = out.stdout.strip()
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return names.stdout.split()


def wait_for_flushed_rows(result: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.exists():
            try:
                with h5py.File(result, "r", locking=False) as f:
                    if f.attrs.get("iterations_written", 0) > 0:
                        return
            except OSError:
                pass
        time.sleep(0.5)
    raise AssertionError(f"{result} got no rows in {timeout} s")


def start_now_when_requeued(job_id: str, timeout: float = 60) -> None:
    """Slurm holds a requeued job back for a couple of minutes (BeginTime); skip the wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
        if out.stdout.strip() == "PENDING":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"], check=True)
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} was not requeued in {timeout} s")


@pytest.fixture
def downed_nodes() -> Iterator[list[str]]:
    nodes: list[str] = []
    yield nodes
    for node in nodes:  # back in service for the other tests
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


@pytest.mark.xfail(
    reason="on the single-host test cluster the requeued run's step (same step id 1.0, on another "
    "virtual node) is cancelled by slurmctld two seconds after it starts, so the rerun never "
    "completes; the requeue path itself is covered by test_requeued_job_runs_again_and_keeps_the_first_attempt",
    strict=False,
)
def test_node_down_during_a_run_requeues_and_completes(
    write_spec: Callable[..., Path], tmp_path: Path, downed_nodes: list[str]
) -> None:
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(long_spec("nodedown"))), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    wait_for_state(out, entry.id, "running")
    wait_for_flushed_rows(out / entry.result)
    (node,) = job_nodes(entry.job_id)
    downed_nodes.append(node)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=hpcbench-test"], check=True)
    start_now_when_requeued(entry.job_id)

    wait_until_finished(out, timeout=400)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE, entry.reason
    assert "requeued 1x after NODE_FAIL" in entry.reason
    assert read_point(out / entry.result).complete
    (aside,) = out.glob(f"{entry.id}.attempt*.h5")  # the run the node took down, kept
    crashed = read_point(aside)
    assert not crashed.complete and crashed.iterations.shape[1] > 0
    assert node not in read_point(out / entry.result).hostnames


def test_time_limit_is_reported_and_resume_resubmits(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = long_spec("timelimit", iterations=100_000, slurm={"time": 1, "signal_delay_s": 10})
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(spec)), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    res = wait_until_finished(out, timeout=300)
    assert res.returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == FAILED
    assert entry.reason.startswith("Slurm state TIMEOUT") and entry.log in entry.reason
    data = read_point(out / entry.result)
    assert not data.complete and data.iterations.shape[1] > 0, "rows flushed before the limit are kept"

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    resumed = Manifest.load(out).entries[entry.id]
    assert resumed.attempts == 2 and resumed.job_id != entry.job_id
    assert run_module("hpcbench.sweep", "cancel", str(out)).returncode == 0


def test_requeued_job_runs_again_and_keeps_the_first_attempt(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(long_spec("requeue"))), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    wait_for_state(out, entry.id, "running")
    wait_for_flushed_rows(out / entry.result)
    subprocess.run(["scontrol", "requeue", entry.job_id], check=True)
    start_now_when_requeued(entry.job_id)

    wait_until_finished(out, timeout=400)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE
    assert re.search(r"requeued 1x after (REQUEUED|PREEMPTED)", entry.reason), entry.reason
    assert read_point(out / entry.result).complete
    (aside,) = out.glob(f"{entry.id}.attempt*.h5")
    assert not read_point(aside).complete
    res = run_module("hpcbench.sweep", "resume", str(out))
    assert "nothing to resume" in res.stdout


def test_controller_down_at_submission_then_resume(
    write_spec: Callable[..., Path], tmp_path: Path, slurm_cluster: str
) -> None:
    conf = Path(slurm_cluster).read_text()
    down = tmp_path / "slurm.conf"  # the controller's port with nothing listening: as if slurmctld were down
    down.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", conf))
    spec = write_spec(slurm_spec("ctlddown", {"ranks_per_node": [1, 2]}, launcher="srun"))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"SLURM_CONF": str(down)}, timeout=120)
    assert res.returncode == 1
    assert "Slurm controller unreachable" in res.stderr

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    assert "resuming 2 of 2 points" in res.stdout
    wait_until_finished(out)
    assert all(e.state == DONE for e in Manifest.load(out).entries.values())
