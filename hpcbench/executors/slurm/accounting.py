"""What Slurm says of a job: its runs and states from sacct and the queue, and its logs.

The commands are run through `run_command`, whose errors name what was asked and say that
nothing was submitted when the controller does not answer.
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from hpcbench.errors import HpcbenchError

# sacct states that end a job without a result of ours
FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
QUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED")
RUNNING_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT")


def run_command(argv: list[str], what: str) -> str:
    """A Slurm client command's output (`what` names it in errors)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise HpcbenchError(f"{argv[0]} not found: this host has no Slurm client; use executor: local") from None
    except subprocess.TimeoutExpired:
        raise HpcbenchError(f"{what}: `{' '.join(argv)}` did not answer in 60 s: is slurmctld up?") from None
    if proc.returncode != 0:
        msg = " ".join((proc.stderr or proc.stdout).split())
        raise HpcbenchError(
            f"{what}: Slurm controller unreachable ({msg or f'exit {proc.returncode}'}); check that slurmctld "
            "runs and that SLURM_CONF names its configuration; nothing was submitted"
        )
    return proc.stdout


class Run(NamedTuple):
    """One run of a job, as sacct records it (a requeued job has one per run)."""

    state: str
    start: datetime.datetime | None  # None before it starts


def _sacct_time(text: str) -> datetime.datetime | None:
    """sacct's local time ("2026-11-24T02:20:40"; "Unknown" before a start) as an aware datetime."""
    try:
        return datetime.datetime.fromisoformat(text).astimezone()
    except ValueError:
        return None


def sacct_runs(job_ids: Sequence[str]) -> dict[str, list[Run]]:
    """job id -> the runs of its allocation (not its steps), oldest first, from sacct.

    A job requeued (preempted, its node failed, `scontrol requeue`) has one record per run
    (`sacct -D`); the last one is its current state.
    """
    if not job_ids:
        return {}
    argv = ["sacct", "-n", "-P", "-X", "-D", "-o", "JobID,State,Start", "-j", ",".join(job_ids)]
    runs: dict[str, list[Run]] = {}
    for line in run_command(argv, "sacct").splitlines():
        job, _, rest = line.partition("|")
        state, _, start = rest.partition("|")
        runs.setdefault(job.strip(), []).append(Run(state.split()[0] if state.split() else "", _sacct_time(start)))
    return runs


def job_logs(log: Path) -> list[Path]:
    """Every task's log of the job whose task-0 log is `log` (submitit writes them side by
    side, `<job>_<task>_log.out`, in a folder of the job's own): a rank launched by srun
    writes only into its own task's log."""
    return sorted({log, *log.parent.glob("*_log.out")})


def queue_states() -> dict[str, str]:
    """job id -> state of this user's jobs the controller still holds (array tasks one by one)."""
    out = run_command(["squeue", "--me", "-h", "-r", "-o", "%i|%T"], "squeue")
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def job_states(records: list[str], live: str | None) -> list[str]:
    """A job's states, oldest first: sacct's records, corrected by the queue. Right after a
    requeue (node failure, preemption) sacct's last record still says NODE_FAIL or REQUEUED
    while the job is pending again: what the queue holds is the truth."""
    if live is None:
        return records
    if live == "COMPLETING":  # ended, its steps still ending (ranks writing their rows): not final yet
        return [*records[:-1], live]
    if records and records[-1] in (*FAILED_STATES, "REQUEUED"):
        return [*records, live]
    return [*records[:-1], live]
