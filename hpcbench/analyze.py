"""`python -m hpcbench.analyze`: tables and traces from point files.

    python -m hpcbench.analyze SWEEP_DIR                     scaling table, printed and as SWEEP_DIR/summary.csv
    python -m hpcbench.analyze trace POINT.h5 -o TRACE.json  Chrome-trace / Perfetto JSON of one point

Needs numpy, pandas and h5py only: it runs anywhere the point files can be copied to.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from hpcbench import textable
from hpcbench.analysis import metrics, tables, trace_export
from hpcbench.atomic import write_text_atomic
from hpcbench.errors import HpcbenchError, one_line
from hpcbench.store.reader import read_point

PROG = "hpcbench.analyze"

_SHOWN: list[tuple[str, str, Callable[[Any], str]]] = [
    ("point", "point", str),
    ("framework", "framework", str),
    ("backend", "backend", str),
    ("model", "model", str),
    ("nodes", "nodes", str),
    ("ranks_per_node", "ranks/node", str),
    ("batch_size", "batch", str),
    ("t_iter_s", "t_iter ms", lambda v: f"{v * 1e3:.2f}"),
    ("throughput", "samples/s", lambda v: f"{v:.1f}"),
    ("speedup", "speedup", lambda v: "-" if math.isnan(v) else f"{v:.2f}"),
    ("efficiency", "efficiency", lambda v: "-" if math.isnan(v) else f"{v:.0%}"),
    ("lif", "LIF", lambda v: f"{v:.3f}"),
    ("comm_share", "comm", lambda v: f"{v:.0%}"),
]


def format_table(table: pd.DataFrame) -> str:
    rows = [[title for _, title, _ in _SHOWN]]
    rows += [[fmt(rec[col]) for col, _, fmt in _SHOWN] for rec in table.to_dict("records")]
    return textable.render(rows, right=True)


def cmd_summary(directory: Path, out: TextIO) -> int:
    sweep = tables.load(directory)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not sweep.points:
        raise HpcbenchError(f"{directory}: no complete point files to analyse")
    table = metrics.summary([(p.point, p.point_id, p.iterations) for p in sweep.points])
    write_text_atomic(directory / "summary.csv", table.to_csv(index=False))
    print(format_table(table), file=out)
    for note in metrics.warnings_for(table):
        print(f"note: {note}", file=out)
    print(f"wrote {directory / 'summary.csv'} ({len(table)} points)", file=out)
    return 0


def cmd_trace(path: Path, output: Path, out: TextIO) -> int:
    data = read_point(path)
    trace = trace_export.chrome_trace(
        data.iterations,
        data.ranks,
        data.comm,
        data.resources,
        data.hostnames,
        f"{data.point.label()} [{data.point_id}]",
    )
    trace_export.write_chrome_trace(output, trace)
    print(f"wrote {output} ({len(trace['traceEvents'])} events); open it in https://ui.perfetto.dev", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description="Analyse point files.")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="scaling table of a sweep directory (the default command)")
    summary.add_argument("dir", help="sweep directory (holding <point>.h5 files)")
    trace = sub.add_parser("trace", help="Chrome-trace / Perfetto JSON of one point file")
    trace.add_argument("point", help="a point file (<id>.h5)")
    trace.add_argument("-o", "--output", required=True, help="where to write the JSON trace")
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first is not None and first not in ("summary", "trace"):
        args_list.insert(0, "summary")  # `analyze DIR` means `analyze summary DIR`
    args = p.parse_args(args_list)
    try:
        if args.command == "trace":
            return cmd_trace(Path(args.point), Path(args.output), out)
        return cmd_summary(Path(args.dir), out)
    except HpcbenchError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
