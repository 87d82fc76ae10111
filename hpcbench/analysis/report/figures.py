"""The report's figures (plotly), each registered in page order from the analysis tables.

Every figure returns a Plot, or None when the tables hold nothing it could show (the report
then says so instead of drawing an empty axis). The straggler figures are in stragglers.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go  # type: ignore[import-untyped]
from plotly.subplots import make_subplots  # type: ignore[import-untyped]

from hpcbench.analysis.metric_table import metric
from hpcbench.analysis.report.plot import (
    FACET_OVER,
    HOVER,
    Panel,
    Plot,
    also,
    bars_height,
    color,
    figure,
    finish,
    finite,
    hover_data,
    label_bars,
    lines_vs_ranks,
    ms_bar,
    point_label,
    series,
)
from hpcbench.store.schema import PHASES

if TYPE_CHECKING:
    from hpcbench.analysis.pipeline import Analysis

_series = series  # the lines of a vs-N figure (tests read them by this name)
__all__ = ["point_label"]


def _metric_vs_ranks(stats: pd.DataFrame, key: str) -> Plot | None:
    """A metric's figure, its axis label and title from the metric table."""
    m = metric(key)
    return lines_vs_ranks(stats, [Panel(m.key, m.formula)], m.title, ideal=1.0 if m.ideal else None)


@figure("Throughput vs ranks")
def throughput(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    return _metric_vs_ranks(stats, "throughput")


@figure("Scaling efficiency vs ranks")
def efficiency(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    return _metric_vs_ranks(stats, "efficiency")


@figure("Energy per sample vs ranks")
def energy_per_sample(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """J/sample against N where some point has its energy (else None: the notes say why)."""
    return _metric_vs_ranks(stats, "energy_per_sample_j")


def _labelled(stats: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Each row's label and point id."""
    return [point_label(r) for _, r in stats.iterrows()], [str(p) for p in stats["point"]]


@figure("Phase breakdown")
def phases(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Stacked horizontal bars: mean milliseconds per phase, and the time in no phase."""
    if stats.empty:
        return None
    labels, ids = _labelled(stats)
    custom = hover_data(labels, ids)
    accounted = stats[[f"{p}_s" for p in PHASES]].sum(axis=1).to_numpy()
    data = pd.DataFrame({"point": ids, "label": labels})
    fig = go.Figure()
    for i, phase in enumerate([*PHASES, "other"]):
        seconds = (
            np.clip(stats["t_iter_s"].to_numpy() - accounted, 0, None)
            if phase == "other"
            else stats[f"{phase}_s"].to_numpy()
        )
        data[f"{phase}_ms"] = seconds * 1e3
        fig.add_trace(ms_bar(ids, seconds * 1e3, phase, i, custom))
    fig.update_layout(barmode="stack")
    label_bars(fig, ids, labels)
    fig.update_xaxes(title_text="ms per iteration (mean over ranks; other = t_iter − phases)")
    return Plot(finish(fig, "Where an iteration's time goes", bars_height(len(ids)), below=True), data)


@figure("Load-imbalance factor")
def lif(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    data = stats[np.isfinite(stats["lif"].astype(float))]
    if data.empty:
        return None
    labels, ids = _labelled(data)
    fig = go.Figure(
        go.Bar(
            y=ids,
            x=data["lif"],
            orientation="h",
            name="LIF",
            marker={"color": "#9467bd"},
            customdata=hover_data(labels, ids),
            hovertemplate=HOVER + "LIF %{x:.3f}<extra></extra>",
        )
    )
    fig.add_vline(x=1.0, line={"color": "grey", "dash": "dot", "width": 1})
    fig.update_xaxes(
        range=[min(0.95, float(data["lif"].min()) - 0.01), float(data["lif"].max()) * 1.02],
        title_text="LIF = mean over iterations of max_r c / mean_r c (1.0 = balanced)",
    )
    label_bars(fig, ids, labels)
    table = pd.DataFrame({"point": ids, "label": labels, "lif": data["lif"].to_numpy()})
    return Plot(finish(fig, "Load-imbalance factor", bars_height(len(ids))), table)


@figure("Communication share")
def comm_share(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """The share of the step with a message in flight, and the share exposed (in flight after
    backward ended), against N (analysis/metrics.py computes both)."""
    panels = [
        Panel(key, f"{metric(key).label} (% of t_iter)", 100.0) for key in ("comm_union_share", "comm_exposed_share")
    ]
    return lines_vs_ranks(stats, panels, "Communication: share of the step in flight, and exposed")


@figure("Resource use")
def resources(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    cols = ["cpu_user", "cpu_system", "cpu_iowait", "mem_avg_mib", "mem_max_mib"]
    data: pd.DataFrame = stats[finite(stats[cols]).any(axis=1)] if set(cols) <= set(stats) else stats.iloc[0:0]
    if data.empty:
        return None
    labels, ids = _labelled(data)
    custom = hover_data(labels, ids)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=["CPU use", "Memory"])
    # (column, name, panel, hover value): CPU shares stacked in the first panel, memory side by side in the second
    bars = [("cpu_user", "%user", 1, "%{x:.1f}"), ("cpu_system", "%system", 1, "%{x:.1f}"),
            ("cpu_iowait", "%iowait", 1, "%{x:.1f}"), ("mem_avg_mib", "RSS avg", 2, "%{x:.0f} MiB"),
            ("mem_max_mib", "RSS max", 2, "%{x:.0f} MiB")]  # fmt: skip
    for i, (col, name, panel, value) in enumerate(bars):
        fig.add_trace(
            go.Bar(
                y=ids,
                x=np.nan_to_num(data[col].to_numpy(dtype=float)),
                orientation="h",
                name=name,
                marker={"color": color(i)},
                customdata=custom,
                offsetgroup=name if panel == 2 else None,
                hovertemplate=HOVER + f"{name}: {value}<extra></extra>",
            ),
            row=1,
            col=panel,
        )
    fig.update_layout(barmode="stack")
    label_bars(fig, ids, labels)
    fig.update_xaxes(title_text="CPU % of the node (sysstat)", row=1, col=1)
    fig.update_xaxes(title_text="RSS per rank (MiB)", row=1, col=2)
    table = data[["point", *cols]].assign(label=labels)
    return Plot(finish(fig, "CPU and memory", bars_height(len(ids))), table)


def _labels_by_point(stats: pd.DataFrame) -> dict[str, str]:
    return {str(r["point"]): point_label(r) for _, r in stats.iterrows()} if "point" in stats else {}


@figure("Predicted vs measured")
def predicted_vs_measured(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    predictions = analysis.predictions
    if predictions.empty or "predicted_t_iter_s" not in predictions:
        return None
    data = predictions[np.isfinite(predictions["predicted_t_iter_s"].astype(float))]
    if data.empty:
        return None
    names = _labels_by_point(stats)
    ids = [str(p) for p in data["point"]]
    custom = hover_data([names.get(p, p) for p in ids], ids)
    measured = data["measured_t_iter_s"].to_numpy(dtype=float) * 1e3
    predicted = data["predicted_t_iter_s"].to_numpy(dtype=float) * 1e3
    serial = data["predicted_no_overlap_s"].to_numpy(dtype=float) * 1e3
    cal = data["calibration"].to_numpy(dtype=bool)
    fig = go.Figure()
    hover = HOVER + "measured %{x:.3g} ms<br>predicted %{y:.3g} ms<extra>%{fullData.name}</extra>"
    for name, y, mask, marker in (
        ("predicted (wait-free backprop)", predicted, ~cal, {"symbol": "circle", "color": color(0)}),
        ("predicted (no overlap)", serial, ~cal, {"symbol": "x", "color": color(1)}),
        ("calibration points", predicted, cal, {"symbol": "square-open", "color": "black"}),
    ):
        fig.add_trace(
            go.Scatter(
                x=measured[mask],
                y=y[mask],
                mode="markers",
                name=name,
                marker=marker,
                customdata=custom[mask],
                hovertemplate=hover,
            )
        )
    hi = float(np.nanmax([measured.max(), predicted.max(), serial.max()])) * 1.1
    fig.add_trace(
        go.Scatter(
            x=[0, hi],
            y=[0, hi],
            mode="lines",
            name="prediction = measurement",
            hoverinfo="skip",
            line={"color": "grey", "dash": "dot", "width": 1},
        )
    )
    fig.update_xaxes(range=[0, hi], title_text="measured t_iter (ms)")
    fig.update_yaxes(range=[0, hi], title_text="predicted t_iter (ms)")
    table = pd.DataFrame(
        {
            "point": ids,
            "label": custom[:, 0],
            "calibration": cal,
            "measured_ms": measured,
            "predicted_wfbp_ms": predicted,
            "predicted_no_overlap_ms": serial,
        }
    )
    return Plot(finish(fig, "Performance model: predicted vs measured", 460), table)


def _line_names(stats: pd.DataFrame) -> dict[str, str]:
    """Each point's vs-N line (plot.series' names): its configuration but N and the repeat."""
    out = {}
    for _, r in stats.iterrows():
        out[str(r["point"])] = (
            f"{r['framework']}/{r['backend']} {r['model']} b={int(r['batch_size'])}{also(r, 'series')}"
        )
    return out


@figure("Accuracy vs training time")
def accuracy_vs_time(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Each point's accuracy at each evaluation; with more than FACET_OVER points, a legend entry
    per configuration (its points' curves one trace, apart), the hover naming the point."""
    evaluations = analysis.evaluations
    data = evaluations[np.isfinite(evaluations["accuracy"].astype(float))] if not evaluations.empty else evaluations
    if data.empty:
        return None
    synthetic = {r["point"] for _, r in stats.iterrows() if r.get("dataset") == "synthetic"}
    names = {p: label + (" (synthetic data)" if p in synthetic else "") for p, label in _labels_by_point(stats).items()}
    curves = [(str(point), group) for point, group in data.groupby("point", sort=True)]
    entry = names if len(curves) <= FACET_OVER else _line_names(stats)
    traces: dict[str, list[pd.DataFrame]] = {}
    for point, group in curves:
        part = group[["point", "train_time_s", "accuracy"]].assign(label=names.get(point, point))
        traces.setdefault(entry.get(point, point), []).append(part)
    fig = go.Figure()
    for i, (name, parts) in enumerate(traces.items()):
        gap = pd.DataFrame({"point": [""], "train_time_s": [np.nan], "accuracy": [np.nan], "label": [""]})
        line = pd.concat([x for part in parts for x in (part, gap)][:-1], ignore_index=True)
        fig.add_trace(
            go.Scatter(
                x=line["train_time_s"],
                y=line["accuracy"] * 100,
                mode="lines+markers",
                name=name,
                line={"color": color(i)},
                customdata=hover_data(list(line["label"]), list(line["point"])),
                hovertemplate=HOVER + "%{x:.3g} s: %{y:.2f} %<extra></extra>",
            )
        )
    plotted = stats[stats["point"].isin(set(data["point"]))] if "chance" in stats else stats.iloc[0:0]
    for level in sorted({float(c) for c in plotted.get("chance", []) if np.isfinite(c)}):
        fig.add_hline(
            y=level * 100,
            line={"color": "grey", "dash": "dot", "width": 1},
            annotation_text=f"chance (1/{round(1 / level)})",
            annotation_position="top left",
        )
    fig.update_xaxes(title_text="training time (s)")
    fig.update_yaxes(title_text="accuracy (%)")
    tidy = pd.concat([part for parts in traces.values() for part in parts], ignore_index=True)
    return Plot(finish(fig, "Accuracy vs training time", 460), tidy)
