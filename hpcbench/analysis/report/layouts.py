"""The report's figure of the parallel layouts a sweep measured beside the layout model's
predictions (analysis/layouts_measured.py): measured and predicted t_iter per layout, the
layouts sorted by measured t_iter, a row of bars per group of points that differ only in
their layout. Registered after the figures of figures.py (html.py imports it between them
and the stragglers')."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go  # type: ignore[import-untyped]

from hpcbench.analysis.layouts_measured import OOM_SHOWN
from hpcbench.analysis.report.plot import (
    Plot,
    bars_height,
    figure,
    finish,
    hover_data,
    label_bars,
    ms_bar,
)

if TYPE_CHECKING:
    from hpcbench.analysis.pipeline import Analysis

DATA = ["group", "config", "point", "layout", "calibration", "measured_ms", "predicted_ms", "rel_error",
        "measured_rank", "predicted_rank"]  # fmt: skip


def drawn(layouts: pd.DataFrame) -> pd.DataFrame:
    """The rows the figure draws (measured ones, out of memory left out), each group's sorted by
    measured t_iter (the fastest first), as the figure's CSV holds them."""
    if layouts.empty:
        return pd.DataFrame(columns=DATA)
    rows = layouts[(layouts["status"] != OOM_SHOWN) & np.isfinite(layouts["measured_t_iter_s"].astype(float))]
    rows = rows.assign(_order=[list(dict.fromkeys(layouts["group"])).index(g) for g in rows["group"]])
    rows = rows.sort_values(["_order", "measured_t_iter_s"], kind="stable")
    return pd.DataFrame({
        "group": rows["group"], "config": rows["config"], "point": rows["point"], "layout": rows["layout"],
        "calibration": rows["calibration"].astype(bool), "measured_ms": rows["measured_t_iter_s"] * 1e3,
        "predicted_ms": rows["predicted_t_iter_s"].astype(float) * 1e3, "rel_error": rows["rel_error"],
        "measured_rank": rows["measured_rank"], "predicted_rank": rows["predicted_rank"],
    }).reset_index(drop=True)  # fmt: skip


@figure("Layouts: measured vs predicted")
def layouts_figure(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Horizontal bars: measured and predicted t_iter of each layout, sorted by measured."""
    data = drawn(analysis.layouts)
    if data.empty:
        return None
    several = data["group"].nunique() > 1
    labels = [f"{c}: {lay}" if several else str(lay) for c, lay in zip(data["config"], data["layout"], strict=True)]
    labels = [f"{lab} (calibration)" if cal else lab for lab, cal in zip(labels, data["calibration"], strict=True)]
    ids = [str(p) for p in data["point"]]
    custom = hover_data([f"{c} {lay}" for c, lay in zip(data["config"], data["layout"], strict=True)], ids)
    fig = go.Figure()
    for i, (name, column) in enumerate((("measured", "measured_ms"), ("predicted (layout model)", "predicted_ms"))):
        fig.add_trace(ms_bar(ids, data[column].to_numpy(dtype=float), name, i, custom))
    fig.update_layout(barmode="group")
    label_bars(fig, ids, labels)
    fig.update_xaxes(title_text="t_iter (ms); layouts sorted by measured t_iter")
    title = "Parallel layouts: measured and predicted t_iter (calibrated on the data-parallel point)"
    return Plot(finish(fig, title, bars_height(2 * len(ids))), data)
