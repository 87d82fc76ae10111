"""`python -m hpcbench.sweep`: plan and run a sweep, and look after it.

    python -m hpcbench.sweep SPEC.yaml [--out DIR] [--dry-run] [-v]   plan, then run or submit
    python -m hpcbench.sweep status DIR [--wait] [--interval S]       every point's state
    python -m hpcbench.sweep resume DIR [-v]                          rerun what has no result
                                                                      (failed, stopped, never run;
                                                                      not complete or out of memory)
    python -m hpcbench.sweep cancel DIR                               stop what is queued or running
    python -m hpcbench.sweep check [--env NAME] [--json]              what works in each environment

Exit statuses (docs/running.md#outputs-and-exit-codes): 0 success (every point complete or out
of memory: a result); 1 when the results show a problem (a point failed or stopped); 2 bad
input of any kind (an invalid spec, an `--out` that may not be written, a missing or damaged
sweep directory, a busy one), one line on stderr and nothing created; 130 on Ctrl-C, 128 + N
on signal N (SIGTERM, `hpcbench cancel`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from hpcbench.cli import failure, textable
from hpcbench.cli.main import find_command
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.cli.progress import Poller, SweepProgress, plain_line
from hpcbench.errors import HpcbenchError
from hpcbench.executors import EXECUTORS, Executor, catalog
from hpcbench.executors.base import CANCELLED, INTERRUPTED, Interrupted
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan import envs
from hpcbench.plan import launch as plan
from hpcbench.plan.profiles import SiteProfile
from hpcbench.spec import Point, Sweep, differing
from hpcbench.store.status import final, result_status
from hpcbench.sweepdir import lock, outputs
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.atomic import write_text_atomic
from hpcbench.sweepdir.layout import SweepDir
from hpcbench.sweepdir.lock import sweep_lock
from hpcbench.sweepdir.manifest import Manifest
from hpcbench.sweepdir.runfile import RunFile

PROG = "hpcbench.sweep"
MIN_INTERVAL_S = 0.1  # `status --wait --interval`: polls no faster than this (a core would spin)
MAX_INTERVAL_S = 3600.0


def default_out(name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "sweep"
    return Path("runs") / slug


def _shown(p: Point) -> tuple[object, ...]:
    """What the plan table shows of a point: the fields of its columns."""
    return (p.framework, p.backend, p.launcher, p.model, p.nodes, p.ranks_per_node, p.batch_size, p.iterations,
            p.warmup)  # fmt: skip


def print_plan(sweep: Sweep, launches: Sequence[plan.Launch], out_dir: Path, dry_run: bool, out: TextIO) -> None:
    print(f"sweep {sweep.name!r}: {len(launches)} points, executor {sweep.executor}, output {out_dir}", file=out)
    points = [launch.point for launch in launches]
    # points that the columns show alike (differing only in extra, env, seed, environ, ...) name
    # what tells them apart (hpcbench/spec/labels.py)
    differs = differing(points, shown=_shown)
    header = ("point", "framework", "backend", "launcher", "model", "nodes", "ranks/node", "batch", "iterations")
    more = ("differs in",) if any(differs.values()) else ()
    rows = [(*header, *more)]
    for p in points:
        scale = (str(p.nodes), str(p.ranks_per_node), str(p.batch_size), f"{p.iterations}+{p.warmup}w")
        tells = (differs[p.id] or "-",) if more else ()
        rows.append((p.id, p.framework, p.backend, p.launcher, p.model, *scale, *tells))
    print(textable.render(rows, indent="  "), file=out)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=out)
    if dry_run:
        local = EXECUTORS.get(sweep.executor).local
        where = "on this host" if local else "in each job (stand-ins for job-time values)"
        print(f"launch commands {where}; nothing is run:", file=out)
        for launch in launches:
            argv, environ = launch.shown()
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items()))
            print(f"  {launch.point.id}: {env} {shlex.join(argv)}", file=out)


def _check_runnable(sweep: Sweep, local: bool) -> None:
    """Everything the points need must be there before anything is created: the modules of
    each framework, backend and launcher in the interpreter the point's ranks run in (the
    sweep's own, or the point's `env`), and the launcher's program."""
    needs: dict[str | None, set[str]] = {}
    for p in sweep.points:
        framework = FRAMEWORKS.get(p.framework)
        launcher = LAUNCHERS.get(p.launcher)
        modules = {*framework.requires, *framework.backend_requires.get(p.backend, ()), *launcher.requires}
        needs.setdefault(p.env, set()).update(modules)
        if local and launcher.program:
            bin_dir = str(envs.python(p.env).parent)  # the env's own scripts (horovodrun) first
            if shutil.which(launcher.program, path=os.pathsep.join([bin_dir, os.environ.get("PATH", "")])) is None:
                raise HpcbenchError(f"launcher {p.launcher!r} needs {launcher.program!r}, which is not on PATH")
    for env, modules in sorted(needs.items(), key=lambda kv: kv[0] or ""):
        missing = envs.missing_modules(env, sorted(modules))
        if missing:
            where = f"environment {env!r}" if env else "this interpreter"
            hint = f" ({envs.build_command(env)})" if env else " (or give the points an env:)"
            raise HpcbenchError(f"{', '.join(missing)} cannot be imported in {where}{hint}")


def _executor(manifest: Manifest, sweep: Sweep, profile: SiteProfile, out: TextIO, verbose: bool) -> Executor:
    return EXECUTORS.load(sweep.executor)(manifest, sweep, profile, out, verbose)


def plan_launches(sweep: Sweep, profile: SiteProfile, out_dir: Path, only: set[str] | None = None) -> list[plan.Launch]:
    """The launches of the sweep's points (all, or `only`), each built once, here."""
    local = EXECUTORS.get(sweep.executor).local
    return [plan.launch_for(p, out_dir, profile, local) for p in sweep.points if only is None or p.id in only]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _record(
    sweep: Sweep, profile: SiteProfile, out_dir: Path, launches: Sequence[plan.Launch], spec_path: Path | None
) -> Manifest:
    """Write the spec (unless `spec_path` is the sweep's own spec.yaml, or it holds the same
    text already), the launches' run files and their manifest entries."""
    spec = SweepDir(out_dir).spec
    if not ((spec_path is not None and _same_file(spec_path, spec)) or _holds(spec, sweep.text)):
        write_text_atomic(spec, sweep.text)
    manifest = Manifest.open(out_dir, sweep.name, sweep.executor)
    for p in (launch.point for launch in launches):
        RunFile(p, sweep.name, sweep.text, sweep.options, profile.as_dict()).write(out_dir)
        manifest.add(p)
    manifest.save()
    return manifest


def _holds(path: Path, text: str) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _check_out(sweep: Sweep, out_dir: Path, ids: Sequence[str], option: str) -> None:
    """Everything the sweep will write into `out_dir`, checked before any of it is: a folder
    (new or existing) that is no other sweep's own folder (sweepdir/outputs.py), whose names
    the sweep writes stay inside it (no `logs` or `points` link to elsewhere)."""
    outputs.check_folder(out_dir, option=option)
    local = EXECUTORS.get(sweep.executor).local
    SweepDir(out_dir).check_inside(ids, executor=None if local else sweep.executor)


def _submit(
    sweep: Sweep,
    profile: SiteProfile,
    out_dir: Path,
    launches: Sequence[plan.Launch],
    verbose: bool,
    out: TextIO,
    spec_path: Path | None = None,
    option: str = "",
) -> int:
    """Write run files and manifest entries, then run or submit the launches (`spec_path`:
    the spec file read, `option`: the option that named `out_dir`, for messages)."""
    local = EXECUTORS.load(sweep.executor).local
    _check_runnable(sweep, local)
    if out_dir.is_dir():
        outputs.probe_writable(option, out_dir)  # refused before the lock, the spec or a run file is written
    with sweep_lock(out_dir):
        manifest = _record(sweep, profile, out_dir, launches, spec_path)
        if not local:
            _executor(manifest, sweep, profile, out, verbose).run(launches)
            print(f"follow with: python -m {PROG} status {shlex.quote(str(out_dir))} --wait", file=out)
            return 0
        ids = [launch.point.id for launch in launches]
        from hpcbench.cli.check import measure_cpu_peaks

        measure_cpu_peaks([launch.point for launch in launches], out)

        def tally() -> dict[str, int]:
            states = [manifest.entries[i].state for i in ids]
            return {state: states.count(state) for state in mf.STATES}

        # Points run here, one after another: on a terminal a bar shows how far along the sweep
        # is; in a log the executor's line per point says it already.
        with SweepProgress(out, len(ids), plain=False) as (stream, progress), Poller(lambda: progress.update(tally())):
            _executor(manifest, sweep, profile, stream, verbose).run(launches)
        counts = tally()
        done, oom = counts[mf.DONE], counts[mf.OUT_OF_MEMORY]
        ran_out = f", {oom} out of memory" if oom else ""  # a result too: resume leaves it
        print(f"{done} of {len(ids)} points done{ran_out}; results in {out_dir}", file=out)
        if done:  # the analysis reads complete points only
            print(f"next: python -m hpcbench.analyze {shlex.quote(str(out_dir))}", file=out)
        return 0 if done + oom == len(ids) else failure.PROBLEM


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    spec_path = Path(args.spec)
    if args.out:  # first of all: `--out` at a file, below one, a device, another sweep's logs/ ...
        outputs.check_folder(Path(args.out), option="--out", reads=[spec_path])
    sweep, profile = plan.load(spec_path, catalog())
    executor_cls = EXECUTORS.load(sweep.executor)
    out_dir = (Path(args.out) if args.out else default_out(sweep.name)).absolute()
    _check_out(sweep, out_dir, [p.id for p in sweep.points], "--out")
    if (out_dir / SweepDir.MANIFEST).exists():
        existing = Manifest.load(out_dir)
        if existing.name != sweep.name:
            raise HpcbenchError(f"{out_dir} holds sweep {existing.name!r}, not {sweep.name!r}: choose another --out")
    launches = plan_launches(sweep, profile, out_dir)
    print_plan(sweep, launches, out_dir, args.dry_run, out)
    if args.dry_run:
        scripts = executor_cls(Manifest(out_dir, sweep.name, sweep.executor), sweep, profile, out).dry_run(launches)
        for path in scripts:
            print(f"wrote {path} (not submitted)", file=out)
        return 0
    return _submit(sweep, profile, out_dir, launches, args.verbose, out, spec_path, "--out")


def _load(directory: Path, out: TextIO, verbose: bool = False) -> tuple[Manifest, Executor]:
    manifest = Manifest.load(directory)
    try:
        text = (directory / SweepDir.SPEC).read_text(encoding="utf-8")
    except OSError as exc:
        raise HpcbenchError(f"{directory / SweepDir.SPEC}: cannot be read ({exc.strerror})") from None
    sweep, profile = plan.load_text(text, catalog())
    return manifest, _executor(manifest, sweep, profile, out, verbose)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.dir)
    manifest, executor = _load(directory, out)
    executor.refresh()
    if args.wait:  # while a point is queued or running, or a sweep command runs them (between two points)
        with SweepProgress(out, len(manifest.entries)) as (_, progress):
            while any(e.state in mf.ACTIVE for e in manifest.entries.values()) or lock.in_use(directory):
                progress.update(manifest.counts())
                time.sleep(args.interval)
                executor.refresh()
            progress.update(manifest.counts())
    counts = manifest.counts()
    print(f"sweep {manifest.name!r} ({manifest.executor}): {plain_line(counts)}", file=out)
    rows = [("point", "state", "job", "tries", "configuration", "log / reason")]
    for e in manifest.entries.values():
        rows.append((e.id, e.state, e.job_id or "-", str(e.attempts), e.label, e.reason or e.log))
    print(textable.render(rows, indent="  "), file=out)
    problem = counts[mf.FAILED] or counts[mf.STOPPED]  # a point failed, or stopped: resume it
    return failure.PROBLEM if problem else failure.OK


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.dir).absolute()
    manifest, executor = _load(directory, out, args.verbose)
    executor.refresh()
    todo = {
        e.id
        for e in manifest.entries.values()
        if e.state not in mf.ACTIVE and not final(result_status(directory / e.result))
    }
    sweep = executor.sweep
    todo &= {p.id for p in sweep.points}
    if not todo:
        print(f"nothing to resume: every point of {directory} is complete, out of memory or still queued", file=out)
        return 0
    _check_out(sweep, directory, sorted(todo), "")
    print(f"resuming {len(todo)} of {len(sweep.points)} points", file=out)
    launches = plan_launches(sweep, executor.profile, directory, todo)
    return _submit(sweep, executor.profile, directory, launches, args.verbose, out, directory / SweepDir.SPEC)


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.dir)
    _, executor = _load(directory, out)
    if executor.local:  # its points run in the sweep command holding the lock: cancel stops it and waits
        cancelled = executor.cancel()
    else:
        with sweep_lock(directory, lock.CANCEL):
            executor.refresh()
            cancelled = executor.cancel()
    entries = executor.manifest.entries
    if not cancelled:
        print(f"nothing to cancel: no point of {directory} is queued or running", file=out)
        return failure.OK
    print(f"cancelled {_count(len(cancelled), 'point')}: {' '.join(cancelled)}", file=out)
    rows = [("point", "state", "configuration", "reason")]
    rows += [(i, entries[i].state, entries[i].label, entries[i].reason or "-") for i in cancelled if i in entries]
    print(textable.render(rows, indent="  "), file=out)
    pending = sum(e.state == mf.PENDING for e in entries.values())
    if pending:
        print(f"{_count(pending, 'point')} never ran (pending); python -m {PROG} resume "
              f"{shlex.quote(str(directory))} runs them and the cancelled ones", file=out)  # fmt: skip
    return failure.OK


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from hpcbench.cli import check  # probes each environment in a subprocess

    return check.command(out, args.peak, args.device, args.dtype, args.seconds, args.env, args.json)


def parser(prog: str = f"python -m {PROG}") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Plan, run and follow benchmark sweeps.")
    p.add_argument("-v", "--verbose", action="store_true", help="print every command run; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    verbose = {"action": "store_true", "default": argparse.SUPPRESS}
    run = sub.add_parser("run", help="plan and run SPEC (the default command)")
    run.add_argument("spec", help="sweep spec (YAML)")
    run.add_argument("--out", help="sweep directory (default: runs/<name>)")
    run.add_argument("--dry-run", action="store_true", help="print the points and launch commands; run nothing")
    run.add_argument("-v", "--verbose", **verbose)  # type: ignore[arg-type]
    status = sub.add_parser("status", help="show the state of every point of a sweep directory")
    status.add_argument("dir")
    status.add_argument("--wait", action="store_true", help="follow until no point is queued or running")
    status.add_argument(
        "--interval",
        type=_interval,
        default=2.0,
        help=f"seconds between polls with --wait ({MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}; default 2)",
    )
    status.add_argument("-v", "--verbose", **verbose)  # type: ignore[arg-type]
    for name, text in (
        ("resume", "rerun the points without a complete result"),
        ("cancel", "stop queued and running points"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("dir")
        cmd.add_argument("-v", "--verbose", **verbose)  # type: ignore[arg-type]
    check = sub.add_parser("check", help="what works in this interpreter and each environment (envs/build.sh)")
    check.add_argument("-v", "--verbose", **verbose)  # type: ignore[arg-type]
    check.add_argument("--peak", action="store_true", help="measure this machine's peak FLOP/s (for MFU) and cache it")
    check.add_argument("--device", choices=("cpu", "cuda"), help="with --peak: the device to measure (default cpu)")
    check.add_argument("--dtype", help="with --peak: fp32, tf32, bf16, fp16, comma-separated (default fp32)")
    check.add_argument("--seconds", type=float, help="with --peak: seconds timed per dtype (default 2)")
    check.add_argument("--env", metavar="NAME", help="one environment in detail (.venv's name, modern, legacy, ...)")
    check.add_argument("--json", action="store_true", help="the table and every environment's report as JSON")
    return p


COMMANDS = {"run": cmd_run, "status": cmd_status, "resume": cmd_resume, "cancel": cmd_cancel, "check": cmd_check}


def _interval(text: str) -> float:
    """`--interval`: seconds, finite, from MIN_INTERVAL_S (a shorter one would spin a core) to
    MAX_INTERVAL_S."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"{text} is out of range: seconds from {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}, e.g. 2"
        )
    return value


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM (scancel, kill, a CI timeout, `hpcbench cancel`) unwinds like Ctrl-C: running ranks
    # are stopped, not orphaned, and the point is recorded with why.
    raise Interrupted(128 + signum, CANCELLED if lock.cancel_requested() else INTERRUPTED)


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    """The sweep commands; `prog` names the command in usage and error lines (default
    `python -m hpcbench.sweep`, as `hpcbench` itself passes "hpcbench"). Run under the one
    error policy (cli/failure.py): bad input is one line and exit 2, a traceback only with -v."""
    name = prog or PROG
    signal.signal(signal.SIGTERM, _terminate)
    args_list, _ = find_command(sys.argv[1:] if argv is None else argv, COMMANDS, default="run")
    args = parser(prog or f"python -m {PROG}").parse_args(args_list)
    try:
        return failure.guarded(lambda: COMMANDS[args.command](args, out), name, args.verbose)
    except Interrupted as exc:
        print(f"{name}: stopped: {exc.reason}", file=sys.stderr)
        return int(exc.code) if isinstance(exc.code, int) else 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
