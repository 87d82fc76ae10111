"""What the executors record of a rank that ran out of memory: its account read back from a
real log, the point file marked `out_of_memory` (or made, with no rows, where the ranks left
none), the local executor's and Slurm's verdicts. The ranks themselves:
tests/frameworks/test_out_of_memory.py."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pytest

from hpcbench.executors import local
from hpcbench.executors.slurm import executor as slurm
from hpcbench.rank.failures import failure_hint, out_of_memory, write_account, write_out_of_memory
from hpcbench.rank.memory import GB, OutOfMemory
from hpcbench.spec import Point
from hpcbench.store import oom, schema
from hpcbench.store.reader import read_point
from hpcbench.store.status import final, result_status
from hpcbench.sweepdir import manifest as mf
from hpcbench.testing.fabricate import write_point_file

POINT = Point(ranks_per_node=2, model="gpt_tiny", memory_limit_gb=1.0)
FACTS = OutOfMemory(1, "step", 3, 900 * 2**20, -1, GB, "RuntimeError: DefaultCPUAllocator: can't allocate memory")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _log(path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The accounts written so far, as the ranks' log."""
    with path.open("a") as f:
        f.write(capsys.readouterr().err)
    return path


def test_the_account_of_the_rank_that_ran_out_is_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    since = _now()
    write_out_of_memory(POINT.id, FACTS)
    write_account(0, POINT.id, "failed: RuntimeError: Connection closed by peer")  # its peer, later
    log = _log(tmp_path / "point.log", capsys)
    assert out_of_memory([log], since) == FACTS
    assert f"rank 1 of point {POINT.id} out of memory: " in failure_hint([log], since)
    assert out_of_memory([log], _now()) is None  # written before this run began


def test_a_failure_before_it_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    since = _now()
    write_account(0, POINT.id, "failed: ValueError: bad shard")
    write_out_of_memory(POINT.id, FACTS)
    assert out_of_memory([_log(tmp_path / "point.log", capsys)], since) is None


def test_a_point_that_ran_out_before_its_file_gets_one_with_no_rows(tmp_path: Path) -> None:
    path = tmp_path / f"{POINT.id}.h5"
    assert oom.mark_out_of_memory(path, FACTS, POINT, "sweep")
    data = read_point(path)
    assert (data.status, data.point, data.iterations.shape) == (schema.STATUS_OOM, POINT, (2, 0))
    assert oom.out_of_memory(path) == FACTS
    assert final(result_status(path))  # resume leaves it
    assert not oom.mark_out_of_memory(tmp_path / "none.h5", FACTS)  # no file, no point: nothing made


def test_the_local_executor_records_the_point_out_of_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file the ranks left `running` (they were in their loop), a log whose first account is
    the out-of-memory one, the launcher's non-zero exit: the point is a result."""
    result = tmp_path / f"{POINT.id}.h5"
    rows = np.zeros((2, 2), dtype=schema.ITERATION_DTYPE)
    write_point_file(result, POINT, rows, status=schema.STATUS_RUNNING)
    entry = mf.Entry(POINT.id, POINT.label(), POINT.as_dict(), state=mf.RUNNING, started=mf.now())
    write_out_of_memory(POINT.id, FACTS)
    log = _log(tmp_path / "point.log", capsys)
    local._settle(entry, result, log, 134, "")
    assert entry.state == mf.OUT_OF_MEMORY
    assert entry.reason == f"{FACTS.summary()}; see {log}"
    assert FACTS.summary() == "rank 1 ran out of memory in step at iteration 3: peak RSS 0.88 GiB (limit 1.00 GiB)"
    data = read_point(result)
    assert data.status == schema.STATUS_OOM
    assert data.iterations.shape == (2, 2)  # the rows it had flushed stay
    assert oom.out_of_memory(result) == FACTS


def test_slurm_records_a_job_whose_rank_ran_out_as_out_of_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = _now()
    write_out_of_memory(POINT.id, FACTS)
    log = _log(tmp_path / "123_0_log.out", capsys)
    entry = mf.Entry(POINT.id, POINT.label(), POINT.as_dict(), state=mf.RUNNING, job_id="123", log=str(log))
    verdict = slurm._verdict(entry, [slurm.Run("FAILED", started)], None, schema.STATUS_RUNNING)
    assert verdict is not None
    assert (verdict.state, verdict.oom) == (mf.OUT_OF_MEMORY, FACTS)
    assert verdict.reason == f"{FACTS.summary()}; see {log}"
    # a job Slurm's memory limit killed, no account of the ranks: a failure, as before
    killed = mf.Entry(
        POINT.id,
        POINT.label(),
        POINT.as_dict(),
        state=mf.RUNNING,
        job_id="124",
        log=str(tmp_path / "x" / "124_0_log.out"),
    )
    failed = slurm._verdict(killed, [slurm.Run("OUT_OF_MEMORY", started)], None, None)
    assert failed is not None
    assert failed.state == mf.FAILED
