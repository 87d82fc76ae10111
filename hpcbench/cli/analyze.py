"""`python -m hpcbench.analyze`: tables and traces from point files.

    python -m hpcbench.analyze SWEEP_DIR                     scaling table, printed and as SWEEP_DIR/summary.csv
    python -m hpcbench.analyze trace POINT.h5 -o TRACE.json [--ideal]
                                                             Chrome-trace / Perfetto JSON of one point (with
                                                             the what-if timeline beside it)
    python -m hpcbench.analyze report SWEEP_DIR [--target-accuracy 0.98] [--commbench FILE.h5 ...]
                                                             report.html, report.md and CSV tables

Needs numpy, pandas, h5py and matplotlib only: it runs anywhere the point files can be copied to.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import pandas as pd

from hpcbench.analysis import metrics, resources, tables
from hpcbench.analysis.export import chrome as trace_export
from hpcbench.analysis.stragglers import whatif
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.model.contention import placement_of
from hpcbench.analysis.metric_table import Format, metric
from hpcbench.cli import failure, textable
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.cli.progress import FileProgress
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.atomic import write_text_atomic

PROG = "hpcbench.analyze"

_IDENT = [("point", "point"), ("framework", "framework"), ("backend", "backend"), ("model", "model"),
          ("nodes", "nodes"), ("ranks_per_node", "ranks/node"), ("batch_size", "batch")]  # fmt: skip
# communication as shares of wall time: while any message was in flight, and after backward ended
_METRICS = ("t_iter_s", "throughput", "speedup", "efficiency", "lif", "comm_union_share", "comm_exposed_share")


def format_table(table: pd.DataFrame) -> str:
    """The scaling table as text: the configuration, then the metrics as the metric table
    formats them ("-" where a value is undefined, e.g. speedup without a 1-rank point)."""
    ident = list(_IDENT)
    if metrics.names_environments(table):
        ident.insert(3, ("env", "env"))
    shown: list[tuple[str, str, Format]] = [(key, title, str) for key, title in ident]
    shown += [(m.key, m.label, m.fmt) for m in map(metric, _METRICS)]
    rows = [[title for _, title, _ in shown]]
    rows += [[fmt(rec[col]) or "-" for col, _, fmt in shown] for rec in table.to_dict("records")]
    return textable.render(rows, right=True)


def cmd_summary(directory: Path, out: TextIO) -> int:
    with FileProgress() as tick:
        sweep = tables.load(directory, on_file=tick)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not sweep.points:
        raise HpcbenchError(f"{directory}: no complete point files to analyse")
    table = metrics.summary([(p.point, p.point_id, p.iterations) for p in sweep.points], [p.comm for p in sweep.points])
    write_text_atomic(directory / "summary.csv", table.to_csv(index=False))
    print(format_table(table), file=out)
    for note in metrics.warnings_for(table):
        print(f"note: {note}", file=out)
    for p in sweep.points:
        where = placement_of(p)
        if where.oversubscribed:
            print(f"note: point {p.point_id}: oversubscribed: {where.describe()}; "
                  "compute and CPU collectives are time-shared", file=out)  # fmt: skip
        for note in resources.host_notes(p.point_id, resources.of_point(p)):
            print(f"note: {note}", file=out)
    print(f"wrote {directory / 'summary.csv'} ({len(table)} points)", file=out)
    return 0


def cmd_trace(path: Path, output: Path, out: TextIO, ideal: bool = False) -> int:
    data = read_point(path)
    label = f"{data.point.label()} [{data.point_id}]"
    trace = trace_export.chrome_trace(data.iterations, data.ranks, data.comm, data.resources, data.hostnames, label)
    if ideal:  # the what-if timeline (every rank at the median rank's speed) beside the measured one
        rows = whatif.ideal_iterations(data.iterations, not whatif.asynchronous(data.point))
        empty_comm, empty_res = data.comm[:0], data.resources[:0]
        other = trace_export.chrome_trace(rows, data.ranks, empty_comm, empty_res, data.hostnames, label)
        trace = trace_export.with_ideal(trace, other, "every rank at the median rank's speed")
    trace_export.write_chrome_trace(output, trace)
    print(f"wrote {output} ({len(trace['traceEvents'])} events); open it in https://ui.perfetto.dev", file=out)
    return 0


def cmd_report(directory: Path, target: float | None, commbench: list[Path], out: TextIO) -> int:
    from hpcbench.analysis.report import html as report  # matplotlib only for this command
    from hpcbench.analysis.model.linkfit import link_from_commbench

    link: LinkCost | None = link_from_commbench(commbench) if commbench else None
    with FileProgress() as tick:
        analysis = tables.analyse(directory, target_accuracy=target, link=link, on_file=tick)
    for warning in analysis.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    paths = report.write_report(analysis)
    for note in analysis.notes:
        print(f"note: {note}", file=out)
    print(f"wrote {paths[0]} ({len(analysis.stats)} points), {paths[1].name} and "
          f"{', '.join(p.name for p in paths[2:])}", file=out)  # fmt: skip
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in (0, 1], e.g. 0.98")
    return value


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    """The analysis commands; `prog` names the command in usage and error lines."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=prog or f"python -m {PROG}", description="Analyse point files.")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    summary = sub.add_parser(
        "analyze", aliases=["summary"], help="scaling table of a sweep directory (the default command)"
    )
    summary.add_argument("dir", help="sweep directory (holding <point>.h5 files)")
    trace = sub.add_parser("trace", help="Chrome-trace / Perfetto JSON of one point file")
    trace.add_argument("point", help="a point file (<id>.h5)")
    trace.add_argument("-o", "--output", required=True, help="where to write the JSON trace")
    ideal_help = "add the what-if timeline (every rank at the median rank's speed) beside the measured one"
    trace.add_argument("--ideal", action="store_true", help=ideal_help)
    report = sub.add_parser("report", help="HTML report with figures, Markdown and CSV tables of a sweep")
    report.add_argument("dir", help="sweep directory (holding <point>.h5 files)")
    report.add_argument("--target-accuracy", type=_fraction, help="accuracy (fraction) for time-to-accuracy")
    report.add_argument("--commbench", nargs="+", default=[], help="commbench files to fit α and β on")
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first is not None and first not in ("analyze", "summary", "trace", "report"):
        args_list.insert(0, "analyze")  # `analyze DIR` means `analyze analyze DIR`
    args = p.parse_args(args_list)
    try:
        if args.command == "trace":
            return cmd_trace(Path(args.point), Path(args.output), out, args.ideal)
        if args.command == "report":
            return cmd_report(Path(args.dir), args.target_accuracy, [Path(c) for c in args.commbench], out)
        return cmd_summary(Path(args.dir), out)
    except HpcbenchError as exc:
        return failure.report(exc, prog or PROG, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
