"""The report's figures (matplotlib, Agg backend), each from the analysis tables.

Every function returns a Figure, or None when the tables hold nothing it could show (the
report then says so instead of drawing an empty axis).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator

import matplotlib

matplotlib.use("Agg")  # no display: the report is written on login nodes and in CI

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hpcbench.analysis.metric_table import metric
from hpcbench.store.schema import PHASES

SERIES = ["framework", "backend", "model", "batch_size"]
SIZE = (7.0, 4.0)
DPI = 90


def _also(row: pd.Series, column: str) -> str:
    """A row's text in `column` (report/html.py's `differs`, `series`), '' where it has none."""
    value = row.get(column, "")
    return f" {value}" if isinstance(value, str) and value else ""


def point_label(row: pd.Series) -> str:
    """A point's label; with the table's `differs` column (report/html.py), what tells it apart
    from points of the same framework, backend, model, N and batch."""
    base = f"{row['framework']}/{row['backend']} {row['model']} N={int(row['ranks'])} b={int(row['batch_size'])}"
    return base + _also(row, "differs")


def _series(table: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """Lines of a vs-N plot: one per framework, backend, model and batch (and, with the table's
    `series` column, whatever else tells configurations apart), mean over repeats."""
    keys = [*SERIES, "series"] if "series" in table else SERIES
    for key, group in table.groupby(keys, sort=True):
        framework, backend, model, batch = key[:4]
        also = f" {key[4]}" if len(key) > 4 and key[4] else ""
        line = group.groupby("ranks", as_index=False).mean(numeric_only=True)
        yield f"{framework}/{backend} {model} b={batch}{also}", line


def _finished(fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str) -> Figure:
    """`fig` with its one plot's axes labelled, titled, gridded and its legend drawn."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _vs_ranks(table: pd.DataFrame, column: str, ylabel: str, title: str, ideal: bool = False) -> Figure | None:
    data = table[np.isfinite(table[column].astype(float))] if column in table else table.iloc[0:0]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for label, group in _series(data):
        ax.plot(group["ranks"], group[column], marker="o", label=label)
    if ideal:
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="ideal")
    ax.set_xscale("log", base=2)
    return _finished(fig, ax, "ranks N", ylabel, title)


def _metric_vs_ranks(stats: pd.DataFrame, key: str) -> Figure | None:
    """A metric's figure, its axis label and title from the metric table."""
    m = metric(key)
    return _vs_ranks(stats, m.key, m.formula, m.title, ideal=m.ideal)


def throughput(stats: pd.DataFrame) -> Figure | None:
    return _metric_vs_ranks(stats, "throughput")


def efficiency(stats: pd.DataFrame) -> Figure | None:
    return _metric_vs_ranks(stats, "efficiency")


def comm_share(stats: pd.DataFrame) -> Figure | None:
    return _metric_vs_ranks(stats, "comm_share")


def _bars(labels: list[str], height: float = 0.45) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=(SIZE[0], max(2.5, 0.9 + height * len(labels))), dpi=DPI)
    return fig, ax


def phases(stats: pd.DataFrame) -> Figure | None:
    """Stacked horizontal bars: mean seconds per phase, and the time in no phase."""
    if stats.empty:
        return None
    labels = [point_label(r) for _, r in stats.iterrows()]
    fig, ax = _bars(labels)
    left = np.zeros(len(stats))
    parts = [*PHASES, "other"]
    accounted = stats[[f"{p}_s" for p in PHASES]].sum(axis=1).to_numpy()
    for phase in parts:
        values = (
            np.clip(stats["t_iter_s"].to_numpy() - accounted, 0, None)
            if phase == "other"
            else stats[f"{phase}_s"].to_numpy()
        )
        ax.barh(labels, values * 1e3, left=left, label=phase)
        left += values * 1e3
    ax.set_xlabel("ms per iteration (mean over ranks; other = t_iter − phases)")
    ax.set_title("Where an iteration's time goes")
    ax.invert_yaxis()
    ax.legend(fontsize="small", ncol=4)
    fig.tight_layout()
    return fig


def lif(stats: pd.DataFrame) -> Figure | None:
    data = stats[np.isfinite(stats["lif"].astype(float))]
    if data.empty:
        return None
    labels = [point_label(r) for _, r in data.iterrows()]
    fig, ax = _bars(labels)
    ax.barh(labels, data["lif"], color="tab:purple")
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlim(left=min(0.95, float(data["lif"].min()) - 0.01))
    ax.set_xlabel("LIF = mean over iterations of max_r c / mean_r c (1.0 = balanced)")
    ax.set_title("Load-imbalance factor")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def resources(stats: pd.DataFrame) -> Figure | None:
    cols = ["cpu_user", "cpu_system", "cpu_iowait", "mem_avg_mib", "mem_max_mib"]
    data = stats[np.isfinite(stats[cols].astype(float)).any(axis=1)] if set(cols) <= set(stats) else stats.iloc[0:0]
    if data.empty:
        return None
    labels = [point_label(r) for _, r in data.iterrows()]
    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(SIZE[0] * 1.4, max(2.5, 0.9 + 0.45 * len(labels))), dpi=DPI)
    left = np.zeros(len(data))
    for col, name in (("cpu_user", "%user"), ("cpu_system", "%system"), ("cpu_iowait", "%iowait")):
        values = np.nan_to_num(data[col].to_numpy(dtype=float))
        cpu.barh(labels, values, left=left, label=name)
        left += values
    cpu.set_xlabel("CPU % of the node (sysstat)")
    cpu.set_title("CPU use")
    cpu.invert_yaxis()
    cpu.legend(fontsize="small")
    y = np.arange(len(data))
    mem.barh(y - 0.2, np.nan_to_num(data["mem_avg_mib"].to_numpy(dtype=float)), height=0.4, label="avg")
    mem.barh(y + 0.2, np.nan_to_num(data["mem_max_mib"].to_numpy(dtype=float)), height=0.4, label="max")
    mem.set_yticks(y, [""] * len(y))
    mem.set_xlabel("RSS per rank (MiB)")
    mem.set_title("Memory")
    mem.invert_yaxis()
    mem.legend(fontsize="small")
    fig.tight_layout()
    return fig


def predicted_vs_measured(predictions: pd.DataFrame) -> Figure | None:
    if predictions.empty or "predicted_t_iter_s" not in predictions:
        return None
    data = predictions[np.isfinite(predictions["predicted_t_iter_s"].astype(float))]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    measured = data["measured_t_iter_s"].to_numpy(dtype=float) * 1e3
    predicted = data["predicted_t_iter_s"].to_numpy(dtype=float) * 1e3
    serial = data["predicted_no_overlap_s"].to_numpy(dtype=float) * 1e3
    cal = data["calibration"].to_numpy(dtype=bool)
    ax.scatter(measured[~cal], predicted[~cal], label="predicted (wait-free backprop)", marker="o")
    ax.scatter(measured[~cal], serial[~cal], label="predicted (no overlap)", marker="x")
    ax.scatter(measured[cal], predicted[cal], label="calibration points", marker="s", facecolors="none", edgecolors="k")
    hi = float(np.nanmax([measured.max(), predicted.max(), serial.max()])) * 1.1
    ax.plot([0, hi], [0, hi], color="grey", linestyle=":", linewidth=1, label="prediction = measurement")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    return _finished(
        fig, ax, "measured t_iter (ms)", "predicted t_iter (ms)", "Performance model: predicted vs measured"
    )


def accuracy_vs_time(evaluations: pd.DataFrame, stats: pd.DataFrame) -> Figure | None:
    data = evaluations[np.isfinite(evaluations["accuracy"].astype(float))] if not evaluations.empty else evaluations
    if data.empty:
        return None
    synthetic = {r["point"] for _, r in stats.iterrows() if r.get("dataset") == "synthetic"}
    labels = {r["point"]: point_label(r) + (" (synthetic data)" if r["point"] in synthetic else "")
              for _, r in stats.iterrows()}  # fmt: skip
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for point, group in data.groupby("point", sort=True):
        ax.plot(group["train_time_s"], group["accuracy"] * 100, marker="o", label=labels.get(point, str(point)))
    plotted = stats[stats["point"].isin(set(data["point"]))] if "chance" in stats else stats.iloc[0:0]
    for level in sorted({float(c) for c in plotted.get("chance", []) if np.isfinite(c)}):
        ax.axhline(level * 100, color="grey", linestyle=":", linewidth=1, label=f"chance (1/{round(1 / level)})")
    return _finished(fig, ax, "training time (s)", "accuracy (%)", "Accuracy vs training time")


def png_base64(fig: Figure) -> str:
    """The figure as base64 PNG text (the figure is closed)."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


FigureMaker = Callable[[], Figure | None]

__all__ = ["Figure", "FigureMaker"]
