"""`hpcbench compare`: the same sweep before and after an upgrade; what got slower, by how much,
and whether it is real.

    hpcbench compare BASELINE_DIR NEW_DIR [--metric throughput|tokens_per_s|t_iter] [--threshold 5]
                     [--ignore FIELD ...] [--format text|md|html|csv] [-o FILE [--force]]

Per configuration found in both sweeps: baseline and new value, new / baseline, its 95 %
interval (hierarchical bootstrap, fixed seed) and a verdict; then the configurations found in
only one sweep and the provenance that differs. Exit status: 0 nothing regressed, 1 some
configuration regressed (named on the last line), 2 bad input or nothing to compare (one
line on stderr; nothing is printed or written). `-o FILE` follows the output policy of
hpcbench.sweepdir.outputs: never an input, a sweep's own file or an existing file (unless
`--force`).
The method is hpcbench.analysis.compare's (docs/compare.md).
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hpcbench.analysis import compare as cmp
from hpcbench.cli import failure, textable
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.spec import FIELD_NAMES, Point
from hpcbench.sweepdir.outputs import OutputFile

PROG = "hpcbench compare"
FORMATS = ("text", "md", "html", "csv")
SHOWN_VALUES = 8  # provenance values shown per key before "(+N more)"
EXIT_REGRESSED = failure.PROBLEM


@dataclass(frozen=True)
class Table:
    title: str
    rows: list[list[str]]  # the first is the header


Block = str | Table  # a paragraph or a table


def _value(metric: cmp.Metric, v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v * 1e3:.3f}" if metric.name == "t_iter" else f"{v:,.1f}"


def _unit(metric: cmp.Metric) -> str:
    return "ms" if metric.name == "t_iter" else metric.unit


def _interval(row: cmp.Row) -> str:
    return "-" if math.isnan(row.low) else f"[{row.low:.3f}, {row.high:.3f}]"


def _values(values: tuple[str, ...]) -> str:
    if not values:
        return "(not recorded)"
    more = len(values) - SHOWN_VALUES
    return ", ".join(values[:SHOWN_VALUES]) + (f" (+{more} more)" if more > 0 else "")


def verdict_line(c: cmp.Comparison) -> str:
    bad = c.regressions
    if bad:
        named = "; ".join(f"{c.labels[r.key]} ({r.ratio - 1:+.1%} {c.metric.name})" for r in bad)
        return f"REGRESSED: {len(bad)} of {len(c.rows)} configurations: {named}"
    return (f"no regression: none of {len(c.rows)} configurations is significantly slower by more than "
            f"{c.threshold:g} %")  # fmt: skip


def _row(c: cmp.Comparison, r: cmp.Row) -> list[str]:
    ratio = "-" if math.isnan(r.ratio) else f"{r.ratio:.3f}"
    change = "-" if math.isnan(r.ratio) else f"{r.ratio - 1:+.1%}"
    runs = f"{len(r.baseline_points)}/{len(r.new_points)}"
    return [c.labels[r.key], runs, _value(c.metric, r.baseline), _value(c.metric, r.new), ratio, _interval(r), change,
            r.verdict]  # fmt: skip


def blocks(c: cmp.Comparison) -> list[Block]:
    """The comparison as paragraphs and tables, for every format but CSV."""
    m = c.metric
    direction = "higher" if m.higher_is_better else "lower"
    out: list[Block] = [
        f"{m.name} ({_unit(m)}, {direction} is better): baseline {c.baseline_dir}, new {c.new_dir}",
        "matched on every Point field but: " + "; ".join(f"{k} ({why})" for k, why in c.ignored.items()),
        f"95 % interval of new/baseline: hierarchical bootstrap (repeats, then timed iterations), "
        f"{cmp.N_BOOT} replicates, seed {cmp.SEED}; regression: interval on the slower side of 1 and "
        f"slower by more than {c.threshold:g} %",
    ]
    head = ["configuration", "runs", f"baseline {_unit(m)}", f"new {_unit(m)}", "new/base", "95 % interval",
            "change", "verdict"]  # fmt: skip
    out.append(Table(f"configurations in both sweeps ({len(c.rows)})", [head] + [_row(c, r) for r in c.rows]))
    for title, configs in (("only in baseline", c.only_baseline), ("only in new", c.only_new)):
        if configs:
            listed = [["configuration", "points"]]
            listed += [[c.labels[x.key], " ".join(r.point_id for r in x.runs)] for x in configs]
            out.append(Table(f"{title} ({len(configs)})", listed))
    if c.provenance:
        diffs = [["provenance", "baseline", "new"]]
        diffs += [[d.key, _values(d.baseline), _values(d.new)] for d in c.provenance]
        out.append(Table(f"provenance that differs ({len(c.provenance)} keys)", diffs))
    else:
        out.append("provenance: no recorded difference")
    out += [f"note: {note}" for note in c.notes]
    out += [f"warning: {warning}" for warning in c.warnings]
    out.append(verdict_line(c))
    return out


def render_text(items: Sequence[Block]) -> str:
    parts = []
    for item in items:
        if isinstance(item, Table):
            parts.append(f"\n{item.title}:\n{textable.render(item.rows, indent='  ')}\n")
        else:
            parts.append(item)
    return "\n".join(parts).replace("\n\n\n", "\n\n").strip() + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_md(items: Sequence[Block]) -> str:
    parts = ["# hpcbench compare", ""]
    for item in items:
        if isinstance(item, Table):
            parts += ["", f"## {item.title}", ""]
            parts.append("| " + " | ".join(map(_md_cell, item.rows[0])) + " |")
            parts.append("|" + "|".join(" --- " for _ in item.rows[0]) + "|")
            parts += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in item.rows[1:]]
            parts.append("")
        else:
            parts += [_md_cell(item), ""]
    return "\n".join(parts).replace("\n\n\n", "\n\n").strip() + "\n"


_STYLE = (
    "body{font-family:sans-serif}table{border-collapse:collapse;margin:0.5em 0 1em}"
    "th,td{border:1px solid #bbb;padding:2px 8px;text-align:left}.REGRESSION{background:#fdd}"
)


def render_html(items: Sequence[Block]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', '<head><meta charset="utf-8"><title>hpcbench compare</title>',
             f"<style>{_STYLE}</style></head>", "<body>", "<h1>hpcbench compare</h1>"]  # fmt: skip
    for item in items:
        if isinstance(item, Table):
            parts.append(f"<h2>{e(item.title)}</h2>")
            parts.append("<table>")
            parts.append("<tr>" + "".join(f"<th>{e(cell)}</th>" for cell in item.rows[0]) + "</tr>")
            for row in item.rows[1:]:
                css = ' class="REGRESSION"' if row[-1] == "REGRESSION" else ""
                parts.append(f"<tr{css}>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>")
            parts.append("</table>")
        else:
            parts.append(f"<p>{e(item)}</p>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


CSV_COLUMNS = ["configuration", "status", "metric", "baseline", "new", "ratio", "ci_low", "ci_high", "change_pct",
               "significant", "regressed", "verdict", "baseline_points", "new_points"]  # fmt: skip


def render_csv(c: cmp.Comparison) -> str:
    """One row per configuration (in both sweeps, or in one only), then its Point fields."""
    fields = sorted(FIELD_NAMES - set(c.ignored))

    def row(key: str, point: Point, status: str, **values: object) -> dict[str, object]:
        d = point.as_dict()
        out: dict[str, object] = {"configuration": c.labels[key], "status": status, "metric": c.metric.name}
        out.update(values)
        out.update({f: json.dumps(d[f], sort_keys=True) if isinstance(d[f], dict | list) else d[f] for f in fields})
        return out

    rows = [
        row(
            r.key,
            r.point,
            "matched",
            baseline=r.baseline,
            new=r.new,
            ratio=r.ratio,
            ci_low=r.low,
            ci_high=r.high,
            change_pct=(r.ratio - 1) * 100,
            significant=r.significant,
            regressed=r.regressed,
            verdict=r.verdict,
            baseline_points=" ".join(r.baseline_points),
            new_points=" ".join(r.new_points),
        )
        for r in c.rows
    ]
    for side, configs in (("baseline", c.only_baseline), ("new", c.only_new)):
        for x in configs:
            ids = " ".join(run.point_id for run in x.runs)
            rows.append(row(x.key, x.point, f"only_{side}", **{side: x.value(c.metric), f"{side}_points": ids}))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, [*CSV_COLUMNS, *fields], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def render(c: cmp.Comparison, fmt: str) -> str:
    if fmt == "csv":
        return render_csv(c)
    return {"text": render_text, "md": render_md, "html": render_html}[fmt](blocks(c))


class NothingToCompare(HpcbenchError):
    exit_code = failure.BAD_INPUT


def _disjoint_fields(c: cmp.Comparison) -> list[str]:
    """The Point fields (matched on) whose values in one sweep are none of the other's."""

    def values(configs: list[cmp.Configuration], name: str) -> set[str]:
        return {json.dumps(x.point.as_dict()[name], sort_keys=True) for x in configs}

    fields = sorted(FIELD_NAMES - set(c.ignored))
    return [f for f in fields if not values(c.only_baseline, f) & values(c.only_new, f)]


def nothing_in_common(c: cmp.Comparison) -> NothingToCompare:
    differ = _disjoint_fields(c)
    why = f"; no value in common for {', '.join(differ)}" if differ else ""
    return NothingToCompare(
        f"no configuration is in both sweeps ({len(c.only_baseline)} only in baseline, {len(c.only_new)} only in "
        f"new{why}): compare sweeps of the same spec, or leave fields out of matching with --ignore FIELD"
    )


def _threshold(text: str) -> float:
    """A percentage, "5" or "5%" (its range is checked by the analysis)."""
    try:
        return float(text.strip().removesuffix("%"))
    except ValueError:
        raise SpecError("--threshold", f"{text!r} is not a number", cmp.THRESHOLD_ALLOWED) from None


def _comparison(args: argparse.Namespace) -> cmp.Comparison:
    if args.format not in FORMATS:
        raise SpecError("--format", f"unknown format {args.format!r}", ", ".join(FORMATS))
    threshold = _threshold(args.threshold)
    ignore = [name.strip() for part in args.ignore for name in part.split(",") if name.strip()]
    result = cmp.compare(Path(args.baseline), Path(args.new), args.metric, threshold, ignore)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not result.rows:
        raise nothing_in_common(result)  # before anything is printed or written
    return result


def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.output is None:
        result = _comparison(args)
        out.write(render(result, args.format))
        if args.format == "csv":  # stdout stays one table
            print(verdict_line(result), file=sys.stderr)
    else:
        reads = [Path(args.baseline), Path(args.new)]
        with OutputFile(args.output, option="-o/--output", force=args.force, reads=reads) as output:  # checked first
            result = _comparison(args)
            output.write_text(render(result, args.format))
        print(f"wrote {args.output}", file=out)
        print(verdict_line(result), file=out)
    return EXIT_REGRESSED if result.regressions else failure.OK


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog or PROG, description="Compare two sweeps: what got slower, and is it real.")
    p.add_argument("baseline", metavar="BASELINE_DIR", help="the sweep directory before the change")
    p.add_argument("new", metavar="NEW_DIR", help="the sweep directory after the change")
    p.add_argument("--metric", default="throughput", help=f"{' or '.join(cmp.METRICS)} (default: throughput)")
    p.add_argument("--threshold", default="5", help="percent slower that counts as a regression (default: 5)")
    p.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                   help="a Point field to leave out of matching as well (repeatable, or comma-separated)")  # fmt: skip
    p.add_argument("--format", default="text", help=f"{', '.join(FORMATS)} (default: text)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the comparison to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="with -o: replace FILE if it exists")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    return failure.guarded(lambda: run(args, out), prog or PROG, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
