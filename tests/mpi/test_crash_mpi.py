"""Crash safety on real MPI: SIGKILL a rank, or every rank, at a random moment of a run.

Whatever moment the kill lands on (creating the file, inside a step, in the middle of a
flush), the point file must open and hold every iteration up to the last flush, with
every rank's rows valid; the point is recorded failed with the reason and its log; and
`resume` reruns that point alone, keeping the crashed file aside, never touching a
complete one. HPCBENCH_CRASH_SEEDS=N runs N random kills instead of 6 (a longer soak).
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

import h5py
import pytest

from hpcbench.store import schema
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, STOPPED, Manifest
from hpcbench.testing.crash import BATCH, FLUSH_EVERY, check_flushed_rows, in_loop, rank_pids, wait_ranks_gone
from tests.conftest import ROOT, run_module, spec_text

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("seed", range(int(os.environ.get("HPCBENCH_CRASH_SEEDS", "6"))))
def test_random_sigkill_never_loses_a_flushed_iteration(
    seed: int, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    rng = random.Random(seed)
    whole_job = seed % 3 == 2  # every rank at once, as a node failure or scancel -s KILL would
    text = spec_text(
        f"crash{seed}", {"ranks_per_node": [2]}, iterations=100_000, warmup=0, batch_size=BATCH,
        options={"flush_every": FLUSH_EVERY, "sample_period_s": 0.05},
    )  # fmt: skip
    spec = write_spec(text)
    out = tmp_path / "sweep"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(pids := rank_pids(out)) < 2:  # the ranks are up (importing torch, or past it)
            if sweep.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ranks did not start: {sweep.communicate(timeout=60)}")
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 6.0))  # anywhere from start-up to well into the loop
        victims = pids if whole_job else [rng.choice(pids)]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 1, stdout + stderr
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == FAILED
    assert f"see {out / entry.log}" in entry.reason or entry.log in entry.reason
    assert (out / entry.log).exists()
    result = out / entry.result
    assert not result.with_name(result.name + ".new").exists()  # a file killed while made is not left
    # The ranks create the file before their loop, which rank 0 announces once all are in it:
    # a loop that began left a file; only a kill during start-up may leave none.
    began = in_loop(out / entry.log)
    assert result.exists() or not began, "the ranks reached their loop, yet left no point file"
    if result.exists():
        check_flushed_rows(result, 2)


def test_resume_after_a_kill_reruns_only_the_killed_point(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = spec_text(
        "killresume", {"ranks_per_node": [1, 2]}, iterations=60, warmup=0, batch_size=BATCH,
        options={"flush_every": FLUSH_EVERY},
    )  # fmt: skip
    spec = write_spec(text)
    out = tmp_path / "sweep"
    # rank 1 exists only in the 2-rank point: that point dies, the 1-rank one completes
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"HPCBENCH_FAULT": "1:23"})
    assert res.returncode == 1
    entries = {e.point["ranks_per_node"]: e for e in Manifest.load(out).entries.values()}
    assert entries[1].state == DONE and entries[2].state == FAILED
    done_file, failed_file = out / entries[1].result, out / entries[2].result
    done_before = done_file.stat().st_mtime_ns
    crashed = read_point(failed_file)
    assert crashed.status == schema.STATUS_FAILED
    assert int(crashed.attrs["iterations_written"]) == 20, "blocks flushed before iteration 23"

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    entries = {e.point["ranks_per_node"]: e for e in Manifest.load(out).entries.values()}
    assert entries[1].state == DONE and entries[2].state == DONE
    assert entries[1].attempts == 1 and entries[2].attempts == 2
    assert done_file.stat().st_mtime_ns == done_before, "a complete result is never rewritten"
    assert read_point(failed_file).complete
    (aside,) = out.glob(f"{failed_file.stem}.attempt*.h5")
    assert int(read_point(aside).attrs["iterations_written"]) == 20, "the crashed attempt is kept as it was"


def test_sweep_process_killed_leaves_no_ranks_and_resume_finishes(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    text = spec_text(
        "sweepkill", {"ranks_per_node": [2]}, iterations=1500, warmup=0, batch_size=BATCH,
        options={"flush_every": FLUSH_EVERY},
    )  # fmt: skip
    spec = write_spec(text)
    out = tmp_path / "sweep"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # until the ranks have flushed a few blocks
        assert sweep.poll() is None and time.monotonic() < deadline
        entries = list(Manifest.load(out).entries.values()) if (out / "manifest.json").exists() else []
        result = out / entries[0].result if entries else None
        if result is not None and result.exists():
            try:  # without HDF5's file lock, which the running writer holds
                with h5py.File(result, "r", locking=False) as f:
                    if f.attrs.get("iterations_written", 0) >= 4 * FLUSH_EVERY:
                        break
            except OSError:  # being created: look again
                pass
        time.sleep(0.1)
    sweep.kill()  # SIGKILL: no chance to clean up
    sweep.wait()
    wait_ranks_gone(out, what="the sweep process")
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == "running", "the manifest could not know"

    res = run_module("hpcbench.sweep", "status", str(out))
    assert res.returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    # mpirun, dying with the sweep, passes SIGTERM on: the ranks may stop together in time
    assert entry.state in (FAILED, STOPPED)
    assert "the sweep process ended while this point ran" in entry.reason
    data = read_point(out / entry.result)
    written = int(data.attrs["iterations_written"]) if data.stopped else check_flushed_rows(out / entry.result, 2)
    assert written >= 4 * FLUSH_EVERY

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE and entry.attempts == 2
    assert read_point(out / entry.result).complete
    (aside,) = out.glob("*.attempt*.h5")
    assert int(read_point(aside).attrs["iterations_written"]) == written
