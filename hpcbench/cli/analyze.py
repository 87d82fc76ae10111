"""`python -m hpcbench.analyze`: tables and traces from point files.

    python -m hpcbench.analyze SWEEP_DIR [--no-cache]        scaling table, printed and as SWEEP_DIR/summary.csv
    python -m hpcbench.analyze trace POINT.h5 -o TRACE.json [--ideal] [--force]
                                                             Chrome-trace / Perfetto JSON of one point (with
                                                             the what-if timeline beside it)
    python -m hpcbench.analyze report SWEEP_DIR [--target-accuracy 0.98] [--commbench FILE.h5 ...] [--no-cache]
                                                             report.html, report.md and CSV tables

Needs numpy, pandas, h5py and plotly only: it runs anywhere the point files can be copied to.
Exit status 0, or 2 with one line on stderr for bad input (a missing or damaged file, no
complete point, a sweep directory that cannot be written, a refused -o; the output policy is
hpcbench.sweepdir.outputs'). `analyze` and `report` rewrite their own files in the sweep
directory on every run; `trace -o` never replaces a file without `--force`. Both keep what
each point file derives in SWEEP_DIR/.hpcbench-cache/ (hpcbench.analysis.cache), used while
the file is unchanged; `--no-cache` neither uses nor writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from hpcbench.analysis import cache, energy, loading, metrics, per_point, pipeline, resources, tables, workload
from hpcbench.analysis.export import chrome as trace_export
from hpcbench.analysis.metric_table import Format, metric
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.stragglers import whatif
from hpcbench.cli import failure, textable
from hpcbench.cli.layouts import format_layouts, measured_layouts
from hpcbench.cli.main import find_command
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.cli.progress import FileProgress
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.outputs import OutputFile, check_file, probe_writable

PROG = "hpcbench.analyze"
NO_CACHE_HELP = f"read every point file again, neither using nor writing {cache.CACHE_DIR}/ (the derived tables' cache)"
SUMMARY = "summary.csv"  # written into the sweep directory

_IDENT = [("point", "point"), ("framework", "framework"), ("backend", "backend"), ("model", "model"),
          ("nodes", "nodes"), ("ranks_per_node", "ranks/node"), ("batch_size", "batch")]  # fmt: skip
# communication as shares of wall time: while any message was in flight, and after backward ended
_METRICS = ("t_iter_s", "throughput", "speedup", "efficiency", "lif", "comm_union_share", "comm_exposed_share")
# a sweep of sequence models adds what transformer benchmarks compare (analysis/workload.py)
_TOKEN_METRICS = ("tokens_per_s", "tokens_per_s_device", "mfu", "peak_device_gib", "peak_host_gib", "perplexity")
_NUMERICS = [("precision", "precision"), ("seq_len", "seq"), ("compile", "compile")]


def format_table(table: pd.DataFrame) -> str:
    """The scaling table as text: the configuration, then the metrics as the metric table
    formats them ("-" where a value is undefined, e.g. speedup without a 1-rank point)."""
    ident = list(_IDENT)
    if metrics.names_environments(table):
        ident.insert(3, ("env", "env"))
    tokens = workload.has_tokens(table)
    if tokens:  # the numerics a transformer sweep varies, where any point sets them
        ident += [(key, title) for key, title in _NUMERICS if key in table and _varies_or_set(table[key])]
    shown: list[tuple[str, str, Format]] = [(key, title, _cell) for key, title in ident]
    shown += [(m.key, m.label, m.fmt) for m in map(metric, _METRICS + (_TOKEN_METRICS if tokens else ()))]
    if energy.measured(table):  # energy per sample and power, where some point's counters were read
        shown += [(m.key, m.label, m.fmt) for m in map(metric, energy.SHOWN)]
    rows = [[title for _, title, _ in shown]]
    rows += [[fmt(rec[col]) or "-" for col, _, fmt in shown] for rec in table.to_dict("records")]
    return textable.render(rows, right=True)


def format_collectives(table: pd.DataFrame) -> str:
    """The collectives per point x op x mesh axis (analysis/collectives.py) as a section of text."""
    head = "collectives per mesh axis (timed iterations; per rank; busbw with nccl-tests' factors):"
    if table.empty:
        return f"\n{head} no message was recorded"
    rows = [["point", "layout", "op", "axis", "n", "level", "msgs/iter", "MB/iter", "ms/msg", "algbw GB/s",
             "busbw GB/s"]]  # fmt: skip
    for r in table.to_dict("records"):
        rows.append([str(r["point"]), str(r["layout"]), str(r["op"]), str(r["axis"]), str(r["group_size"]),
                     str(r["level"]), f"{r['messages_per_iter']:.2f}", f"{r['bytes_per_iter'] / 1e6:,.2f}",
                     f"{r['time_per_message_s'] * 1e3:.3f}", _rate(r["algbw"]), _rate(r["busbw"])])  # fmt: skip
    return f"\n{head}\n" + textable.render(rows, right=True)


def _rate(value: float) -> str:
    return "-" if value != value else f"{value / 1e9:,.2f}"


def _cell(value: object) -> str:
    """An identifying cell: an integer-valued float (a column with blanks) as an integer."""
    if isinstance(value, float):
        return "" if value != value else (str(int(value)) if value.is_integer() else str(value))
    return str(value)


def _varies_or_set(column: pd.Series) -> bool:
    values = set(column.dropna().astype(str)) - {"", "fp32"}
    return bool(values) or column.dropna().astype(str).nunique() > 1


def _sweep_dir(directory: Path) -> None:
    if not directory.is_dir():
        what = "no such sweep directory" if not directory.exists() else "not a directory"
        raise HpcbenchError(f"{directory}: {what}")


def cmd_summary(directory: Path, out: TextIO, use_cache: bool = True) -> int:
    _sweep_dir(directory)
    summary = directory / SUMMARY
    with OutputFile(summary, option="", own=True) as output:  # a read-only sweep stops here
        with FileProgress() as tick:
            sweep = loading.load(directory, on_file=tick, use_cache=use_cache)
        for warning in sweep.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not sweep.points:
            raise HpcbenchError(f"{directory}: no complete point files to analyse")
        table = per_point.summary_table(sweep.points)
        output.write_text(table.to_csv(index=False))
    print(format_table(table), file=out)
    if any(p.point.parallel for p in sweep.points):
        sweep.with_collectives()
        print(format_collectives(per_point.collectives_table(sweep.points)), file=out)
        if not (layouts := measured_layouts(sweep, table)).empty:
            print(format_layouts(layouts), file=out)
    for note in workload.notes(table):
        print(f"note: {note}", file=out)
    if note := energy.sweep_note(table):  # one line for the sweep, not one per point
        print(f"note: {note}", file=out)
    for note in metrics.warnings_for(table):
        print(f"note: {note}", file=out)
    for p in sweep.points:
        if p.placement:
            print(f"note: point {p.point_id}: oversubscribed: {p.placement}; "
                  "compute and CPU collectives are time-shared", file=out)  # fmt: skip
        for note in resources.host_notes(p.point_id, p.resources):
            print(f"note: {note}", file=out)
    print(f"wrote {summary} ({len(table)} points)", file=out)
    return 0


def cmd_trace(path: Path, output: Path, out: TextIO, ideal: bool = False, force: bool = False) -> int:
    if not path.is_file():
        what = "no such file" if not path.exists() else "not a file"
        raise HpcbenchError(f"{path}: {what}; a point file (<id>.h5)")
    claimed = OutputFile(output, option="-o/--output", force=force, reads=[path])  # checked before any work
    with claimed:
        trace = _chrome_trace(path, ideal)
        claimed.write_with(lambda f: json.dump(trace, f, allow_nan=False, separators=(",", ":")))
    print(f"wrote {output} ({len(trace['traceEvents'])} events); open it in https://ui.perfetto.dev", file=out)
    return 0


def _chrome_trace(path: Path, ideal: bool) -> dict[str, Any]:
    data = read_point(path)
    label = f"{data.point.label()} [{data.point_id}]"
    trace = trace_export.chrome_trace(data.iterations, data.ranks, data.comm, data.resources, data.hostnames, label)
    if ideal:  # the what-if timeline (every rank at the median rank's speed) beside the measured one
        rows = whatif.ideal_iterations(data.iterations, not whatif.asynchronous(data))
        empty_comm, empty_res = data.comm[:0], data.resources[:0]
        other = trace_export.chrome_trace(rows, data.ranks, empty_comm, empty_res, data.hostnames, label)
        trace = trace_export.with_ideal(trace, other, "every rank at the median rank's speed")
    return trace


def cmd_report(
    directory: Path, target: float | None, commbench: list[Path], out: TextIO, use_cache: bool = True
) -> int:
    from hpcbench.analysis.model.linkfit import link_from_commbench
    from hpcbench.analysis.report import html as report  # plotly only for this command

    _sweep_dir(directory)
    for name in report_files():  # the report's own files, rewritten on every run; a read-only sweep stops here
        check_file(directory / name, option="", own=True, reads=commbench)
    probe_writable("", directory)
    link: LinkCost | None = link_from_commbench(commbench) if commbench else None
    with FileProgress() as tick:
        analysis = pipeline.analyse(directory, target, link, on_file=tick, use_cache=use_cache)
    for warning in analysis.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    paths = report.write_report(analysis)
    for note in analysis.notes:
        print(f"note: {note}", file=out)
    print(f"wrote {paths[0]} ({len(analysis.stats)} points), {paths[1].name} and "
          f"{', '.join(p.name for p in paths[2:])}", file=out)  # fmt: skip
    return 0


def report_files() -> list[str]:
    """The files `report` writes into the sweep directory."""
    from hpcbench.analysis.report import html as report
    from hpcbench.analysis.report import stragglers as straggler_report

    tables = [f"{name}.csv" for name in (*report.CSV_TABLES, *straggler_report.CSV)]
    return tables + report.figure_files() + ["report.md", "report.html"]


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
    summary.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    trace = sub.add_parser("trace", help="Chrome-trace / Perfetto JSON of one point file")
    trace.add_argument("point", help="a point file (<id>.h5)")
    trace.add_argument("-o", "--output", required=True, help="where to write the JSON trace (a new file)")
    trace.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    ideal_help = "add the what-if timeline (every rank at the median rank's speed) beside the measured one"
    trace.add_argument("--ideal", action="store_true", help=ideal_help)
    report = sub.add_parser("report", help="HTML report with figures, Markdown and CSV tables of a sweep")
    report.add_argument("dir", help="sweep directory (holding <point>.h5 files)")
    report.add_argument("--target-accuracy", type=_fraction, help="accuracy (fraction) for time-to-accuracy")
    report.add_argument("--commbench", nargs="+", default=[], help="commbench files to fit α and β on")
    report.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    args_list, _ = find_command(args_list, ("analyze", "summary", "trace", "report"), default="analyze")
    args = p.parse_args(args_list)

    def command() -> int:
        if args.command == "trace":
            return cmd_trace(Path(args.point), Path(args.output), out, args.ideal, args.force)
        if args.command == "report":
            commbench = [Path(c) for c in args.commbench]
            return cmd_report(Path(args.dir), args.target_accuracy, commbench, out, not args.no_cache)
        return cmd_summary(Path(args.dir), out, not args.no_cache)

    return failure.guarded(command, prog or PROG, args.verbose)


if __name__ == "__main__":
    sys.exit(main())


def load_sweep(directory: Path, purpose: str) -> tables.SweepData:
    """A sweep's complete points read with a progress bar, every point file left out named on
    stderr (as every command names them); an error where none is left `purpose` needs."""
    with FileProgress() as tick:
        sweep = tables.load(directory, on_file=tick)
    for warning in sweep.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not sweep.points:
        raise HpcbenchError(f"{directory}: no complete point files to {purpose}")
    return sweep
