"""Slurm faults on the real test cluster: ranks killed at random moments, a node going DOWN
under a running point, the time limit, a requeue (what preemption with PreemptMode=REQUEUE
does), a controller that is down when a sweep is submitted. Each ends in a recorded state
with an accurate message, and `resume` works afterwards."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import pytest

from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, STOPPED, Manifest
from hpcbench.testing.crash import BATCH, FLUSH_EVERY, SUBMITIT_TASK, WORKER, check_flushed_rows, in_loop, rank_pids
from tests.conftest import run_module
from tests.slurm.conftest import slurm_spec, wait_for_state, wait_until_finished

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# A 2-rank point of at least 20 s (2000 iterations of 10 ms), flushed every 50 iterations.
# The tests strike once the first rows are flushed (about 0.5 s in), well before the end: on
# a loaded machine a fault that came late found the first run finished, with no incomplete
# attempt left to keep. (Slurm's SIGTERM now stops the ranks together, keeping every row:
# tests/slurm/test_slurm_preempt.py.)
LONG = {"framework": "synthetic", "backend": "none", "model": "sleep", "iterations": 2000, "warmup": 0}
LONG_FLUSH_EVERY = 50


def long_spec(name: str, **fixed: object) -> str:
    options = {"flush_every": LONG_FLUSH_EVERY}
    return slurm_spec(
        name, {"ranks_per_node": [2]}, launcher="srun", extra={"forward_s": 0.01}, options=options, **{**LONG, **fixed}
    )


def job_nodes(job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, check=True)
    nodelist = out.stdout.strip()
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return names.stdout.split()


def wait_for_flushed_rows(result: Path, at_least: int = 1, timeout: float = 120, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.exists():
            try:  # without HDF5's file lock, which the running writer holds
                with h5py.File(result, "r", locking=False) as f:
                    if f.attrs.get("iterations_written", 0) >= at_least:
                        return
            except OSError:  # being created: look again
                pass
        time.sleep(poll)
    raise AssertionError(f"{result} got no {at_least} rows in {timeout} s")


def step_daemons(job_id: str) -> list[int]:
    """This cluster's live slurmstepd processes of job `job_id` (titled `slurmstepd: [JOB.STEP]`).
    Every virtual node runs on this host, so they are all visible here."""
    title = f"slurmstepd: [{job_id}.".encode()
    conf = f"SLURM_CONF={os.environ['SLURM_CONF']}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc / "cmdline").read_bytes().startswith(title) and conf in (proc / "environ").read_bytes().split(
                b"\0"
            ):
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


def start_now_when_requeued(job_id: str, timeout: float = 60) -> None:
    """Start a requeued job now instead of after the hold Slurm gives it (BeginTime), but only
    once the steps of its previous run have ended, which is what the hold waits for.

    A rerun numbers its steps from 0 again. Released earlier, it met the old run's step N.0
    still ending on the DOWN node (whose slurmd lives on, on this one host): when KillWait ran
    out, that step's PMIx error handler asked slurmctld to kill step N.0, which by then was
    the rerun's, two seconds into it.
    """
    deadline = time.monotonic() + timeout
    state = ""
    while state != "PENDING":
        assert time.monotonic() < deadline, f"job {job_id} was not requeued in {timeout} s"
        time.sleep(0.5)
        state = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
    raw = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%A"], capture_output=True, text=True, check=True)
    while step_daemons(raw.stdout.strip()):
        assert time.monotonic() < deadline, f"the steps of job {job_id}'s first run did not end in {timeout} s"
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"], check=True)


@pytest.fixture
def downed_nodes() -> Iterator[list[str]]:
    nodes: list[str] = []
    yield nodes
    for node in nodes:  # back in service for the other tests
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


@pytest.mark.parametrize("seed", range(int(os.environ.get("HPCBENCH_CRASH_SEEDS", "3"))))
def test_ranks_killed_at_random_keep_flushed_rows_and_resume_completes(
    seed: int, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """SIGKILL one rank, or every rank, of a 2-node PyTorch point at a random moment: during
    start-up, or after a random number of flushed blocks (in a step or in a flush)."""
    rng = random.Random(seed)
    launcher = ("srun", "mpirun")[seed % 2]
    whole_job = seed % 3 == 2
    # Once a rank died, mpirun's daemons stop the others in 2 x odls_base_sigkill_timeout
    # whatever they do (Open MPI 4.1 sleeps, sends SIGTERM, sleeps, sends SIGKILL): Open MPI's
    # own 1 s here, not the test cluster's 10 s, which is for ranks that stop together
    environ = {"OMPI_MCA_odls_base_sigkill_timeout": "1"} if launcher == "mpirun" else {}
    spec = slurm_spec(
        f"slurmcrash{seed}", {"nodes": [2]}, launcher=launcher, ranks_per_node=1, threads=1, environ=environ,
        iterations=600, warmup=0, batch_size=BATCH, options={"flush_every": FLUSH_EVERY, "sample_period_s": 0.05},
    )  # fmt: skip
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(write_spec(spec)), "--out", str(out)).returncode == 0
    (entry,) = Manifest.load(out).entries.values()
    result = out / entry.result
    deadline = time.monotonic() + 120
    while len(pids := rank_pids(out, SUBMITIT_TASK if launcher == "srun" else WORKER)) < 2:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.02)
    during_start = rng.random() < 0.3
    if during_start:  # importing torch, joining the world, creating the file
        time.sleep(rng.uniform(0.0, 3.0))
    else:  # at most half-way through the 600 iterations
        wait_for_flushed_rows(result, at_least=rng.randrange(1, 50) * FLUSH_EVERY, poll=0.02)
        time.sleep(rng.uniform(0.0, 0.05))
    for pid in pids if whole_job else [rng.choice(pids)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    assert wait_until_finished(out).returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == FAILED, entry.reason
    assert entry.reason.startswith("Slurm state ") and entry.log in entry.reason, entry.reason
    assert Path(entry.log).exists()
    assert not result.with_name(result.name + ".new").exists()  # a file killed while made is not left
    # Struck after flushed rows were seen, the file is there; struck during start-up, it is there
    # once the ranks reached their loop (they create it before), and may be missing only before
    if not during_start or in_loop(Path(entry.log)):
        assert result.exists(), "the ranks had created their point file, and it is gone"
    written = None  # no file: the kill came before the ranks created it
    if result.exists():
        written = check_flushed_rows(result, 2)
        assert read_point(result).attrs["failure"] == entry.reason

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    wait_until_finished(out)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE and entry.attempts == 2, entry.reason
    assert read_point(result).complete
    asides = list(out.glob(f"{entry.id}.attempt*.h5"))
    if written is None:
        assert asides == [], "no crashed file, nothing to keep aside"
    else:
        (aside,) = asides
        assert int(read_point(aside).attrs["iterations_written"]) == written, "the crashed attempt is kept as it was"


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
    # the time limit's warning signal stops the ranks together: stopped, every row kept, resumable
    assert entry.state == STOPPED and entry.reason == f"time limit; see {entry.log}"
    data = read_point(out / entry.result)
    assert data.stopped and data.attrs["stop_reason"] == "time limit" and data.iterations.shape[1] > 0

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
    assert res.returncode == 2  # the command could not do what it was asked
    assert "Slurm controller unreachable" in res.stderr

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    assert "resuming 2 of 2 points" in res.stdout
    wait_until_finished(out)
    assert all(e.state == DONE for e in Manifest.load(out).entries.values())
