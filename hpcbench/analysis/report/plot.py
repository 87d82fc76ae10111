"""What every report figure shares: `Plot` (a plotly figure and the table it draws, written
beside the report as CSV), the registry of figures, hover text naming a point's configuration
and id, and lines against N, split into panels by model where there are many of them.

Plotly draws in the browser: the page embeds plotly.js once (html.py), each figure is a <div>
with its data, so zoom, hover and toggling a series by its legend entry need no network."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go  # type: ignore[import-untyped]
from plotly.subplots import make_subplots  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from hpcbench.analysis.pipeline import Analysis

SERIES = ["framework", "backend", "model", "batch_size"]
FACET_OVER = 6  # lines of one figure: more, and it is split into a panel per model
PANEL_HEIGHT = 320  # px per row of panels
BAR_HEIGHT = 22  # px per bar of a horizontal-bar figure
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354",
)  # fmt: skip
HOVER = "%{customdata[0]}<br>point %{customdata[1]}<br>"  # the configuration, then the point id(s)


@dataclass(frozen=True)
class Plot:
    """A drawn figure and the tidy table it draws (its CSV beside the report)."""

    figure: go.Figure
    data: pd.DataFrame


Draw = Callable[["Analysis", pd.DataFrame], Plot | None]  # (analysis, labelled stats) -> the figure or None
FIGURES: list[tuple[str, Draw]] = []  # (title, draw), in page order


def figure(title: str) -> Callable[[Draw], Draw]:
    """Register a figure of the report under `title` (its heading, and its CSV's name)."""

    def register(draw: Draw) -> Draw:
        FIGURES.append((title, draw))
        return draw

    return register


def slug(title: str) -> str:
    """`title` as a file-name part: 'Throughput vs ranks' -> 'throughput_vs_ranks'."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def csv_name(title: str) -> str:
    """The file beside report.html holding the figure's data."""
    return f"figure_{slug(title)}.csv"


def also(row: pd.Series, column: str) -> str:
    """A row's text in `column` (report/html.py's `differs`, `series`), '' where it has none."""
    value = row.get(column, "")
    return f" {value}" if isinstance(value, str) and value else ""


def point_label(row: pd.Series) -> str:
    """A point's label; with the table's `differs` column (report/html.py), what tells it apart
    from points of the same framework, backend, model, N and batch."""
    base = f"{row['framework']}/{row['backend']} {row['model']} N={int(row['ranks'])} b={int(row['batch_size'])}"
    return base + also(row, "differs")


def series(table: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """Lines of a vs-N plot: one per framework, backend, model and batch (and, with the table's
    `series` column, whatever else tells configurations apart), mean over repeats; each line's
    `points` column names the points (repeats) of each of its N."""
    keys = [*SERIES, "series"] if "series" in table else SERIES
    for key, group in table.groupby(keys, sort=True):
        framework, backend, model, batch = key[:4]
        also = f" {key[4]}" if len(key) > 4 and key[4] else ""
        line = group.groupby("ranks", as_index=False).mean(numeric_only=True)
        ids = group.groupby("ranks")["point"].agg(lambda s: ", ".join(map(str, s)))
        line["points"] = [ids[n] for n in line["ranks"]]
        for column in ("framework", "backend", "model"):
            line[column] = str(group[column].iloc[0])
        yield f"{framework}/{backend} {model} b={batch}{also}", line


def hover_data(labels: Sequence[str], points: Sequence[str]) -> np.ndarray:
    """customdata for HOVER: (configuration, point ids) per mark."""
    return np.column_stack([np.asarray(labels, dtype=object), np.asarray(points, dtype=object)])


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def ms_bar(ids: Sequence[str], ms: Any, name: str, i: int, custom: np.ndarray) -> go.Bar:
    """One series of horizontal bars in milliseconds, a bar per point, hovered as `name: x ms`."""
    return go.Bar(
        y=ids,
        x=ms,
        orientation="h",
        name=name,
        marker={"color": color(i)},
        customdata=custom,
        hovertemplate=HOVER + f"{name}: %{{x:.3g}} ms<extra></extra>",
    )


def legend_outside(fig: go.Figure, below: bool = False) -> None:
    """The legend beside the plot (right), or above it for stacked parts: never over data."""
    if below:
        fig.update_layout(
            legend={
                "orientation": "h",
                "x": 0,
                "xanchor": "left",
                "y": 1.0,
                "yanchor": "bottom",
                "traceorder": "normal",
            }
        )
    else:
        fig.update_layout(legend={"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top", "groupclick": "toggleitem"})
        if fig.layout.barmode == "stack":  # parts listed in the order drawn, not stacked bars' reversed order
            fig.update_layout(legend_traceorder="normal")


def finish(fig: go.Figure, title: str, height: int, below: bool = False) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left"},
        height=height,
        template="plotly_white",
        hoverlabel={"align": "left"},
        margin={"l": 70, "r": 20, "t": 90 if below else 60, "b": 60},
    )
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)  # long labels (configurations, axis titles) widen the margin, never cut
    legend_outside(fig, below)
    return fig


@dataclass(frozen=True)
class Panel:
    column: str  # the stats column drawn
    title: str  # the panel's y-axis label
    scale: float = 1.0  # shown = value × scale (e.g. 100 for %)


FACET_BY = ("model", "framework", "batch_size")  # the first that tells lines apart splits a crowded figure


def _facets(lines: list[tuple[str, pd.DataFrame]]) -> tuple[str, list[str]]:
    """The column that splits a figure of more than FACET_OVER lines into panels, and its values."""
    if len(lines) > FACET_OVER:
        for key in FACET_BY:
            values = sorted({_facet_value(line, key) for _, line in lines})
            if len(values) > 1:
                return key, values
    return "", [""]


def _facet_value(line: pd.DataFrame, key: str) -> str:
    value = line[key].iloc[0]
    return f"b={int(value)}" if key == "batch_size" else str(value)


def lines_vs_ranks(table: pd.DataFrame, panels: Sequence[Panel], title: str, ideal: float | None = None) -> Plot | None:
    """Each series' `panels` columns against N (log2 axis), a line per series, toggled by
    framework/backend in the legend. More than FACET_OVER lines are split into a panel per
    model (or, all of one model, per framework; else per batch): two panels a row for one
    column, a row of panels (one per column) for several."""
    columns = [p.column for p in panels]
    present = [c for c in columns if c in table]
    if not present:
        return None
    data: pd.DataFrame = table[finite(table[present]).any(axis=1)]
    if data.empty:
        return None
    lines = list(series(data))
    key, facets = _facets(lines)
    across = min(2, len(facets)) if len(panels) == 1 else len(panels)
    rows = -(-len(facets) // across) if len(panels) == 1 else len(facets)

    def cell(facet: int, panel: int) -> tuple[int, int]:
        return (facet // across + 1, facet % across + 1) if len(panels) == 1 else (facet + 1, panel + 1)

    names = [": ".join(x for x in (f, p.title if len(panels) > 1 else "") if x) for f in facets for p in panels]
    fig = make_subplots(
        rows=rows, cols=across, vertical_spacing=min(0.1, 0.35 / rows), horizontal_spacing=0.08,
        subplot_titles=names if any(names) else None,
    )  # fmt: skip
    tidy = []
    for i, (label, line) in enumerate(lines):
        facet = facets.index(_facet_value(line, key)) if key else 0
        group = f"{line['framework'].iloc[0]}/{line['backend'].iloc[0]}"
        custom = hover_data([label] * len(line), list(line["points"]))
        for j, panel in enumerate(panels):
            if panel.column not in line:
                continue
            row, col = cell(facet, j)
            fig.add_trace(
                go.Scatter(
                    x=line["ranks"], y=line[panel.column] * panel.scale, mode="lines+markers", name=label,
                    legendgroup=group, legendgrouptitle={"text": group}, showlegend=j == 0,
                    line={"color": color(i)}, customdata=custom,
                    hovertemplate=HOVER + f"N=%{{x}}<br>{panel.title}: %{{y:.4g}}<extra></extra>",
                ),
                row=row, col=col,
            )  # fmt: skip
        tidy.append(line[["ranks", *[c for c in columns if c in line], "points"]].assign(series=label))
    ranks = sorted({int(n) for n in data["ranks"]})
    fig.update_xaxes(type="log", tickvals=ranks, ticktext=[str(n) for n in ranks])
    fig.update_xaxes(title_text="ranks N", row=rows)
    for facet in range(len(facets)):
        for j, panel in enumerate(panels):
            row, col = cell(facet, j)
            fig.update_yaxes(title_text=panel.title, row=row, col=col)
            if ideal is not None:
                fig.add_hline(y=ideal, line={"color": "grey", "dash": "dot", "width": 1}, row=row, col=col)
    finish(fig, title, 100 + PANEL_HEIGHT * rows)
    table_out = pd.concat(tidy, ignore_index=True)
    return Plot(fig, table_out[["series", *[c for c in table_out.columns if c != "series"]]])


def finite(table: pd.DataFrame) -> pd.DataFrame:
    """True where a cell is a finite number."""
    return table.astype(float).apply(np.isfinite)


def bars_height(n: int) -> int:
    return max(260, 140 + BAR_HEIGHT * n)


def label_bars(fig: go.Figure, ids: Sequence[str], labels: Sequence[str]) -> None:
    """Horizontal bars placed by point id (unique), each named by its configuration, top down."""
    fig.update_yaxes(autorange="reversed", type="category", tickmode="array", tickvals=list(ids), ticktext=list(labels))


def figure_html(plot: Plot, div_id: str) -> str:
    """The figure as an empty <div> and its data and layout as JSON; DRAW (once per page) draws it."""
    spec = plot.figure.to_json(validate=False, engine="json").replace("</", "<\\/")  # safe inside <script>
    height = int(plot.figure.layout.height or 450)
    return (
        f'<div id="{div_id}" class="plot" style="height:{height}px"></div>'
        f'<script type="application/json" data-plot="{div_id}">{spec}</script>'
    )


# plotly.js is held as text and run once the page has loaded (its 1.5 MB take a slow
# machine's main thread seconds to compile: the page, its headlines, notes and tables show
# before that), then the figures are drawn one per task in page order, so the page scrolls
# meanwhile; window.reportDrawn holds the ms from navigation start to the last figure drawn.
DRAW = """
(function () {
  const config = {displaylogo: false, responsive: true};
  let plots = [];
  function next(i) {
    if (i >= plots.length) { window.reportDrawn = performance.now(); return; }
    const div = plots[i];
    const spec = JSON.parse(document.querySelector('script[data-plot="' + div.id + '"]').textContent);
    Plotly.newPlot(div, spec.data, spec.layout, config).then(() => setTimeout(next, 0, i + 1));
  }
  function start() {
    const code = document.createElement("script");  // inline: nothing is requested
    code.textContent = document.getElementById("plotly-js").textContent;
    document.head.appendChild(code);
    plots = Array.from(document.querySelectorAll("div.plot"));
    next(0);
  }
  window.addEventListener("load", () => setTimeout(start, 0));
})();
"""


PLOTLY_JS = Path(__file__).with_name("vendor") / "plotly-cartesian.min.js"  # see vendor/README.md


def plotly_js_version() -> str:
    """The version of the plotly.js the report embeds (from the bundle's own header)."""
    with PLOTLY_JS.open(encoding="utf-8") as f:
        head = f.read(200)
    found = re.search(r"plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)", head)
    if found is None:
        raise ValueError(f"{PLOTLY_JS}: no plotly.js version in its header")
    return found.group(1)


def plotly_js() -> str:
    """plotly.js's cartesian bundle, embedded once per page (the report opens offline) as text
    that DRAW runs once the page has loaded, and DRAW."""
    code = PLOTLY_JS.read_text(encoding="utf-8")
    return f'<script type="text/plain" id="plotly-js">{code}</script>\n<script>{DRAW}</script>'
