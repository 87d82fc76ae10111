"""`hpcbench cancel DIR` stops a local sweep that is running: the sweep command, which holds
the directory's lock, is asked to stop (a cancel request in the lock file, then SIGTERM); its
running point's ranks finish their iteration, stop together and keep every row; the point is
recorded `stopped`, "cancelled by the user"; the points it had not started stay pending; the
sweep command ends; no rank is left; and cancel says what it stopped."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.executors.base import CANCELLED
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.lock import holder
from hpcbench.sweepdir.manifest import PENDING, STOPPED, Manifest
from hpcbench.testing.crash import BATCH, rank_pids
from tests.conftest import run_module, spec_text
from tests.mpi.test_stop_mpi import FORWARD_S, ITERATIONS, TENSORS, check_stopped, finish, start_sweep

pytestmark = pytest.mark.mpi


def test_cancel_stops_the_running_local_sweep_and_names_what_it_stopped(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    # two points of at least 10 s each (ITERATIONS x FORWARD_S); the first is struck in its loop
    text = spec_text(
        "cancel", {"seed": [0, 1]}, framework="synthetic", backend="none", model="sleep", launcher="mpirun",
        ranks_per_node=2, iterations=ITERATIONS, warmup=0, batch_size=BATCH,
        extra={"forward_s": FORWARD_S, "comm_bytes": 4096, "comm_tensors": TENSORS},
        options={"flush_every": ITERATIONS, "sample_period_s": 0.05},
    )  # fmt: skip
    out = tmp_path / "sweep"
    t0 = time.monotonic()
    sweep, _ = start_sweep(write_spec(text), out, 2)
    running = holder(out)
    assert running is not None and running.pid == sweep.pid and running.command == "run"
    first, second = Manifest.load(out).entries.values()
    assert first.state == "running" and second.state == PENDING

    res = run_module("hpcbench", "cancel", str(out), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rc, output = finish(sweep, out)  # the sweep command has ended, and no rank is left (finish checks)
    assert rc == 128 + signal.SIGTERM, output
    assert "stopped: cancelled by the user" in output
    assert time.monotonic() - t0 < 60

    lines = res.stdout.splitlines()
    assert lines[0] == f"stopping the sweep running in {out} (pid {sweep.pid}); its ranks finish the iteration in " \
                       "progress and write their rows"  # fmt: skip
    assert lines[1] == f"cancelled 1 point: {first.id}"
    (row,) = [line for line in lines if line.strip().startswith(first.id)]
    assert " stopped " in row and f"{CANCELLED}; see " in row
    assert "1 point never ran (pending)" in res.stdout and "resume" in res.stdout

    first, second = Manifest.load(out).entries.values()
    assert first.state == STOPPED and first.reason.startswith(f"{CANCELLED}; see "), first.reason
    assert second.state == PENDING and second.attempts == 0, "a point not yet started is not run"
    check_stopped(read_point(out / first.result), 2, CANCELLED)
    assert not rank_pids(out) and holder(out) is None

    again = run_module("hpcbench", "cancel", str(out))
    assert again.returncode == 0 and again.stdout.startswith("nothing to cancel"), again.stdout + again.stderr
