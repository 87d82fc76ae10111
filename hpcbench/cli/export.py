"""`hpcbench export`: a sweep's results for other tools (docs/export.md).

    hpcbench export SWEEP_DIR [--format parquet,mllog,json] [-o DIR] [--force]

Writes, into DIR (default SWEEP_DIR/export/): `points.parquet`, `iterations.parquet`,
`messages.parquet`, `resources.parquet`, `evaluations.parquet` and `ranks.parquet`
(parquet); `mllog/<point>.log`, MLPerf-style `:::MLLOG` lines (mllog); `summary.json`,
every metric of every point (json). All three formats unless `--format` names some
(repeated, or as a comma list). Exit status 0, or 2 for bad input (a missing directory,
no complete point, an unknown format, an output file that exists already without `--force`,
an output folder that is a file, a device or a sweep directory's own folder) with one line
saying what was wrong (with no point to export, after a warning for every point file
skipped and why); nothing is written then.
The output folder follows hpcbench.sweepdir.outputs: `--force` replaces the files of an
earlier export (regular files only).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from hpcbench.analysis.export import FORMATS, export_sweep
from hpcbench.analysis.export.sweep import NothingToExport
from hpcbench.cli import failure
from hpcbench.cli.pipes import quiet_on_closed_pipe

PROG = "hpcbench export"
HELP = "Parquet tables, MLPerf-style logs and a JSON summary of a sweep"


def run(directory: Path, formats: list[str], output: Path | None, out: TextIO, force: bool = False) -> int:
    skipped: list[str] = []
    try:
        result = export_sweep(directory, formats or list(FORMATS), output, force, skipped)
    except NothingToExport:
        _warn(skipped)  # every point file skipped says why, before the error line
        raise
    _warn(skipped)
    for path in result.files:
        if path.suffix == ".parquet":
            print(f"wrote {path} ({result.rows.get(path.stem, 0):,} rows)", file=out)
        elif path.suffix != ".log":
            print(f"wrote {path}", file=out)
    logs = [path for path in result.files if path.suffix == ".log"]
    if logs:
        print(f"wrote {logs[0].parent}/ ({len(logs)} logs, one per point)", file=out)
    print(f"exported {result.points} points ({', '.join(result.formats)}) to {result.out}", file=out)
    return 0


def _warn(skipped: list[str]) -> None:
    for warning in skipped:
        print(f"warning: {warning}", file=sys.stderr)


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog or PROG, description=f"{HELP}.")
    p.add_argument("dir", metavar="SWEEP_DIR", help="sweep directory (holding <point>.h5 files)")
    p.add_argument(
        "-f",
        "--format",
        action="append",
        default=[],
        metavar="FORMAT",
        help=f"{', '.join(FORMATS)}, or several as a comma list or repeated (default: all)",
    )
    p.add_argument("-o", "--output", type=Path, metavar="DIR", help="output directory (default: SWEEP_DIR/export)")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier export (regular files only)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    return failure.guarded(
        lambda: run(Path(args.dir), args.format, args.output, out, args.force), prog or PROG, args.verbose
    )


if __name__ == "__main__":
    sys.exit(main())
