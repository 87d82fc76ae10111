"""`python -m hpcbench.sweep`: plan and run a sweep, and look after it.

    python -m hpcbench.sweep SPEC.yaml [--out DIR] [--dry-run] [-v]   plan, then run or submit
    python -m hpcbench.sweep status DIR [--wait]                      every point's state
    python -m hpcbench.sweep resume DIR [-v]                          rerun what has no complete result
                                                                      (failed, stopped, never run)
    python -m hpcbench.sweep cancel DIR                               stop what is queued or running
    python -m hpcbench.sweep check                                    what works in each environment

An invalid spec prints one line on stderr and exits 2 before anything is created.
"""

from __future__ import annotations

import argparse
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
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan import envs
from hpcbench.plan import launch as plan
from hpcbench.plan.profiles import SiteProfile
from hpcbench.spec import Sweep
from hpcbench.store import schema
from hpcbench.store.status import result_status
from hpcbench.sweepdir import manifest as mf
from hpcbench.sweepdir.atomic import write_text_atomic
from hpcbench.sweepdir.layout import SweepDir
from hpcbench.sweepdir.lock import sweep_lock
from hpcbench.sweepdir.manifest import Manifest
from hpcbench.sweepdir.runfile import RunFile

PROG = "hpcbench.sweep"


def default_out(name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "sweep"
    return Path("runs") / slug


def print_plan(sweep: Sweep, launches: Sequence[plan.Launch], out_dir: Path, dry_run: bool, out: TextIO) -> None:
    print(f"sweep {sweep.name!r}: {len(launches)} points, executor {sweep.executor}, output {out_dir}", file=out)
    header = ("point", "framework", "backend", "launcher", "model", "nodes", "ranks/node", "batch", "iterations")
    rows = [header]
    for p in (launch.point for launch in launches):
        scale = (str(p.nodes), str(p.ranks_per_node), str(p.batch_size), f"{p.iterations}+{p.warmup}w")
        rows.append((p.id, p.framework, p.backend, p.launcher, p.model, *scale))
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


def _record(sweep: Sweep, profile: SiteProfile, out_dir: Path, launches: Sequence[plan.Launch]) -> Manifest:
    """Write the spec, the launches' run files and their manifest entries."""
    write_text_atomic(SweepDir(out_dir).spec, sweep.text)
    manifest = Manifest.open(out_dir, sweep.name, sweep.executor)
    for p in (launch.point for launch in launches):
        RunFile(p, sweep.name, sweep.text, sweep.options, profile.as_dict()).write(out_dir)
        manifest.add(p)
    manifest.save()
    return manifest


def _submit(
    sweep: Sweep, profile: SiteProfile, out_dir: Path, launches: Sequence[plan.Launch], verbose: bool, out: TextIO
) -> int:
    """Write run files and manifest entries, then run or submit the launches."""
    local = EXECUTORS.load(sweep.executor).local
    _check_runnable(sweep, local)
    with sweep_lock(out_dir):
        manifest = _record(sweep, profile, out_dir, launches)
        if not local:
            _executor(manifest, sweep, profile, out, verbose).run(launches)
            print(f"follow with: python -m {PROG} status {shlex.quote(str(out_dir))} --wait", file=out)
            return 0
        ids = [launch.point.id for launch in launches]

        def tally() -> dict[str, int]:
            states = [manifest.entries[i].state for i in ids]
            return {state: states.count(state) for state in mf.STATES}

        # Points run here, one after another: on a terminal a bar shows how far along the sweep
        # is; in a log the executor's line per point says it already.
        with SweepProgress(out, len(ids), plain=False) as (stream, progress), Poller(lambda: progress.update(tally())):
            _executor(manifest, sweep, profile, stream, verbose).run(launches)
        done = tally()[mf.DONE]
        print(f"{done} of {len(ids)} points done; results in {out_dir}", file=out)
        print(f"next: python -m hpcbench.analyze {shlex.quote(str(out_dir))}", file=out)
        return 0 if done == len(ids) else 1


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    sweep, profile = plan.load(Path(args.spec), catalog())
    executor_cls = EXECUTORS.load(sweep.executor)
    out_dir = (Path(args.out) if args.out else default_out(sweep.name)).absolute()
    launches = plan_launches(sweep, profile, out_dir)
    print_plan(sweep, launches, out_dir, args.dry_run, out)
    if (out_dir / SweepDir.MANIFEST).exists():
        existing = Manifest.load(out_dir)
        if existing.name != sweep.name:
            raise HpcbenchError(f"{out_dir} holds sweep {existing.name!r}, not {sweep.name!r}: choose another --out")
    if args.dry_run:
        scripts = executor_cls(Manifest(out_dir, sweep.name, sweep.executor), sweep, profile, out).dry_run(launches)
        for path in scripts:
            print(f"wrote {path} (not submitted)", file=out)
        return 0
    return _submit(sweep, profile, out_dir, launches, args.verbose, out)


def _load(directory: Path, out: TextIO, verbose: bool = False) -> tuple[Manifest, Executor]:
    manifest = Manifest.load(directory)
    try:
        text = (directory / SweepDir.SPEC).read_text(encoding="utf-8")
    except OSError as exc:
        raise HpcbenchError(f"{directory / SweepDir.SPEC}: cannot be read ({exc.strerror})") from None
    sweep, profile = plan.load_text(text, catalog())
    return manifest, _executor(manifest, sweep, profile, out, verbose)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    manifest, executor = _load(Path(args.dir), out)
    executor.refresh()
    if args.wait:
        with SweepProgress(out, len(manifest.entries)) as (_, progress):
            while any(e.state in mf.ACTIVE for e in manifest.entries.values()):
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
    return 0 if counts[mf.FAILED] == counts[mf.STOPPED] == 0 else 1  # stopped: resume it


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.dir).absolute()
    manifest, executor = _load(directory, out, args.verbose)
    executor.refresh()
    todo = {
        e.id
        for e in manifest.entries.values()
        if e.state not in mf.ACTIVE and result_status(directory / e.result) != schema.STATUS_COMPLETE
    }
    sweep = executor.sweep
    todo &= {p.id for p in sweep.points}
    if not todo:
        print(f"nothing to resume: every point of {directory} is complete or still queued", file=out)
        return 0
    print(f"resuming {len(todo)} of {len(sweep.points)} points", file=out)
    launches = plan_launches(sweep, executor.profile, directory, todo)
    return _submit(sweep, executor.profile, directory, launches, args.verbose, out)


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    _, executor = _load(Path(args.dir), out)
    with sweep_lock(Path(args.dir)):
        executor.refresh()
        cancelled = executor.cancel()
    print(f"cancelled {len(cancelled)} points" + (f": {' '.join(cancelled)}" if cancelled else ""), file=out)
    return 0


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from hpcbench.cli import check  # probes each environment in a subprocess

    return check.check(out)


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
    status.add_argument("--interval", type=float, default=2.0, help="seconds between polls with --wait")
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
    return p


COMMANDS = {"run": cmd_run, "status": cmd_status, "resume": cmd_resume, "cancel": cmd_cancel, "check": cmd_check}


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM (scancel, kill, a CI timeout) unwinds like Ctrl-C: running ranks are stopped, not orphaned.
    raise SystemExit(128 + signum)


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    """The sweep commands; `prog` names the command in usage and error lines (default
    `python -m hpcbench.sweep`, as `hpcbench` itself passes "hpcbench")."""
    name = prog or PROG
    signal.signal(signal.SIGTERM, _terminate)
    args_list, _ = find_command(sys.argv[1:] if argv is None else argv, COMMANDS, default="run")
    args = parser(prog or f"python -m {PROG}").parse_args(args_list)
    try:
        return COMMANDS[args.command](args, out)
    except HpcbenchError as exc:
        return failure.report(exc, name, args.verbose)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
