"""What the kill-at-random and soak tests (tests/mpi, tests/slurm, tests/net) share: finding a
point's rank processes, checking that a crashed point file holds every flushed iteration of every
rank, and that a struck 2-rank file's rows are whole (`check_rows`)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hpcbench.store import schema
from hpcbench.store.reader import PointData, read_point
from hpcbench.worker import LOOP_BEGINS

FLUSH_EVERY = 5
BATCH = 8

# What a rank process runs: the worker itself (mpirun, torchrun, the local executor), or
# submitit's job entry point, into which Slurm's srun starts each rank (the worker runs inside).
WORKER = b"hpcbench.worker"
SUBMITIT_TASK = b"submitit.core._submit"


def in_loop(log: Path) -> bool:
    """Whether the point's ranks are in their timed loop (rank 0 says so once all are)."""
    try:
        return LOOP_BEGINS in log.read_text(errors="replace")
    except OSError:
        return False


def rank_pids(sweep_dir: Path, entry_point: bytes = WORKER) -> list[int]:
    """The live rank processes of this sweep: Python processes running `entry_point` with an
    argument inside `sweep_dir` (srun's own argv names the same module, but srun is no Python)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            comm = (proc / "comm").read_bytes()
        except OSError:
            continue
        if comm.startswith(b"python") and entry_point in argv and any(str(sweep_dir).encode() in a for a in argv):
            pids.append(int(proc.name))
    return pids


def wait_ranks_gone(
    sweep_dir: Path, timeout: float = 30, what: str = "their point", entry_point: bytes = WORKER
) -> None:
    """Wait until no rank process of the sweep is left; AssertionError after `timeout` seconds
    (the ranks outlived `what`)."""
    gone = time.monotonic() + timeout
    while rank_pids(sweep_dir, entry_point):
        assert time.monotonic() < gone, f"ranks outlived {what}"
        time.sleep(0.1)


def check_flushed_rows(path: Path, ranks: int) -> int:
    """The crashed file opens; its flushed rows are whole for every rank. Returns how many."""
    data = read_point(path)
    assert data.status in (schema.STATUS_RUNNING, schema.STATUS_FAILED)
    written = int(data.attrs["iterations_written"])
    assert written % FLUSH_EVERY == 0, "only whole blocks are announced"
    it = data.iterations
    assert it.shape == (ranks, written)
    assert (it["t_start"] > 0).all()
    assert (it["t_end"] > it["t_start"]).all()
    assert (it["samples"] == BATCH).all()
    assert np.isfinite(it["loss"]).all()
    if written:
        assert (np.diff(it["t_start"], axis=1) > 0).all()
        assert set(data.comm["rank"].tolist()) == set(range(ranks)), "every rank's messages of flushed blocks"
        assert (data.comm["iteration"] < written).all()
    return written


def check_rows(data: PointData, stopped: bool) -> int:
    """Both ranks' rows, as many on each, all valid, with their messages (a stopped file: every
    message of every kept iteration). Returns how many."""
    written = int(data.attrs["iterations_written"])
    it = data.iterations
    assert it.shape == (2, written)
    assert (it["t_start"] > 0).all()
    assert (it["t_end"] > it["t_start"]).all()
    assert (it["samples"] == BATCH).all()
    assert (data.comm["iteration"] < written).all()
    if stopped:
        assert np.array_equal(np.bincount(data.comm["rank"], minlength=2), [written, written])
    elif written:
        assert set(data.comm["rank"].tolist()) == {0, 1}
    return written
