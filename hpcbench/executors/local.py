"""Run points one after another on this host, each with its launcher's argv.

A point told to stop (its time limit, the sweep interrupted by Ctrl-C or SIGTERM, or
cancelled by `hpcbench cancel`) is not killed outright: its ranks get SIGTERM, finish the
iteration in progress, agree where to stop, write every row and mark the file `stopped`
(rank/stop.py); only ranks still there after STOP_GRACE_S are killed. The point is then
recorded `stopped`, and `resume` reruns it. A point whose rank ran out of memory (its account
in the log, rank/memory.py) is recorded `out of memory`, its file `out_of_memory`: a result,
which `resume` leaves as it leaves a complete one.

`hpcbench cancel DIR` reaches the points through the sweep command that runs them, which
holds the directory's lock: it asks that command to stop (sweepdir/lock.py: a cancel request
in the lock file, then SIGTERM), waits for it to end, and reports what it stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from hpcbench.errors import HpcbenchError
from hpcbench.executors.base import CANCELLED, EXECUTORS, INTERRUPTED, Executor, Interrupted
from hpcbench.plan.launch import Launch
from hpcbench.rank.failures import failure_hint, out_of_memory
from hpcbench.rank.net import die_with_parent
from hpcbench.spec import Point
from hpcbench.store import oom as oom_file
from hpcbench.store import schema
from hpcbench.store.status import mark_failed, mark_stop_reason, result_status, stop_reason
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.layout import SweepDir, keep_aside
from hpcbench.sweepdir.lock import CANCEL, RUN, holder, in_use, request_cancel, sweep_lock, wait_released
from hpcbench.sweepdir.paths import inside

STOP_GRACE_S = 30.0  # for ranks told to stop to finish their iteration and write their rows
LINGER_S = 10.0  # a launcher still running this long after its last rank ended is stopped
POLL_S = 1.0
WORKER = b"hpcbench.worker"
CANCEL_WAIT_S = STOP_GRACE_S + 30.0  # how long `cancel` waits for the sweep it stopped to end


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def worker_pids(root: int) -> list[int]:
    """The ranks under `root`: its descendants (and itself) running the worker."""
    tree, todo, found = _children(), [root], []
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, []))
        with contextlib.suppress(OSError):
            if WORKER in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def stop_process(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the ranks (not their launcher: mpirun answers SIGTERM by killing its ranks a
    second later), `grace_s` for them to stop together and write, then SIGKILL to what is left
    of the process group. A second interrupt while waiting kills at once."""
    try:
        for pid in worker_pids(proc.pid) or [proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    finally:
        kill_tree(proc)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the launcher's process group and every process under it (mpirun puts the
    daemons it starts through its remote shell in process groups of their own)."""
    tree, todo, found = _children(), [proc.pid], []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def wait_launcher(proc: subprocess.Popen[bytes], timeout_s: float | None, linger_s: float = LINGER_S) -> str:
    """Wait until the launcher ends: '' when it did; else why it must be ended: its time
    limit, or it outlived every rank it had by `linger_s` (mpirun waits for the daemon of a
    node whose link went down long after that node's ranks were gone: MPI_Abort cannot reach
    it, and TCP gives up on it only after about 15 minutes)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    seen, alone_since = False, 0.0
    while True:
        try:
            proc.wait(timeout=POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())))
            return ""
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return f"time limit: timed out after {timeout_s:g} s"
        # its ranks below it (not itself: mpirun's own argv names the worker); ranks on other
        # hosts are never seen here, so never waited for
        if [pid for pid in worker_pids(proc.pid) if pid != proc.pid]:
            seen, alone_since = True, 0.0
        elif seen:
            alone_since = alone_since or now
            if now - alone_since >= linger_s:
                return f"the launcher still ran {linger_s:g} s after its last rank ended (waiting for a node it lost?)"


def run_process(
    argv: list[str], env: dict[str, str], log: Path, timeout_s: float | None, grace_s: float = STOP_GRACE_S
) -> tuple[int, str]:
    """Run `argv` in its own process group; (exit code, '' or why this executor stopped it).
    Interrupted (KeyboardInterrupt, SystemExit), it stops the ranks as on a time limit, then
    raises."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,  # the launcher stops its ranks if the sweep dies
        )  # fmt: skip
        try:
            why = wait_launcher(proc, timeout_s)
            if why.startswith("time limit"):
                stop_process(proc, grace_s)
            elif why:
                kill_tree(proc)
            return proc.wait(), why
        except BaseException:
            stop_process(proc, grace_s)  # interrupted: the ranks keep what they ran, none is left behind
            raise


def _settle(entry: mf.Entry, result: Path, log: Path, rc: int, stopped: str) -> None:
    """The entry's state and reason once its process ended (`stopped`: why this executor stopped it)."""
    status = result_status(result)
    entry.ended = mf.now()
    since = datetime.datetime.fromisoformat(entry.started)
    if rc == 0 and status == schema.STATUS_COMPLETE:
        entry.state, entry.reason = mf.DONE, ""
    elif status == schema.STATUS_STOPPED:
        why = stopped or stop_reason(result) or "stopped"
        mark_stop_reason(result, why)
        entry.state, entry.reason = mf.STOPPED, f"{why}; see {log}"
    elif rc != 0 and (oom := out_of_memory([log], since=since)) is not None:  # a result: where, and how much
        entry.state, entry.reason = mf.OUT_OF_MEMORY, f"{oom.summary()}; see {log}"
        oom_file.mark_out_of_memory(result, oom, Point.from_dict(entry.point))  # none left: one with no rows
    else:
        why = stopped or (f"exit code {rc}" if rc != 0 else f"exit code 0 but result is {status or 'missing'}")
        hint = failure_hint([log], since=since)
        entry.state, entry.reason = mf.FAILED, f"{why}{': ' + hint if hint else ''}; see {log}"
        mark_failed(result, entry.reason)


def _why_ended(exc: BaseException) -> str:
    """Why a point's run ended early, as recorded: the interruption's reason, or the error's."""
    if isinstance(exc, Interrupted):
        return exc.reason
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return INTERRUPTED
    return f"the sweep command failed: {type(exc).__name__}: {exc}"


@EXECUTORS.register
class LocalExecutor(Executor):
    name = "local"
    local = True

    def refresh(self) -> None:
        """Points left running by a sweep process that is gone (killed, crashed) are failed, or
        stopped where their ranks stopped together (the launcher dies with the sweep and passes
        its SIGTERM on). The states are first read again from the manifest, which the sweep
        command running the points rewrites as each starts and ends (`status --wait` follows it)."""
        directory = self.manifest.directory
        if (directory / mf.Manifest.FILE).exists():
            self.manifest.entries = mf.Manifest.load(directory).entries
        if in_use(directory):
            return  # that sweep is alive and still running them
        stale = [e for e in self.manifest.entries.values() if e.state in mf.ACTIVE]
        for entry in stale:
            result = inside(directory, entry.result)
            entry.ended = entry.ended or mf.now()
            status = result_status(result)
            if status == schema.STATUS_COMPLETE:  # finished just before the sweep died
                entry.state, entry.reason = mf.DONE, ""
                continue
            if (oom := oom_file.out_of_memory(result)) is not None:
                entry.state, entry.reason = mf.OUT_OF_MEMORY, oom.summary()
                continue
            ended = "the sweep process ended while this point ran (killed or crashed)"
            if status == schema.STATUS_STOPPED:  # its launcher passed the SIGTERM on; the ranks stopped together
                why = f"its ranks stopped ({stop_reason(result)})"
                entry.state, entry.reason = mf.STOPPED, f"{ended}; {why}; see {directory / entry.log}"
                continue
            entry.state, entry.reason = mf.FAILED, f"{ended}; see {directory / entry.log}"
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
            if (oom := oom_file.out_of_memory(result)) is not None:  # running out again is certain: a result
                entry.state, entry.reason = mf.OUT_OF_MEMORY, entry.reason or oom.summary()
                self.manifest.save()
                print(f"  {entry.id}  out of memory already  {entry.label}  ({oom.summary()})", file=self.out)
                continue
            aside = keep_aside(result)
            if aside is not None:
                print(f"  {entry.id}  earlier incomplete result kept as {aside.name}", file=self.out)
            entry.log = SweepDir.log_name(entry.id)
            log = inside(directory, entry.log)
            entry.state, entry.attempts, entry.started, entry.ended = mf.RUNNING, entry.attempts + 1, mf.now(), ""
            try:
                self.manifest.save()
                if self.verbose:
                    print("+ " + shlex.join(launch.argv), file=self.out, flush=True)
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("a") as f:
                    f.write(f"=== hpcbench attempt {entry.attempts} at {entry.started}: {shlex.join(launch.argv)}\n")
                rc, stopped = run_process(launch.argv, {**os.environ, **launch.env}, log, self.options.timeout_s)
            except BaseException as exc:  # interrupted: its ranks were stopped; say so before unwinding
                _settle(entry, result, log, -1, _why_ended(exc))
                self.manifest.save()
                raise
            _settle(entry, result, log, rc, stopped)
            self.manifest.save()
            mark = {mf.DONE: "done  ", mf.STOPPED: "stopped", mf.OUT_OF_MEMORY: "out of memory"}.get(
                entry.state, "FAILED"
            )
            print(f"  {entry.id}  {mark}  {entry.label}" + (f"  ({entry.reason})" if entry.reason else ""),
                  file=self.out, flush=True)  # fmt: skip

    def cancel(self) -> list[str]:
        """Stop the sweep command that runs this directory's points, and wait for it: it stops
        its running point as when interrupted (the ranks finish their iteration, stop together
        and keep their rows), records it "cancelled by the user", and starts no other. Called
        without the directory's lock, which that command holds; the ids of the points it stopped."""
        directory = self.manifest.directory
        running = holder(directory)
        # what each point's reason was before: a point this cancel stopped is one whose reason
        # became "cancelled" since (not one cancelled earlier, however recently)
        before = {e.id: e.reason for e in mf.Manifest.load(directory).entries.values()}
        active: set[str] = set()
        if running is not None and running.command in (RUN, ""):  # "": written by an older hpcbench
            active = {e.id for e in mf.Manifest.load(directory).entries.values() if e.state in mf.ACTIVE}
            if request_cancel(directory, running):
                print(f"stopping the sweep running in {directory} (pid {running.pid}); its ranks finish the "
                      "iteration in progress and write their rows", file=self.out, flush=True)  # fmt: skip
            if not wait_released(directory, running, CANCEL_WAIT_S):
                raise HpcbenchError(
                    f"the sweep running in {directory} (pid {running.pid}) was told to stop (SIGTERM) and still "
                    f"runs after {CANCEL_WAIT_S:g} s; kill {running.pid} ends it, then `hpcbench status` records it"
                )
        with sweep_lock(directory, CANCEL):  # the sweep has ended (or none ran): its manifest is final
            self.refresh()  # read again; a point left running by a sweep that died without recording it
        return [
            e.id
            for e in self.manifest.entries.values()
            if e.id in active or (e.reason.startswith(CANCELLED) and not before.get(e.id, "").startswith(CANCELLED))
        ]
