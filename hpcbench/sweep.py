"""`python -m hpcbench.sweep`: plan and run a sweep, or look at one.

    python -m hpcbench.sweep SPEC.yaml [--out DIR] [--dry-run] [-v]
    python -m hpcbench.sweep status DIR

An invalid spec prints one line on stderr and exits 2 before anything is created.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from hpcbench import plan, textable
from hpcbench.atomic import write_text_atomic
from hpcbench.errors import HpcbenchError
from hpcbench.executors import EXECUTORS
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS
from hpcbench.manifest import DONE, Manifest
from hpcbench.runfile import RunFile
from hpcbench.spec import Sweep

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
        print("launch commands (nothing is run):", file=out)
        for launch in launches:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
            print(f"  {launch.point.id}: {env} {shlex.join(launch.argv)}", file=out)


def _check_runnable(sweep: Sweep, local: bool) -> None:
    """Everything the points need must be here before anything is created."""
    for name in sorted({p.framework for p in sweep.points}):
        FRAMEWORKS.load(name)
    for name in sorted({p.launcher for p in sweep.points}):
        LAUNCHERS.load(name)
        program = LAUNCHERS.get(name).program
        if local and program and shutil.which(program) is None:
            raise HpcbenchError(f"launcher {name!r} needs {program!r}, which is not on PATH")


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    sweep = plan.load(Path(args.spec))
    executor_cls = EXECUTORS.load(sweep.executor)
    out_dir = Path(args.out) if args.out else default_out(sweep.name)
    launches = [plan.launch_for(p, out_dir.resolve(), executor_cls.local) for p in sweep.points]
    print_plan(sweep, launches, out_dir, args.dry_run, out)
    if args.dry_run:
        return 0
    _check_runnable(sweep, executor_cls.local)
    if (out_dir / Manifest.FILE).exists():
        existing = Manifest.load(out_dir)
        if existing.name != sweep.name:
            raise HpcbenchError(f"{out_dir} holds sweep {existing.name!r}, not {sweep.name!r}: choose another --out")
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / "spec.yaml", sweep.text)
    manifest = Manifest.open(out_dir, sweep.name, sweep.executor)
    for p in sweep.points:
        RunFile(p, sweep.name, sweep.text, sweep.options).write(out_dir)
        manifest.add(p)
    manifest.save()
    executor_cls(manifest, sweep.options, out, verbose=args.verbose).run(launches)
    ids = {p.id for p in sweep.points}
    done = sum(1 for e in manifest.entries.values() if e.id in ids and e.state == DONE)
    print(f"{done} of {len(ids)} points done; results in {out_dir}", file=out)
    print(f"next: python -m hpcbench.analyze {shlex.quote(str(out_dir))}", file=out)
    return 0 if done == len(ids) else 1


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    manifest = Manifest.load(Path(args.dir))
    counts = manifest.counts()
    states = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"sweep {manifest.name!r} ({manifest.executor}): {states}", file=out)
    for e in manifest.entries.values():
        extra = f"  {e.reason}" if e.reason else ""
        print(f"  {e.id}  {e.state:<8} attempts={e.attempts}  {e.label}{extra}", file=out)
    return 0 if counts["failed"] == 0 else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description="Plan and run a benchmark sweep.")
    p.add_argument("-v", "--verbose", action="store_true", help="print every command run; tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="plan and run SPEC (the default command)")
    run.add_argument("spec", help="sweep spec (YAML)")
    run.add_argument("--out", help="sweep directory (default: runs/<name>)")
    run.add_argument("--dry-run", action="store_true", help="print the points and launch commands; run nothing")
    run.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    status = sub.add_parser("status", help="show the state of every point of a sweep directory")
    status.add_argument("dir")
    status.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    return p


COMMANDS = {"run": cmd_run, "status": cmd_status}


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first is not None and first not in COMMANDS:
        args_list.insert(0, "run")  # `sweep SPEC.yaml` means `sweep run SPEC.yaml`
    args = parser().parse_args(args_list)
    try:
        return COMMANDS[args.command](args, out)
    except HpcbenchError as exc:
        if args.verbose:
            traceback.print_exc()
        message = " ".join(str(exc).split())  # one line, whatever the value held
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
