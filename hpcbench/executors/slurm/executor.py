"""Submit points as Slurm batch jobs through submitit; points of one resource shape go in one
job array (split at the cluster's MaxArraySize).

How a job starts its ranks follows the point's launcher (`Launcher.tasks`):
"rank" - one task per rank through srun, each running the worker; "node" - one task per
node running the launcher (torchrun); "job" - the launcher once in the batch step over the
whole allocation (mpirun, horovodrun).

States come back from `sacct`; results from the point files themselves.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpcbench.errors import HpcbenchError
from hpcbench.executors.base import EXECUTORS, Executor
from hpcbench.executors.slurm import job as jobs
from hpcbench.executors.slurm import options as slurm_options
from hpcbench.executors.slurm.accounting import FAILED_STATES, QUEUED_STATES, RUNNING_STATES, queue_states, sacct_runs
from hpcbench.executors.slurm.accounting import Run as Run  # re-exported (X as X): tests read these here
from hpcbench.executors.slurm.accounting import _sacct_time as _sacct_time
from hpcbench.executors.slurm.accounting import job_logs as job_logs
from hpcbench.executors.slurm.accounting import job_states as job_states
from hpcbench.executors.slurm.accounting import run_command as _run
from hpcbench.executors.slurm.options import SlurmOptions
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan.launch import Launch
from hpcbench.plan.profiles import SiteProfile
from hpcbench.rank.failures import failure_hint, out_of_memory
from hpcbench.rank.memory import OutOfMemory
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.oom import mark_out_of_memory
from hpcbench.store.status import mark_failed, mark_stop_reason, result_status, stop_reason
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.layout import SweepDir
from hpcbench.sweepdir.paths import inside

# what submitit raises in the job when the time limit's warning signal arrives
SUBMITIT_TIMEOUT = "UncompletedJobError: Job not requeued because: timed-out"

# why Slurm ended a job whose ranks stopped together on its signal (rank/stop.py); another
# state (FAILED: the ranks' stop exit code) keeps the ranks' own reason (a signal, the time limit)
STOP_REASONS = {"CANCELLED": "cancelled", "PREEMPTED": "preempted", "TIMEOUT": "time limit", "DEADLINE": "deadline"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
DEFAULT_MAX_ARRAY_SIZE = 1001


def job_name(sweep: str) -> str:
    """Slurm job names are written into #SBATCH lines: keep them to safe characters."""
    return (re.sub(r"[^A-Za-z0-9._-]+", "_", sweep).strip("._") or "hpcbench")[:64]


def check_controller() -> None:
    out = _run(["scontrol", "ping"], "scontrol ping")
    if "UP" not in out:
        raise HpcbenchError(
            f"Slurm controller unreachable ({' '.join(out.split())}); check that slurmctld runs and that "
            "SLURM_CONF names its configuration; nothing was submitted"
        )


def max_array_size() -> int:
    out = _run(["scontrol", "show", "config"], "scontrol show config")
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m.group(1)) if m else DEFAULT_MAX_ARRAY_SIZE


def job_parameters(point: Point, sweep: str, defaults: SlurmOptions, profile: SiteProfile) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for one point: its resource shape."""
    opts = defaults.merged(dict(point.slurm))
    tasks = LAUNCHERS.get(point.launcher).tasks
    params: dict[str, Any] = {
        "job_name": job_name(sweep),
        "nodes": point.nodes,
        "time": opts.time,
        "signal_delay_s": opts.signal_delay_s,
        "array_parallelism": opts.array_parallelism,
        "stderr_to_stdout": True,
        "setup": profile.setup_lines() + list(opts.setup),
        "additional_parameters": dict(opts.additional),
    }
    for key in ("partition", "account", "qos", "constraint", "mem", "cpus_per_task"):
        if getattr(opts, key) is not None:
            params[key] = getattr(opts, key)
    if opts.exclusive:  # sbatch has no --exclusive=false: not exclusive is the absence of the flag
        params["exclusive"] = True
    if point.device == "cuda":
        params["gpus_per_node"] = point.ranks_per_node
    if tasks == "rank":
        params.update(ntasks_per_node=point.ranks_per_node, use_srun=True, srun_args=list(profile.srun_args))
    elif tasks == "node":
        params.update(ntasks_per_node=1, use_srun=True, srun_args=[])
    else:  # the launcher spreads ranks over the allocation's task slots
        params.update(ntasks_per_node=point.ranks_per_node, use_srun=False)
    return params


def job_function(point: Point) -> Callable[[str], None]:
    return jobs.run_rank if LAUNCHERS.get(point.launcher).tasks == "rank" else jobs.run_launcher


def check_path(directory: Path) -> None:
    if _CONTROL.search(str(directory)):
        raise HpcbenchError(
            f"sweep directory {str(directory)!r} contains control characters, which cannot be written into "
            "an sbatch script; choose another --out"
        )


def sbatch_text(params: dict[str, Any], folder: Path, count: int) -> str:
    """The batch script submitit writes for these parameters (for dry runs and golden tests)."""
    from submitit.slurm import slurm as submitit_slurm

    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    extra: dict[str, Any] = {"map_count": count} if count > 1 else {}
    text: str = submitit_slurm._make_sbatch_string(command=command, folder=folder, **params, **extra)
    return text


def groups(
    launches: Sequence[Launch], sweep: str, defaults: SlurmOptions, profile: SiteProfile
) -> list[tuple[dict[str, Any], list[Launch]]]:
    """Launches with equal job parameters, in first-seen order."""
    out: dict[str, tuple[dict[str, Any], list[Launch]]] = {}
    for launch in launches:
        params = job_parameters(launch.point, sweep, defaults, profile)
        key = json.dumps(params, sort_keys=True)
        out.setdefault(key, (params, []))[1].append(launch)
    return list(out.values())


def chunks(items: Sequence[Launch], size: int) -> Iterable[Sequence[Launch]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@EXECUTORS.register
class SlurmExecutor(Executor):
    name = "slurm"
    has_options = True

    @classmethod
    def parse_options(cls, path: str, raw: Any) -> dict[str, Any]:
        return slurm_options.parse(path, raw)

    requires = ("submitit",)
    local = False

    def _defaults(self, profile: SiteProfile) -> SlurmOptions:
        return SlurmOptions().merged(dict(profile.slurm)).merged(self.sweep.sections.get(self.name, {}))

    def _submission_dir(self) -> Path:
        # A fresh folder per submission: Slurm job ids restart after a controller reset, and a
        # reused <job id> folder would hand back an old job's results.
        root = SweepDir(self.manifest.directory).executor_dir(self.name)
        n = 1
        while (root / f"submission-{n:03d}").exists():
            n += 1
        return root / f"submission-{n:03d}"

    def dry_run(self, launches: Sequence[Launch]) -> list[Path]:
        """Write the sbatch scripts that would be submitted; submit nothing."""
        profile = self.profile
        check_path(self.manifest.directory)
        self.manifest.directory.mkdir(parents=True, exist_ok=True)
        defaults = self._defaults(profile)
        folder = SweepDir(self.manifest.directory).executor_dir(self.name) / "dry-run"
        written = []
        for i, (params, items) in enumerate(groups(launches, self.manifest.name, defaults, profile), start=1):
            path = inside(self.manifest.directory, f"job-{i:03d}.sbatch")
            text = sbatch_text(params, folder / "%j", len(items))
            shebang, _, rest = text.partition("\n")
            points = " ".join(x.point.id for x in items)
            path.write_text(f"{shebang}\n# hpcbench dry run, not submitted: points {points}\n{rest}")
            written.append(path)
        return written

    def run(self, launches: Sequence[Launch]) -> None:
        import submitit

        profile = self.profile
        check_path(self.manifest.directory)
        check_controller()
        limit = max_array_size()
        defaults = self._defaults(profile)
        folder = self._submission_dir()
        submitted = 0
        for params, items in groups(launches, self.manifest.name, defaults, profile):
            executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=0)
            executor.update_parameters(**params)
            for chunk in chunks(items, limit):
                try:
                    with executor.batch():
                        handles = [executor.submit(job_function(x.point), x.to_json()) for x in chunk]
                except Exception as exc:  # noqa: BLE001 - sbatch's failure, whatever submitit raised
                    detail = " ".join(str(getattr(exc, "stderr", "") or exc).split())
                    raise HpcbenchError(
                        f"sbatch failed after {submitted} of {len(launches)} points were submitted ({detail}); "
                        f"check the Slurm controller, then `python -m hpcbench.sweep resume {self.manifest.directory}`"
                    ) from None
                for launch, job in zip(chunk, handles, strict=True):
                    entry = self.manifest.entries[launch.point.id]
                    entry.state, entry.job_id, entry.reason = mf.QUEUED, str(job.job_id), ""
                    entry.attempts += 1
                    entry.started, entry.ended = mf.now(), ""
                    entry.log = str(job.paths.stdout).replace("%t", "0")
                    if self.verbose:
                        print(f"+ {entry.id}: job {job.job_id}: {' '.join(launch.shown()[0])}", file=self.out)
                submitted += len(chunk)
                self.manifest.save()
        print(f"submitted {submitted} points as Slurm jobs (folder {folder})", file=self.out)

    def refresh(self) -> None:
        refresh(self.manifest)

    def cancel(self) -> list[str]:
        active = [e for e in self.manifest.entries.values() if e.state in mf.ACTIVE and e.job_id]
        if active:
            _run(["scancel", *[e.job_id for e in active]], "scancel")
        for e in active:  # running ranks stop together and keep their rows; resume reruns them
            cancelled = Verdict(mf.STOPPED, stop="cancelled by the user", log=e.log)
            e.state, e.reason, e.ended = cancelled.state, cancelled.reason, mf.now()
        self.manifest.save()
        return [e.id for e in active]


@dataclass(frozen=True)
class Verdict:
    """What became of a point's job, as data: the manifest's state and what led to it.
    `reason` is the sentence the manifest keeps for `status` to show."""

    state: str  # the manifest's
    slurm_state: str = ""  # the job's (TIMEOUT where submitit's handler of the time limit's warning raised)
    requeued_after: tuple[str, ...] = ()  # the Slurm states that ended its earlier runs
    result: str | None = None  # the point file's status (None: no file)
    stop: str = ""  # STOPPED: why its ranks stopped together
    hint: str = ""  # FAILED: the first rank account found in the job's logs
    log: str = ""
    oom: OutOfMemory | None = None  # OUT_OF_MEMORY: what the rank that ran out said (rank/memory.py)

    @property
    def reason(self) -> str:
        after = self.requeued_after
        requeued = f"requeued {len(after)}x after {', '.join(after)}" if after else ""
        if self.state in mf.ACTIVE:
            return requeued
        if self.state == mf.DONE:
            return f"completed, {requeued}" if requeued else ""
        if self.state == mf.FAILED and self.slurm_state == "COMPLETED":
            return f"job completed but result is {self.result or 'missing'}; see {self.log}"
        if self.state == mf.STOPPED:
            why = f"{self.stop}; see {self.log}"
        elif self.oom is not None:
            why = f"{self.oom.summary()}; see {self.log}"
        else:
            why = f"Slurm state {self.slurm_state}{': ' + self.hint if self.hint else ''}; see {self.log}"
        return f"{requeued}, then {why}" if requeued else why


def _verdict(e: mf.Entry, records: list[Run], queued: str | None, status: str | None, why: str = "") -> Verdict | None:
    """The verdict on one entry from its job's accounting records and queue state, its point
    file's status and, if stopped, the ranks' reason `why`; None while sacct does not know
    the job yet."""
    *history, state = job_states([r.state for r in records], queued) or [""]
    if queued is None and state in (*QUEUED_STATES, *RUNNING_STATES):
        # The queue holds every pending or running job: one it no longer holds has ended, and
        # sacct's record (slurmdbd is told asynchronously) lags behind its end. Wait for it:
        # its ranks' stopped file would otherwise be taken for a requeued run.
        return None
    seen = Verdict("", state, tuple(history), status, log=e.log)
    if state in FAILED_STATES and status == schema.STATUS_STOPPED:  # the ranks stopped together, rows kept
        return replace(seen, state=mf.STOPPED, stop=STOP_REASONS.get(state) or why or "stopped")
    if state in QUEUED_STATES:
        return replace(seen, state=mf.QUEUED)
    if state in RUNNING_STATES:
        return replace(seen, state=mf.RUNNING)
    if state == "COMPLETED":
        return replace(seen, state=mf.DONE if status == schema.STATUS_COMPLETE else mf.FAILED)
    if state not in FAILED_STATES:
        return None
    # the ranks' accounts of the last run: a requeued job's earlier runs wrote into the same logs
    logs, since = job_logs(Path(e.log)), records[-1].start if records else None
    if (oom := out_of_memory(logs, since)) is not None:  # a result, not a failure
        return replace(seen, state=mf.OUT_OF_MEMORY, slurm_state=state, oom=oom)
    hint = failure_hint(logs, since=since)
    if state == "FAILED" and SUBMITIT_TIMEOUT in hint:
        # submitit's handler of the time-limit warning signal raised in the worker before
        # Slurm could end the job itself: the cause is the time limit.
        state = "TIMEOUT"
    return replace(seen, state=mf.FAILED, slurm_state=state, hint=hint)


def refresh(manifest: mf.Manifest) -> None:
    """Bring queued / running entries up to date from sacct, the queue and the point files."""
    active = [e for e in manifest.entries.values() if e.state in mf.ACTIVE and e.job_id]
    if not active:
        return
    runs = sacct_runs([e.job_id for e in active])
    queue = queue_states()
    changed = False
    for e in active:
        result = manifest.directory / e.result
        status = result_status(result)
        verdict = _verdict(e, runs.get(e.job_id, []), queue.get(e.job_id), status, stop_reason(result))
        if verdict is None or (verdict.state, verdict.reason) == (e.state, e.reason):
            continue
        e.state, e.reason = verdict.state, verdict.reason
        if verdict.state == mf.QUEUED and status == schema.STATUS_STOPPED:  # the run that stopped was requeued
            mark_stop_reason(result, "requeued")
        if verdict.state == mf.STOPPED:
            mark_stop_reason(result, verdict.stop)
        if verdict.state in mf.ENDED:
            e.ended = mf.now()
        if verdict.oom is not None:  # the file says so, with where and how much (one with no rows where none)
            mark_out_of_memory(result, verdict.oom, Point.from_dict(e.point), manifest.name)
        if verdict.state == mf.FAILED and status != schema.STATUS_COMPLETE:
            # the file says so too (none: nothing left half-made)
            mark_failed(manifest.directory / e.result, e.reason)
        changed = True
    if changed:
        manifest.save()
