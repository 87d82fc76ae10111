"""`hpcbench predict`: the performance model as a command.

    hpcbench predict FILE.yaml [--csv OUT.csv [--force]] from your own numbers (no trace needed)
    hpcbench predict SWEEP_DIR --nodes 8,16,32 [--csv]   a measured sweep at other node counts
    hpcbench predict TABLE.yaml [--csv OUT.csv]          a published table (hpcbench/analysis/published/):
                                                         every cell predicted beside its published value
    hpcbench predict FILE.yaml --layouts [--csv]         a transformer's parallel layouts (dp x fsdp x tp x
                                                         pp) on each node count, ranked (model/layouts.py)

The file's format is hpcbench.analysis.model.forecast_spec's (docs/metrics-and-model.md has a
worked example). The table gives, per node count, ranks, predicted t_iter, throughput,
efficiency and exposed communication, with and without overlap; `--csv` writes the columns
`nodes, ranks, t_iter_s, throughput, efficiency, exposed_comm_s` and the rest: a new file
(`--force` replaces one), never the input nor a sweep's own file (hpcbench.sweepdir.outputs).
Exit status 0, or 2 with one line on stderr for bad input (nothing is written then).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import pandas as pd

from hpcbench.analysis import published, tables
from hpcbench.analysis.model import forecast, forecast_spec, layouts
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.cli import failure, textable
from hpcbench.cli.analyze import load_sweep
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import parse_yaml
from hpcbench.sweepdir.outputs import OutputFile

PROG = "hpcbench predict"
WANTED = "give a prediction file (YAML), a published table, or a sweep directory with --nodes"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


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


def _read_text(target: Path) -> str:
    """A prediction or table file's text; bad input (missing, not a regular file, HDF5, not UTF-8) is named."""
    if not target.exists():
        raise HpcbenchError(f"{target}: no such file or directory; {WANTED}")
    if not target.is_file():
        raise HpcbenchError(f"{target}: not a regular file; {WANTED}")
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise HpcbenchError(f"{target}: cannot be read ({exc.strerror})") from None
    if data.startswith(HDF5_SIGNATURE):
        raise HpcbenchError(f"{target}: an HDF5 file (a point or commbench file), not a prediction file; {WANTED}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HpcbenchError(f"{target}: not a text file (byte {exc.start} is not UTF-8); {WANTED}") from None


def _sweep_points(target: Path) -> None:
    """Refuse a folder without a complete point file; warn of every point file left out, as
    every command names them. (The model reads the sweep again: forecast.extrapolate takes a
    directory.)"""
    if not tables.point_files(target):
        raise HpcbenchError(f"{target}: no point files (<id>.h5): not a sweep directory")
    load_sweep(target, "calibrate on")


def _from_sweep(target: Path, nodes: list[int] | None, out: TextIO, links: Path | None = None) -> pd.DataFrame:
    if nodes is None:
        raise SpecError("--nodes", f"{target} is a directory: a sweep's prediction needs node counts", "e.g. 8,16,32")
    network = forecast_spec.network_link(links) if links is not None else None
    _sweep_points(target)
    table = forecast.extrapolate(target, nodes, network)
    if table.empty:
        raise HpcbenchError(f"{target}: no point file could be read: nothing to calibrate on")
    for config, group in table.groupby(["framework", "backend", "model", "batch_size"], sort=False):
        framework, backend, model, batch = config
        sources = list(dict.fromkeys(group["comm_source"]))
        print(f"{framework}/{backend} {model} b={batch}: link from {'; on 2 nodes or more: '.join(sources)}", file=out)
        print(_render(group, overlap_too=False), file=out)
        notes = (line for note in filter(None, group["note"]) for line in note.splitlines())
        for line in dict.fromkeys(notes):  # one node's link reused; an efficiency above 100 % and why
            print(line, file=out)
    return table


def _from_file(target: Path, nodes: list[int] | None, out: TextIO, with_layouts: bool = False) -> pd.DataFrame:
    text = _read_text(target)
    if published.is_table(parse_yaml(text)):
        if nodes is not None:
            raise SpecError("--nodes", "goes with a sweep directory; a published table lists its own cells")
        if with_layouts:
            raise SpecError("--layouts", "goes with a prediction file; a published table lists its own cells")
        return _published(published.evaluate(parse_yaml(text)), out)
    if nodes is not None:
        raise SpecError("--nodes", "goes with a sweep directory; a prediction file lists its own nodes")
    spec = forecast_spec.parse(text, target.parent)
    if with_layouts:
        return _layouts(spec, out)
    table = forecast.forecast(spec)
    driven = "" if spec.devices_per_rank == 1 else (
        f" driving {spec.devices_per_rank} devices each (batch per device; host work {spec.host_s * 1e3:.2f} ms per "
        "device, done in turn)")  # fmt: skip
    print(f"{spec.name}: batch {spec.batch_size} per rank, {spec.ranks_per_node} ranks per node{driven}, "
          f"{spec.algorithm} all-reduce", file=out)  # fmt: skip
    for note in spec.link_notes:
        print(f"link {note}", file=out)
    print(_render(table, overlap_too=True), file=out)
    return table


def _published(table: published.Table, out: TextIO) -> pd.DataFrame:
    print(f"{table.name}: {table.metric}; {table.source}", file=out)
    rows = [["column", "GPUs", "nodes x GPUs", "published", "predicted", "error"]]
    for c in table.cells:
        rows.append([c.column, str(c.gpus), f"{c.nodes} x {c.gpus_per_node}", f"{c.published:,.1f}",
                     f"{c.predicted:,.1f}", f"{c.error:+.1%}"])  # fmt: skip
    print(textable.render(rows, right=True), file=out)
    print(f"mean |error| {table.mean_abs_error:.1%}, max |error| {table.max_abs_error:.1%} "
          f"over {len(table.cells)} cells (each column's first cell is its input)", file=out)  # fmt: skip
    return pd.DataFrame(
        [{"column": c.column, "gpus": c.gpus, "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
          "devices_per_rank": c.devices_per_rank, "published": c.published, "predicted": c.predicted,
          "error": c.error} for c in table.cells]
    )  # fmt: skip


def _level(spec: forecast_spec.ForecastSpec, name: str) -> LinkCost:
    level: forecast_spec.Level = getattr(spec, name)
    if level.link is None:
        raise SpecError(f"links.{name}", "is given as per-P fits: the layouts' groups need a link per hop",
                        "bandwidth_gbps (+ latency_us), alpha_s + beta_s_per_byte, or from_commbench")  # fmt: skip
    return level.link


def _layouts(spec: forecast_spec.ForecastSpec, out: TextIO) -> pd.DataFrame:
    """Every layout of the spec's transformer on each of its node counts, ranked (layouts.rank)."""
    model = forecast_spec.layout_model(spec)
    if spec.device_memory_gb is None:
        raise SpecError("device_memory_gb", "is missing: --layouts tells the layouts that fit from those that do not",
                        "GiB per device, a number > 0")  # fmt: skip
    if spec.single_rank_s is None and spec.peak_flops is None:
        raise SpecError("single_rank", "is missing and no peak is given: --layouts needs a compute time",
                        "single_rank (measured), or peak_tflops or device (with efficiency)")  # fmt: skip
    job = layouts.Job(model, spec.batch_size, spec.precision, spec.optimizer, spec.flash_attention)
    machine = layouts.Machine(
        spec.ranks_per_node, _level(spec, "intra"), _level(spec, "inter"), spec.device_memory_gb * layouts.GIB,
        spec.nics_per_node, spec.peak_flops, spec.efficiency, spec.single_rank_s,
    )  # fmt: skip
    table = layouts.rank(job, machine, spec.nodes, spec.microbatches, spec.schedules, spec.only)
    if spec.single_rank_s is not None:
        compute = f"compute measured on one rank ({spec.single_rank_s * 1e3:.2f} ms per batch)"
    else:
        peak = (spec.peak_flops or 0.0) / 1e12
        compute = f"compute at {spec.efficiency:.0%} of the {spec.peak_source} ({peak:g} TFLOP/s)"
    print(f"{spec.name}: {model.name}, {model.parameters:,} parameters, seq {model.tokens}, batch {spec.batch_size} "
          f"per data-parallel rank, {spec.precision}, {spec.optimizer}, {spec.device_memory_gb:g} GiB per device; "
          f"{compute}", file=out)  # fmt: skip
    for note in spec.link_notes:
        print(f"link {note}", file=out)
    for nodes, group in table.groupby("nodes", sort=False):
        ranks = int(group["ranks"].iloc[0])
        fit = int(group["fits"].sum())
        print(f"\n{nodes} node(s) x {spec.ranks_per_node} ranks = {ranks} devices: {len(group)} layouts, "
              f"{fit} fit", file=out)  # fmt: skip
        print(_render_layouts(group), file=out)
    if table.empty:
        print("no layout: no node count's ranks can split the model (tp must divide its heads, KV heads and "
              "MLP width; pp at most its blocks)", file=out)  # fmt: skip
    return table


def _render_layouts(table: pd.DataFrame) -> str:
    rows = [["layout", "t_iter ms", "tokens/s", "memory GiB", "exposed comm ms", "bubble", ""]]
    for r in table.to_dict("records"):
        exposed = r["tp_comm_s"] + r["pp_comm_s"] + r["shard_exposed_s"]
        rows.append([r["layout"], f"{r['t_iter_s'] * 1e3:.2f}", f"{r['tokens_per_s']:,.0f}",
                     f"{r['memory_gib']:.2f}", f"{exposed * 1e3:.2f}", f"{r['bubble']:.0%}",
                     "" if r["fits"] else "out of memory"])  # fmt: skip
    return textable.render(rows, right=True)


def _predict(
    target: Path, nodes: list[int] | None, out: TextIO, with_layouts: bool = False, links: Path | None = None
) -> pd.DataFrame:
    if target.is_dir():
        if with_layouts:
            raise SpecError("--layouts", f"{target} is a directory: layouts are predicted from a prediction file",
                            "a YAML file with model, batch_size, device_memory_gb, ...")  # fmt: skip
        return _from_sweep(target, nodes, out, links)
    if links is not None:
        raise SpecError(
            "--links", f"{target} is a file: its own links: section states its links", "--links with a sweep directory"
        )
    return _from_file(target, nodes, out, with_layouts)


def run(
    target: Path,
    nodes: list[int] | None,
    csv: Path | None,
    out: TextIO,
    force: bool = False,
    with_layouts: bool = False,
    links: Path | None = None,
) -> int:
    if csv is None:
        _predict(target, nodes, out, with_layouts, links)
        return 0
    with OutputFile(csv, option="--csv", force=force, reads=[target]) as output:  # checked before any work
        table = _predict(target, nodes, out, with_layouts, links)
        output.write_text(table.to_csv(index=False))
    print(f"wrote {csv}", file=out)
    return 0


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog or PROG, description="Predict iteration time, throughput and efficiency.")
    p.add_argument("target", help="a prediction file (YAML) or a sweep directory")
    p.add_argument("--nodes", type=_nodes, help="with a sweep directory: node counts to predict, e.g. 8,16,32")
    p.add_argument("--csv", type=Path, help="also write the table as CSV (a new file)")
    p.add_argument("--force", action="store_true", help="replace the --csv file if it exists")
    layouts_help = "with a prediction file of a transformer: every dp x fsdp x tp x pp layout, ranked"
    p.add_argument("--layouts", action="store_true", help=layouts_help)
    links_help = "with a sweep directory: the network's link for 2 nodes or more (a YAML of links: inter: ...)"
    p.add_argument("--links", type=Path, help=links_help)
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    return failure.guarded(
        lambda: run(Path(args.target), args.nodes, args.csv, out, args.force, args.layouts, args.links),
        prog or PROG, args.verbose,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
