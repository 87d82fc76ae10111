"""The reason a failed point gives is its ranks' own account: the first one written since the
run began (the cause; later ones are ranks that lost a peer to it), found however the other
writers of the logs (ranks, submitit's signal handlers, MPI) interleave with it."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from hpcbench.executors.slurm.executor import _sacct_time, job_logs
from hpcbench.rank.failures import HINT_CHARS, describe, failure_hint, write_account

T0 = "2026-11-24T02:27:18.081000+00:00"
T1 = "2026-11-24T02:27:18.090000+00:00"

# a Slurm time limit as it was logged: submitit's handlers wrote into the traceback
TIME_LIMIT_LOG = f"""\
submitit WARNING (2026-11-24 02:27:18,081) - Caught signal SIGUSR2 on vm: this job is timed-out.
submitit INFO (2026-11-24 02:27:18,081) - Job not requeued because: timed-out too many times.
hpcbench.worker: {T0} rank 0 of point ab7c6f23929e failed: submitit.core.utils.UncompletedJobError: \
Job not requeued because: timed-out too many times.
submitit WARNING (2026-11-24 02:27:18,084) - Bypassing signal SIGCONT
Traceback (most recent call last):
  File "/work/main/hpcbench/worker.py", line 187, in run
    flush()
submitit WARNING (2026-11-24 02:27:18,084) - Bypassing signal SIGCONT
  File "/work/main/hpcbench/comm.py", line 89, in allgather
    result: list[Any] = self._comm.allgather(obj)
submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
srun: error: c1: task 1: Killed
"""


def at(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def test_the_account_is_found_whatever_lands_around_it(tmp_path: Path) -> None:
    log = tmp_path / "8_0_log.out"
    log.write_text(TIME_LIMIT_LOG)
    assert failure_hint([log]) == (
        "rank 0 of point ab7c6f23929e failed: submitit.core.utils.UncompletedJobError: "
        "Job not requeued because: timed-out too many times."
    )


def test_the_first_account_is_the_cause_in_whichever_log_it_is(tmp_path: Path) -> None:
    rank0, rank1 = tmp_path / "5_0_log.out", tmp_path / "5_1_log.out"
    rank0.write_text(f"hpcbench.worker: {T1} rank 0 of point aaa failed: RuntimeError: Connection closed by peer\n")
    rank1.write_text(f"noise hpcbench.worker: {T0} rank 1 of point aaa failed: OSError: disk full\nmore noise\n")
    assert failure_hint([rank0, rank1]) == "rank 1 of point aaa failed: OSError: disk full"
    assert failure_hint([rank0]) == "rank 0 of point aaa failed: RuntimeError: Connection closed by peer"


def test_accounts_of_an_earlier_run_are_not_this_runs_reason(tmp_path: Path) -> None:
    log = tmp_path / "point.log"
    earlier = "hpcbench.worker: 2026-11-24T01:00:00.000000+00:00 rank 1 of point aaa failed: KeyError: y\n"
    log.write_text(earlier + f"=== attempt 2\nhpcbench.worker: {T1} rank 0 of point aaa failed: ValueError: x\n")
    assert failure_hint([log]).startswith("rank 1 of point aaa failed: KeyError")  # no run start given: the first
    assert failure_hint([log], since=at("2026-11-24T02:00:00+00:00")) == "rank 0 of point aaa failed: ValueError: x"
    assert failure_hint([log], since=at("2026-11-24T03:00:00+00:00")) == ""


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Traceback (most recent call last):\nKeyError: 'x'\n",
        "hpcbench.worker: rank 0 of point aaa failed: an unstamped line\n",
        "hpcbench.worker: 2026-11-24T02:27:18 rank 0 of point aaa failed: a stamp without microseconds\n",
    ],
)
def test_no_account_gives_nothing(tmp_path: Path, text: str) -> None:
    log = tmp_path / "log.out"
    log.write_text(text)
    assert failure_hint([log]) == ""
    assert failure_hint([tmp_path / "missing.out"]) == ""


def test_a_written_account_is_one_line_that_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise ValueError("first line\nsecond line " + "x" * 800)
    except ValueError as exc:
        write_account(3, "abc123abc123", f"failed: {describe(exc)}")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcbench.worker: ")
    log = tmp_path / "log.out"
    log.write_text("before\n" + err + "after\n")
    hint = failure_hint([log], since=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=60))
    assert hint.startswith("rank 3 of point abc123abc123 failed: ValueError: first line second line xxx")
    assert len(hint) == HINT_CHARS


def test_job_logs_are_every_task_log_of_the_job(tmp_path: Path) -> None:
    for name in ("7_0_log.out", "7_1_log.out", "7_submitted.pkl", "7_submission.sh"):
        (tmp_path / name).write_text("")
    assert [p.name for p in job_logs(tmp_path / "7_0_log.out")] == ["7_0_log.out", "7_1_log.out"]


def test_sacct_times_are_local_and_unknown_is_none() -> None:
    start = _sacct_time("2026-11-24T02:20:40")
    assert start is not None and start.tzinfo is not None
    assert start.replace(tzinfo=None) == datetime.datetime(2026, 11, 24, 2, 20, 40)
    assert _sacct_time("Unknown") is None and _sacct_time("") is None


def test_a_stall_that_names_a_lost_peer_is_the_reason_before_one_whose_peers_all_answered(tmp_path: Path) -> None:
    """Every rank of a stalled collective stalls; the rank whose peers all answer writes first
    (its probe ends at once), but only the ones that found a peer unreachable say why."""
    log = tmp_path / "point.log"
    stall = "stalled: no iteration finished for 9 s (limit 8 s, last finished iteration 4); waiting in allreduce t0"
    log.write_text(
        f"hpcbench.worker: {T0} rank 2 of point aaa {stall}; peers answered: ranks 0, 1 (last finished iteration 4)\n"
        f"hpcbench.worker: {T1} rank 0 of point aaa {stall}; peers unreachable: rank 1 (10.0.0.3); answered: rank 2\n"
    )
    assert failure_hint([log]).startswith("rank 0 of point aaa stalled")
    assert "unreachable: rank 1 (10.0.0.3)" in failure_hint([log])
    log.write_text(f"hpcbench.worker: {T1} rank 0 of point aaa {stall}; peers gone (connection refused): rank 1 (x)\n"
                   f"hpcbench.worker: {T0} rank 2 of point aaa {stall}; peers answered: ranks 0, 1\n")  # fmt: skip
    assert failure_hint([log]).startswith("rank 0 of point aaa stalled")
    log.write_text(
        f"hpcbench.worker: {T1} rank 0 of point aaa {stall}\nhpcbench.worker: {T0} rank 2 of point aaa {stall}\n"
    )
    assert failure_hint([log]).startswith("rank 2 of point aaa"), "none says why: the earliest"
