"""`hpcbench predict`: the performance model as a command.

    hpcbench predict FILE.yaml [--csv OUT.csv]           from your own numbers (no trace needed)
    hpcbench predict SWEEP_DIR --nodes 8,16,32 [--csv]   a measured sweep at other node counts
    hpcbench predict TABLE.yaml [--csv OUT.csv]          a published table (hpcbench/analysis/published/):
                                                         every cell predicted beside its published value

The file's format is hpcbench.analysis.model.forecast_spec's (docs/metrics-and-model.md has a
worked example). The table gives, per node count, ranks, predicted t_iter, throughput,
efficiency and exposed communication, with and without overlap; `--csv` writes the columns
`nodes, ranks, t_iter_s, throughput, efficiency, exposed_comm_s` and the rest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import pandas as pd

from hpcbench.analysis.model import forecast, forecast_spec
from hpcbench.analysis import published
from hpcbench.cli import failure, textable
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parse_yaml
from hpcbench.sweepdir.atomic import write_text_atomic

PROG = "hpcbench predict"


def _nodes(text: str) -> list[int]:
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of node counts, e.g. 8,16,32") from None
    if not nodes or any(n < 1 for n in nodes):
        raise argparse.ArgumentTypeError(f"{text!r}: node counts must be positive integers, e.g. 8,16,32")
    return nodes


def _render(table: pd.DataFrame, overlap_too: bool) -> str:
    head = ["nodes", "ranks", "t_iter ms", "samples/s", "efficiency", "exposed comm ms"]
    if overlap_too:
        head += ["no overlap: t_iter ms", "samples/s", "efficiency"]
    rows = [head]
    for r in table.to_dict("records"):
        row = [str(r["nodes"]), str(r["ranks"]), f"{r['t_iter_s'] * 1e3:.2f}", f"{r['throughput']:,.1f}",
               f"{r['efficiency']:.1%}", f"{r['exposed_comm_s'] * 1e3:.2f}"]  # fmt: skip
        if overlap_too:
            row += [f"{r['t_iter_no_overlap_s'] * 1e3:.2f}", f"{r['throughput_no_overlap']:,.1f}",
                    f"{r['efficiency_no_overlap']:.1%}"]  # fmt: skip
        rows.append(row)
    return textable.render(rows, right=True)


def _is_published(target: Path) -> bool:
    try:
        return published.is_table(parse_yaml(target.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, HpcbenchError):
        return False  # the prediction file's own reading reports it


def _published(table: published.Table, out: TextIO) -> pd.DataFrame:
    print(f"{table.name}: {table.metric}; {table.source}", file=out)
    rows = [["column", "GPUs", "nodes x GPUs", "published", "predicted", "error"]]
    for c in table.cells:
        rows.append([c.column, str(c.gpus), f"{c.nodes} x {c.ranks_per_node}", f"{c.published:,.1f}",
                     f"{c.predicted:,.1f}", f"{c.error:+.1%}"])  # fmt: skip
    print(textable.render(rows, right=True), file=out)
    print(f"mean |error| {table.mean_abs_error:.1%}, max |error| {table.max_abs_error:.1%} "
          f"over {len(table.cells)} cells (each column's first cell is its input)", file=out)  # fmt: skip
    return pd.DataFrame(
        [{"column": c.column, "gpus": c.gpus, "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
          "published": c.published, "predicted": c.predicted, "error": c.error} for c in table.cells]
    )  # fmt: skip


def run(target: Path, nodes: list[int] | None, csv: Path | None, out: TextIO) -> int:
    if target.is_dir():
        if nodes is None:
            raise SpecError("--nodes", f"{target} is a sweep directory: say at which node counts", "e.g. 8,16,32")
        table = forecast.extrapolate(target, nodes)
        for config, group in table.groupby(["framework", "backend", "model", "batch_size"], sort=False):
            framework, backend, model, batch = config
            print(f"{framework}/{backend} {model} b={batch}: link from {group['comm_source'].iloc[0]}", file=out)
            print(_render(group, overlap_too=False), file=out)
    elif _is_published(target):
        if nodes is not None:
            raise SpecError("--nodes", "goes with a sweep directory; a published table lists its own cells")
        table = _published(published.load(target), out)
    else:
        if nodes is not None:
            raise SpecError("--nodes", "goes with a sweep directory; a prediction file lists its own nodes")
        spec = forecast_spec.load(str(target))
        table = forecast.forecast(spec)
        print(f"{spec.name}: batch {spec.batch_size} per rank, {spec.ranks_per_node} ranks per node, "
              f"{spec.algorithm} all-reduce", file=out)  # fmt: skip
        for note in spec.link_notes:
            print(f"link {note}", file=out)
        print(_render(table, overlap_too=True), file=out)
    if csv is not None:
        write_text_atomic(csv, table.to_csv(index=False))
        print(f"wrote {csv}", file=out)
    return 0


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog or PROG, description="Predict iteration time, throughput and efficiency.")
    p.add_argument("target", help="a prediction file (YAML) or a sweep directory")
    p.add_argument("--nodes", type=_nodes, help="with a sweep directory: node counts to predict, e.g. 8,16,32")
    p.add_argument("--csv", type=Path, help="also write the table as CSV")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    try:
        return run(Path(args.target), args.nodes, args.csv, out)
    except HpcbenchError as exc:
        return failure.report(exc, prog or PROG, args.verbose)
