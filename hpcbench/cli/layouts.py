"""`hpcbench analyze`'s table of the parallel layouts a sweep measured beside the layout
model's predictions (hpcbench/analysis/layouts_measured.py), a table per group of points that
differ only in their layout."""

from __future__ import annotations

import pandas as pd

from hpcbench.analysis import layouts_measured, loading, tables
from hpcbench.cli import textable

CALIBRATION = "data-parallel point"


def format_layouts(table: pd.DataFrame) -> str:
    """The layouts measured beside predicted (analysis/layouts_measured.py), a table per group,
    each with its headline."""
    out = []
    for _, group in table.groupby("group", sort=False):
        rows = [["layout", "point", "measured ms", "predicted ms", "error", "tokens/s", "predicted tokens/s",
                 "rank", "predicted rank", "peak GiB/device", "predicted GiB/device", ""]]  # fmt: skip
        for r in group.to_dict("records"):
            status = "calibration" if r["calibration"] else ("out of memory" if r["status"] != "measured" else "")
            rows.append([str(r["layout"]), str(r["point"]), _ms(r["measured_t_iter_s"]), _ms(r["predicted_t_iter_s"]),
                         _fmt(r["rel_error"], "{:+.1%}"), _fmt(r["measured_tokens_per_s"], "{:,.0f}"),
                         _fmt(r["predicted_tokens_per_s"], "{:,.0f}"), _fmt(r["measured_rank"], "{:.0f}"),
                         _fmt(r["predicted_rank"], "{:.0f}"), _fmt(r["measured_peak_device_gib"], "{:.3f}"),
                         _fmt(r["predicted_memory_gib"], "{:.3f}"), status])  # fmt: skip
        head = f"layouts of {group['config'].iloc[0]}: measured beside the layout model calibrated on its {CALIBRATION}"
        out.append(f"\n{head}\n" + textable.render(rows, right=True))
        notes = dict.fromkeys(n for n in group["note"] if isinstance(n, str) and n)
        out += [f"note: {n}" for n in notes]
    out += layouts_measured.headlines(table)
    return "\n".join(out)


def _fmt(value: object, pattern: str) -> str:
    return "-" if not isinstance(value, int | float) or value != value else pattern.format(value)


def _ms(value: object) -> str:
    return _fmt(value * 1e3 if isinstance(value, int | float) else value, "{:.2f}")


def measured_layouts(sweep: loading.DerivedSweep, table: pd.DataFrame) -> pd.DataFrame:
    """The layouts table of `hpcbench analyze`: only the data-parallel points' files are read."""
    points = [(p.point_id, p.point) for p in sweep.points]
    measured = layouts_measured.table(points, table, lambda i: tables.read_checked(sweep.points[i].path, []))
    lost = layouts_measured.out_of_memory_points(sweep.directory, [pid for pid, _ in points])
    return layouts_measured.with_out_of_memory(measured, lost)
