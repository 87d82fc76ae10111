"""`hpcbench` (also `python -m hpcbench`): one command, its subcommands from families of modules.

    hpcbench run SPEC.yaml [--out DIR] [--dry-run]    plan, then run or submit a sweep
    hpcbench status DIR [--wait]                      every point's state
    hpcbench resume DIR | cancel DIR                  rerun what is not complete | stop what runs
    hpcbench check [--env NAME] [--json]              where each framework x backend works, and why not
    hpcbench analyze DIR                              scaling table and DIR/summary.csv
    hpcbench report DIR [--target-accuracy F]         report.html, report.md and CSV tables
    hpcbench trace POINT.h5 -o TRACE.json             Chrome-trace / Perfetto JSON of one point
    hpcbench commbench [--sizes ...]                  collective micro-benchmark (on every rank)
    hpcbench predict FILE.yaml | DIR --nodes 8,16   predicted scaling from your numbers or a sweep
    hpcbench compare BASE_DIR NEW_DIR [--threshold 5] what got slower between two sweeps, and is it real
    hpcbench export DIR [--format parquet,mllog,json] Parquet tables, :::MLLOG lines, summary.json

A family is a module of `hpcbench.cli` with a `main(argv, out, prog=...)`; the sweep,
analysis and commbench families keep their own `python -m` entry points (`hpcbench.sweep`,
`hpcbench.analyze`, `hpcbench.commbench`). This module only routes; `find_command` is how
this command and the families with a default command (`hpcbench.sweep SPEC.yaml` is
`hpcbench.sweep run SPEC.yaml`) find theirs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TextIO

from hpcbench.cli.pipes import quiet_on_closed_pipe

PROG = "hpcbench"


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    family: str  # the module in hpcbench.cli that implements it
    argv0: tuple[str, ...]  # what the family's own parser is given before the arguments


SUBCOMMANDS = (
    Subcommand("run", "plan, then run or submit a sweep spec", "sweep", ("run",)),
    Subcommand("status", "every point's state in a sweep directory", "sweep", ("status",)),
    Subcommand("resume", "rerun the points without a complete result", "sweep", ("resume",)),
    Subcommand("cancel", "stop queued and running points", "sweep", ("cancel",)),
    Subcommand("check", "where each framework x backend works, in which environments", "sweep", ("check",)),
    Subcommand("analyze", "scaling table of a sweep directory (and summary.csv)", "analyze", ("analyze",)),
    Subcommand("report", "HTML report, Markdown and CSV tables of a sweep", "analyze", ("report",)),
    Subcommand("trace", "Chrome-trace / Perfetto JSON of one point file", "analyze", ("trace",)),
    Subcommand("commbench", "all-reduce time and bandwidth over message sizes (run on every rank)", "commbench", ()),
    Subcommand("predict", "predicted scaling from a YAML description or a measured sweep", "predict", ()),
    Subcommand("compare", "what got slower between two sweeps of the same spec, and is it real", "compare", ()),
    Subcommand("export", "a sweep's results as Parquet, MLPerf-style logs and JSON", "export", ()),
)


def find_command(
    args: Sequence[str], commands: Collection[str], default: str | None = None
) -> tuple[list[str], int | None]:
    """The arguments, with `default` put first where their first word (the first argument
    that is not an option) is none of `commands`, and where the command stands among them:
    None where there is no word (help, version, a usage error), or no default for it."""
    args = list(args)
    first = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if first is None or args[first] in commands:
        return args, first
    if default is None:
        return args, None
    return [default, *args], 0


def _family(name: str) -> Callable[..., int]:
    """The family's `main`, imported only when used (analysis needs pandas, commbench MPI)."""
    module = importlib.import_module(f"hpcbench.cli.{name}")
    main: Callable[..., int] = module.main
    return main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Reproducible benchmarks of distributed deep-learning training on HPC clusters.",
        epilog=f"'{PROG} COMMAND --help' describes a command.",
    )
    from hpcbench import __version__

    p.add_argument("--version", action="version", version=f"hpcbench {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in SUBCOMMANDS:
        sub.add_parser(cmd.name, help=cmd.help, add_help=False)
    return p


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    by_name = {cmd.name: cmd for cmd in SUBCOMMANDS}
    args, first = find_command(sys.argv[1:] if argv is None else argv, by_name)
    if first is None:
        parser().parse_args(args)  # prints help, the version, or the usage error (exit 2)
        return 2
    cmd = by_name[args[first]]
    rest = args[:first] + args[first + 1 :]
    return _family(cmd.family)([*cmd.argv0, *rest], out, prog=f"{PROG} {cmd.name}" if not cmd.argv0 else PROG)
