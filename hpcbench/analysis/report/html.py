"""The sweep report: SWEEP_DIR/report.html (one self-contained page: interactive plotly figures,
plotly.js embedded once, so it opens offline), each figure's data as figure_NAME.csv beside it,
report.md and CSV tables (points, stats, repeats, predictions, held_out, evaluations, layouts, and the
stragglers').
Rows and figure labels name what tells points apart where the shown columns do not
(hpcbench.spec.labels); an accuracy on synthetic data reads as such (analysis/accuracy.py)."""

from __future__ import annotations

import dataclasses
import datetime
import html
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hpcbench.analysis import accuracy, energy, metrics, workload
from hpcbench.analysis.pipeline import Analysis
from hpcbench.analysis.report import figures as figures  # registers the figures, in page order
from hpcbench.analysis.report import layouts as layouts  # registers the layouts' figure after them
from hpcbench.analysis.report import notes as note_list
from hpcbench.analysis.report import stragglers as straggler_report  # registers the straggler figures after them
from hpcbench.analysis.report.columns import (
    ACCURACY,
    COLLECTIVES,
    COLLECTIVES_ABOUT,
    DIFFERS,
    ENERGY,
    ENERGY_ABOUT,
    HELD_OUT,
    LAYOUTS,
    LAYOUTS_ABOUT,
    PHASE_TABLE,
    PREDICTION,
    REPEATS,
    SCALING,
    SEED002,
    SERIES_SAME,
    WORKLOAD,
    WORKLOAD_ABOUT,
    Column,
)
from hpcbench.analysis.report.plot import FIGURES, Plot, csv_name, figure_html, plotly_js, slug
from hpcbench.spec import Point, differing
from hpcbench.sweepdir.atomic import write_text_atomic


def _shown(env: bool) -> Callable[[Point], Hashable]:
    """The key of what IDENT (and env, where shown) shows of a point."""

    def key(p: Point) -> Hashable:
        return (p.framework, p.backend, p.env if env else None, p.model, p.ranks, p.batch_size)

    return key


def _series_key(p: Point) -> Hashable:
    return (p.framework, p.backend, p.model, p.batch_size)


def labelled(analysis: Analysis) -> pd.DataFrame:
    """The stats table with what the report's tables and figures show beside it: `differs`
    (what tells a point apart, '' where framework, backend, model, N and batch do), `series`
    (what tells a vs-N line apart: the same, but not across N and repeats), `dataset`, and
    `chance` (the accuracy of guessing, 1 / classes)."""
    stats = analysis.stats.copy()
    if stats.empty or "point" not in stats:
        return stats
    points = analysis.specs  # the points' fields, without reading their files again
    ids = {p.id: pid for pid, p in points.items()}
    env = metrics.names_environments(stats)
    differs = {ids[k]: v for k, v in differing(points.values(), _shown(env)).items()}
    series = {ids[k]: v for k, v in differing(points.values(), _series_key, SERIES_SAME).items()}
    stats["differs"] = [differs.get(pid, "") for pid in stats["point"]]
    stats["series"] = [series.get(pid, "") for pid in stats["point"]]
    stats["dataset"] = [points[pid].dataset if pid in points else "" for pid in stats["point"]]
    stats["chance"] = [(accuracy.chance(points[pid]) or np.nan) if pid in points else np.nan for pid in stats["point"]]
    return stats


def _tested(evaluations: pd.DataFrame) -> dict[str, float]:
    """Samples tested in each point's last evaluation (all ranks' shards)."""
    if evaluations.empty or "point" not in evaluations:
        return {}
    return {str(k): float(v) for k, v in evaluations.groupby("point", sort=False)["total"].last().items()}


def readable(analysis: Analysis, stats: pd.DataFrame) -> pd.DataFrame:
    """`stats` (labelled) as the tables show it: an accuracy on synthetic data labelled so, and
    as chance where it is not clearly above chance (accuracy.reading)."""
    if stats.empty or "point" not in stats:
        return stats
    points = analysis.specs  # the points' fields, without reading their files again
    tested = _tested(analysis.evaluations)
    shown = stats.copy()
    for column in ("accuracy", "best_accuracy"):
        if column in shown:
            shown[column] = [
                accuracy.reading(float(value), points[pid], tested.get(pid, 0.0)) if pid in points else value
                for pid, value in zip(shown["point"], shown[column], strict=True)
            ]
    return shown


def _with_differs(columns: Sequence[Column], table: pd.DataFrame) -> Sequence[Column]:
    """`columns` with DIFFERS after the batch size, where some row needs it."""
    if "differs" not in table or not (table["differs"].astype(str) != "").any():
        return columns
    keys = [c.key for c in columns]
    at = keys.index("batch_size") + 1 if "batch_size" in keys else len(columns)
    return [*columns[:at], DIFFERS, *columns[at:]]


def _differs_by_point(table: pd.DataFrame, stats: pd.DataFrame) -> pd.DataFrame:
    """A table keyed by point with the stats' `differs` column joined."""
    if table.empty or "point" not in table or "differs" not in stats:
        return table
    found = dict(zip(stats["point"], stats["differs"], strict=True))
    return table.assign(differs=[found.get(pid, "") for pid in table["point"]])


def _differs_by_config(repeats: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """The repeats table with what tells each configuration apart (seed aside)."""
    if repeats.empty or "config" not in repeats:
        return repeats
    configs = {}
    for point in analysis.specs.values():
        config = dataclasses.replace(point, seed=0)
        configs[config.id] = config
    found = differing(configs.values(), lambda p: (p.framework, p.backend, p.model, p.ranks, p.batch_size))
    return repeats.assign(differs=[found.get(str(c), "") for c in repeats["config"]])


def cells(table: pd.DataFrame, columns: Sequence[Column]) -> tuple[list[str], list[list[str]]]:
    present = [c for c in columns if c.key in table]
    rows = [[c.fmt(rec[c.key]) for c in present] for rec in table.to_dict("records")]
    return [c.title for c in present], rows


def html_table(table: pd.DataFrame, columns: Sequence[Column]) -> str:
    head, rows = cells(table, columns)
    out = ["<table><thead><tr>", *(f"<th>{html.escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(table: pd.DataFrame, columns: Sequence[Column]) -> str:
    head, rows = cells(table, columns)
    lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 110em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f0f0f0; }
td:first-child { font-family: monospace; }
.note { color: #8a5300; }
.missing { color: #666; font-style: italic; }
.figure { margin: 0.5em 0 1.5em; }
.figure .data { font-size: 0.85em; }
.notes details { display: inline; margin-left: 0.5em; color: #333; }
.notes details[open] { display: block; }
.notes table td { text-align: left; font-family: sans-serif; }
"""


@dataclass(frozen=True)
class Section:
    title: str
    columns: Sequence[Column]
    table: pd.DataFrame
    about: str = ""


def _with_env(columns: Sequence[Column], stats: pd.DataFrame) -> Sequence[Column]:
    """`columns` with the point's environment after its backend, when some point names one."""
    if not metrics.names_environments(stats):
        return columns
    at = [c.key for c in columns].index("backend") + 1
    return [*columns[:at], Column("env", "env"), *columns[at:]]


def sections(analysis: Analysis) -> list[Section]:
    stats = labelled(analysis)
    shown = readable(analysis, stats)
    has_accuracy = "evaluations" in stats and bool((stats["evaluations"] > 0).any())
    scaling, phases, seed002, accuracy_cols = (
        _with_differs(_with_env(c, stats), stats) for c in (SCALING, PHASE_TABLE, SEED002, ACCURACY)
    )
    predictions = _differs_by_point(analysis.predictions, stats)
    held_out = _differs_by_point(analysis.held_out, stats)
    repeats = _differs_by_config(analysis.repeats, analysis)
    out = [
        Section("Scaling", scaling, shown, "t_iter: median over timed iterations of the ranks' mean iteration time. "
                "Efficiency is weak (same per-rank batch) or strong (same global batch) as labelled."),
        Section("Phases", phases, shown, "Mean seconds per iteration over ranks and timed iterations."),
        Section("Training time, testing time, accuracy, CPU and memory", seed002, shown,
                "As in Wu et al.'s tables: CPU % of the node (sysstat), memory = RSS per rank. " + ACCURACY_ABOUT),
        Section("Performance model: predicted beside measured", _with_differs(PREDICTION, predictions), predictions,
                "Fitted on each configuration's smallest runs (calibration rows, in-sample) and predicted for the "
                "others; error = (predicted − measured) / measured."),
        Section("Performance model: each scale predicted without it (leave one scale out)",
                _with_differs(HELD_OUT, held_out), held_out, "Configurations measured at 3 or more scales, "
                "calibrated without the held-out scale. The miss (measured − predicted) split by phase: compute, "
                "time in the exchange after backward, time in no phase."),
        Section("Repeats (seeds): mean and 95 % confidence interval", _with_differs(REPEATS, repeats), repeats),
    ]  # fmt: skip
    # why it is slow: stragglers, what-if, hosts, buckets (straggler_report.py)
    out += [Section(title, [Column(*c) for c in cols], table, about)
            for title, cols, table, about in straggler_report.sections(analysis.slow)]  # fmt: skip
    if has_accuracy:
        out.insert(3, Section("Accuracy and time to accuracy", accuracy_cols, shown, ACCURACY_ABOUT))
    if workload.has_tokens(stats) or ("mfu" in stats and bool(stats["mfu"].notna().any())):
        columns = _with_differs(_with_env(WORKLOAD, stats), stats)
        out.insert(1, Section("Tokens, model FLOPs, MFU and memory", columns, shown, WORKLOAD_ABOUT))
    if energy.measured(stats):
        out.insert(1, Section("Energy", _with_differs(_with_env(ENERGY, stats), stats), shown, ENERGY_ABOUT))
    if not analysis.collectives.empty:  # where some point runs a parallel layout (analysis/collectives.py)
        at = next(i for i, section in enumerate(out) if section.title == "Phases") + 1
        out.insert(at, Section("Collectives per mesh axis", COLLECTIVES, analysis.collectives, COLLECTIVES_ABOUT))
    if not analysis.layouts.empty:  # points that differ only in their layout (analysis/layouts_measured.py)
        at = next(i for i, section in enumerate(out) if section.title.startswith("Performance model"))
        out.insert(at, Section("Parallel layouts: measured beside predicted", LAYOUTS, analysis.layouts, LAYOUTS_ABOUT))
    return out


def notes(analysis: Analysis) -> list[str]:
    """The report's notes: the files skipped, the numbers not to trust, and why there is no
    energy where no point has it (one line)."""
    why = energy.sweep_note(analysis.stats)
    return [*analysis.warnings, *analysis.notes, *([why] if why else [])]


ACCURACY_ABOUT = (
    "Accuracy on synthetic data (random images around one prototype per class) is labelled so, and called "
    "chance where it is not clearly above guessing (1 / classes): it says nothing of a real task."
)


Drawn = list[tuple[str, Plot | None]]  # (title, the figure or None where the sweep has no data for it)


def draw(analysis: Analysis) -> Drawn:
    """Every registered figure (plot.FIGURES) drawn from the analysis, in page order."""
    stats = labelled(analysis)
    return [(title, make(analysis, stats)) for title, make in FIGURES]


def figure_files() -> list[str]:
    """The files holding the figures' data, beside report.html."""
    return [csv_name(title) for title, _ in FIGURES]


def _figure(title: str, plot: Plot | None) -> str:
    head = f'<div class="figure" data-title="{html.escape(title)}"><h3>{html.escape(title)}</h3>'
    if plot is None:
        return head + '<p class="missing">No data for this figure in this sweep.</p></div>'
    link = f'<p class="data">Data: <a href="{csv_name(title)}">{csv_name(title)}</a></p>'
    return head + figure_html(plot, f"figure_{slug(title)}") + link + "</div>"


def render_html(analysis: Analysis, drawn: Drawn) -> str:
    title = f"hpcbench report: {analysis.directory.name}"
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<link rel="icon" href="data:,">',  # no favicon request: the page needs nothing outside itself
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *(f'<p class="headline">{html.escape(line)}</p>' for line in analysis.headlines),
        f"<p>{len(analysis.stats)} points from {html.escape(str(analysis.directory))}, written {created}.</p>",
    ]
    if said := notes(analysis):
        out += ["<h2>Notes</h2>", *note_list.render(said)]
    out.append("<h2>Figures</h2>")
    out += [_figure(name, plot) for name, plot in drawn]
    for section in sections(analysis):
        out.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.about:
            out.append(f"<p>{html.escape(section.about)}</p>")
        out.append(html_table(section.table, section.columns))
    if any(p is not None for _, p in drawn):
        out.append(plotly_js())  # last: run once the page has loaded (plot.DRAW)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def render_markdown(analysis: Analysis, drawn: Sequence[tuple[str, object | None]]) -> str:
    out = [f"# hpcbench report: {analysis.directory.name}", "", f"{len(analysis.stats)} points.", ""]
    out += [f"**{_md_cell(line)}**\n" for line in analysis.headlines]
    for note in notes(analysis):
        out.append(f"- note: {_md_cell(note)}")
    missing = [name for name, plot in drawn if plot is None]
    if missing:
        out += ["", "Figures left out (no data): " + ", ".join(missing) + "."]
    for section in sections(analysis):
        out += ["", f"## {section.title}", ""]
        if section.about:
            out += [section.about, ""]
        out.append(markdown_table(section.table, section.columns))
    return "\n".join(out) + "\n"


CSV_TABLES = ("points", "stats", "repeats", "predictions", "held_out", "evaluations", "layouts")


def write_report(analysis: Analysis) -> list[Path]:
    """Write report.html, report.md, the CSV tables and each figure's data (figure_NAME.csv,
    empty for a figure without data) into the sweep directory; returns the paths."""
    drawn = draw(analysis)
    directory = analysis.directory
    written = []
    for name in CSV_TABLES:
        path = directory / f"{name}.csv"
        write_text_atomic(path, getattr(analysis, name).to_csv(index=False))
        written.append(path)
    written += straggler_report.write_tables(analysis.slow, directory)  # stragglers, hosts, whatif, buckets
    for title, plot in drawn:  # a figure without data: an empty file (no earlier report's left behind)
        path = directory / csv_name(title)
        write_text_atomic(path, plot.data.to_csv(index=False) if plot is not None else "")
        written.append(path)
    md = directory / "report.md"
    write_text_atomic(md, render_markdown(analysis, drawn))
    page = directory / "report.html"
    write_text_atomic(page, render_html(analysis, drawn))
    return [page, md, *written]
