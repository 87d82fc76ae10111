"""Run points one after another on this host, each with its launcher's argv."""

from __future__ import annotations

import datetime
import os
import shlex
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcbench.executors.base import EXECUTORS, Executor
from hpcbench.plan.launch import Launch
from hpcbench.rank.failures import failure_hint
from hpcbench.rank.net import die_with_parent
from hpcbench.store import schema
from hpcbench.store.status import mark_failed, result_status
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.layout import SweepDir, keep_aside
from hpcbench.sweepdir.lock import in_use
from hpcbench.sweepdir.paths import inside

KILL_GRACE_S = 10.0


def run_process(argv: list[str], env: dict[str, str], log: Path, timeout_s: float | None) -> tuple[int, str]:
    """Run `argv` in its own process group; (exit code, '' or why it was stopped)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,  # the launcher stops its ranks if the sweep dies
        )  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s), ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, f"timed out after {timeout_s:g} s"
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)  # interrupted: leave no ranks behind
            proc.wait()
            raise


@EXECUTORS.register
class LocalExecutor(Executor):
    name = "local"
    local = True

    def refresh(self) -> None:
        """Points left running by a sweep process that is gone (killed, crashed) are failed."""
        directory = self.manifest.directory
        if in_use(directory):
            return  # that sweep is alive and still running them
        stale = [e for e in self.manifest.entries.values() if e.state in mf.ACTIVE]
        for entry in stale:
            result = inside(directory, entry.result)
            entry.ended = entry.ended or mf.now()
            if result_status(result) == schema.STATUS_COMPLETE:  # finished just before the sweep died
                entry.state, entry.reason = mf.DONE, ""
                continue
            entry.state = mf.FAILED
            entry.reason = (
                f"the sweep process ended while this point ran (killed or crashed); see {directory / entry.log}"
            )
            mark_failed(result, entry.reason)
        if stale:
            self.manifest.save()

    def run(self, launches: Sequence[Launch]) -> None:
        directory = self.manifest.directory
        for launch in launches:
            entry = self.manifest.entries[launch.point.id]
            result = inside(directory, entry.result)
            if result_status(result) == schema.STATUS_COMPLETE:
                entry.state, entry.reason = mf.DONE, ""
                self.manifest.save()
                print(f"  {entry.id}  done already      {entry.label}", file=self.out)
                continue
            aside = keep_aside(result)
            if aside is not None:
                print(f"  {entry.id}  earlier incomplete result kept as {aside.name}", file=self.out)
            entry.log = SweepDir.log_name(entry.id)
            log = inside(directory, entry.log)
            entry.state, entry.attempts, entry.started, entry.ended = mf.RUNNING, entry.attempts + 1, mf.now(), ""
            self.manifest.save()
            if self.verbose:
                print("+ " + shlex.join(launch.argv), file=self.out, flush=True)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                f.write(f"=== hpcbench attempt {entry.attempts} at {entry.started}: {shlex.join(launch.argv)}\n")
            rc, stopped = run_process(launch.argv, {**os.environ, **launch.env}, log, self.options.timeout_s)
            status = result_status(result)
            entry.ended = mf.now()
            if rc == 0 and status == schema.STATUS_COMPLETE:
                entry.state, entry.reason = mf.DONE, ""
            else:
                why = stopped or (f"exit code {rc}" if rc != 0 else f"exit code 0 but result is {status or 'missing'}")
                hint = failure_hint([log], since=datetime.datetime.fromisoformat(entry.started))
                entry.state, entry.reason = mf.FAILED, f"{why}{': ' + hint if hint else ''}; see {log}"
                mark_failed(result, entry.reason)
            self.manifest.save()
            mark = "done  " if entry.state == mf.DONE else "FAILED"
            print(f"  {entry.id}  {mark}  {entry.label}" + (f"  ({entry.reason})" if entry.reason else ""),
                  file=self.out, flush=True)  # fmt: skip
