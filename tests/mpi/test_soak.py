"""Soak: a stream of short local MPI points while SIGTERM and SIGKILL strike a rank at random
moments (start-up, the loop, a flush, the stop itself, between points).

Whatever happened, every point ends `done`, `stopped` or `failed` with a reason; a stopped
file holds every row of every rank up to one common iteration; a failed one every flushed
block; no process is left; and `resume` completes every point that was not done.
HPCBENCH_SOAK_POINTS=N runs N points instead of 4 (a longer soak).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.store import schema
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, STOPPED, Manifest
from hpcbench.testing.crash import BATCH, FLUSH_EVERY, check_rows, rank_pids, wait_ranks_gone
from tests.conftest import ROOT, run_module, spec_text

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

POINTS = int(os.environ.get("HPCBENCH_SOAK_POINTS", "4"))
ITERATIONS = 400  # of at least 4 ms each: a point's loop lasts at least 1.6 s


def strike(out: Path, until: threading.Event, rng: random.Random, struck: list[tuple[int, str]]) -> None:
    """Until `until`: every 0.3-2.5 s, SIGTERM (3 times in 4) or SIGKILL to one live rank."""
    while not until.wait(rng.uniform(0.3, 2.5)):
        pids = rank_pids(out)
        if not pids:
            continue
        sig = signal.SIGTERM if rng.random() < 0.75 else signal.SIGKILL
        pid = rng.choice(pids)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        struck.append((pid, sig.name))


def test_random_sigterm_and_sigkill_keep_every_row_and_resume_completes(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    rng = random.Random(POINTS)
    text = spec_text(
        "soak", {"seed": list(range(POINTS))}, framework="synthetic", backend="none", model="sleep",
        launcher="mpirun", ranks_per_node=2, iterations=ITERATIONS, warmup=0, batch_size=BATCH,
        extra={"forward_s": 0.004, "comm_bytes": 1024}, options={"flush_every": FLUSH_EVERY, "sample_period_s": 0.05},
    )  # fmt: skip
    out = tmp_path / "sweep"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(write_spec(text)), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    until, struck = threading.Event(), list[tuple[int, str]]()
    striker = threading.Thread(target=strike, args=(out, until, rng, struck))
    striker.start()
    try:
        stdout, stderr = sweep.communicate(timeout=120 + 60 * POINTS)
    finally:
        until.set()
        striker.join()
        if sweep.poll() is None:
            sweep.kill()
    wait_ranks_gone(out)
    assert struck, "nothing was struck"

    entries = list(Manifest.load(out).entries.values())
    assert len(entries) == POINTS, stdout + stderr
    states = {e.state for e in entries}
    assert states <= {DONE, STOPPED, FAILED}, states
    for e in entries:
        result = out / e.result
        if e.state == DONE:
            data = read_point(result)
            assert data.complete and data.iterations.shape == (2, ITERATIONS)
            continue
        assert e.reason and e.log in e.reason, e.reason
        if e.state == STOPPED:  # every row of both ranks up to one common iteration
            data = read_point(result)
            assert data.stopped and data.attrs["stop_reason"], e.reason
            check_rows(data, stopped=True)
        elif result.exists():  # failed: killed before it could stop (or while it wrote), every written row kept
            data = read_point(result)
            assert data.status in (schema.STATUS_RUNNING, schema.STATUS_FAILED)
            check_rows(data, stopped=False)

    res = run_module("hpcbench.sweep", "resume", str(out), timeout=120 + 60 * POINTS)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(e.state == DONE for e in Manifest.load(out).entries.values())
    for e in Manifest.load(out).entries.values():
        assert read_point(out / e.result).complete
    print(f"soak: {POINTS} points, {len(struck)} strikes ({', '.join(sorted(s for _, s in struck))})")
    for e in entries:
        print(f"  {e.id} {e.state}: {e.reason.partition('; see ')[0][:160]}")
