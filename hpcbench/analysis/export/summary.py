"""summary.json: every metric of every point, as the analysis' stats table has them.

The rows are the analysis' stats table (hpcbench.analysis.tables.stats_table), computed by
the same functions one point at a time, so that memory holds one point (stats_table wants
every point's arrays at once); speedup and efficiency, which compare points, once all rows
are in (metrics.add_scaling); ordered as the stats table orders them. NaN (a metric that is
undefined, e.g. speedup without a one-rank point) is written as null.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

import hpcbench
from hpcbench.analysis import accuracy, energy, metrics, resources, stats, workload
from hpcbench.analysis.placement import placement_of
from hpcbench.spec import Point
from hpcbench.store.reader import PointData

COLUMNS = [*metrics.SUMMARY_COLUMNS, "config", "seed", *resources.RESOURCE_COLUMNS, *accuracy.ACCURACY_COLUMNS,
           "oversubscribed", *workload.COLUMNS, *energy.COLUMNS]  # fmt: skip
ORDER = ["framework", "backend", "launcher", "model", "device", "batch_size", "nodes", "ranks"]  # as metrics.summary

# Units of the stats columns, for readers of the JSON (columns not named here have none).
UNITS = {
    "t_iter_s": "s", "step_mean_s": "s", "step_min_s": "s", "step_max_s": "s", "throughput": "samples/s",
    "train_time_s": "s", "test_time_s": "s", "time_to_best_s": "s", "time_to_target_s": "s",
    "cpu_user": "%", "cpu_system": "%", "cpu_iowait": "%", "cpu_total": "%", "mem_avg_mib": "MiB",
    "mem_max_mib": "MiB", "gpu_util": "%", "gpu_mem_max_mib": "MiB", "gpu_power_w": "W", "rank_cpus": "CPUs",
    "cpu_wait": "fraction", "loop_runnable": "fraction", "work_wait": "fraction", "helper_cpus": "CPUs",
    "other_cpus": "CPUs", "cpu_steal": "%",
    "accuracy": "fraction", "best_accuracy": "fraction", "efficiency": "fraction", "comm_share": "fraction",
    "comm_union_share": "fraction", "comm_exposed_share": "fraction", "overlap": "fraction", "cv": "fraction",
    "lif_excess": "fraction", "comm_total_s": "s", "tokens_per_s": "tokens/s", "tokens_per_s_device": "tokens/s",
    "tflops_device": "TFLOP/s", "mfu": "fraction", "peak_device_gib": "GiB", "peak_host_gib": "GiB",
    "seq_len": "tokens", "energy_j": "J", "energy_per_sample_j": "J", "energy_per_token_j": "J", "power_gpu_w": "W",
    "power_cpu_w": "W", "power_dram_w": "W", "power_node_w": "W", "power_sample_hz": "Hz",
    **{f"{phase}_s": "s" for phase in ("data", "h2d", "forward", "backward", "comm", "update")},
}  # fmt: skip


def plain(value: Any) -> Any:
    """A JSON-ready value: numpy scalars as Python ones, NaN, infinities and pandas' NA as None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


class Summary:
    """The stats rows of a sweep, gathered one point at a time."""

    def __init__(self) -> None:
        self._rows: list[dict[str, object]] = []
        self._points: list[Point] = []

    def add(self, p: PointData) -> None:
        """The point's row as tables.stats_table makes it, less what compares points."""
        row = metrics.point_row(p.point, p.point_id, p.iterations, p.comm)
        row.update({"config": stats.config_id(p.point), "seed": p.point.seed})
        row.update(resources.of_point(p))
        row.update(accuracy.accuracy_row(p.eval, p.iterations))
        row["oversubscribed"] = placement_of(p).oversubscribed
        row.update(workload.row(p, float(row["throughput"])))  # type: ignore[arg-type]
        row.update(energy.row(p))
        self._rows.append(row)
        self._points.append(p.point)

    def table(self) -> pd.DataFrame:
        """Every point's row, with speedup and efficiency, in the stats table's order."""
        if not self._rows:
            return pd.DataFrame(columns=COLUMNS)
        table = metrics.add_scaling(pd.DataFrame(self._rows), self._points)
        return table[COLUMNS].sort_values(ORDER, kind="stable").reset_index(drop=True)


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [plain(row) for row in table.to_dict("records")]


def summary_json(table: pd.DataFrame, sweep: str, warnings: list[str]) -> str:
    """The text of summary.json."""
    doc = {
        "hpcbench_version": hpcbench.__version__,
        "sweep": sweep,
        "units": {column: UNITS[column] for column in table.columns if column in UNITS},
        "notes": metrics.warnings_for(table),
        "skipped": warnings,
        "points": records(table),
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"
