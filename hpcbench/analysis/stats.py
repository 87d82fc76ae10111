"""Repeated runs: mean, 95 % confidence interval and pyperf-style warnings.

Repeats of a configuration are points that differ only in `seed` (put `seed: [1, 2, 3]`
in a spec's matrix to run a configuration three times); their `config` is the id the
point would have with seed 0. The interval is Student's t on the repeats' values; with
one repeat it is empty (NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from hpcbench.analysis import resources
from hpcbench.analysis.metric_table import REPEATED
from hpcbench.spec import Point

CV_WARNING = 0.10  # pyperf: coefficient of variation above which a result is unstable
OUTLIER_WARNING = 0.50  # pyperf: minimum or maximum this far (relative) from the mean
MIN_TIMED = 10  # fewer timed iterations than this: the median is not stable
MIN_REPEATS = 3  # fewer repeats than this: the confidence interval is too wide to lean on

# Student's t, two-sided 95 % (0.975 quantile), degrees of freedom 1..30
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t975(df: int) -> float:
    """0.975 quantile of Student's t with `df` degrees of freedom (Cornish-Fisher beyond 30)."""
    if df < 1:
        return float("nan")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(mean, half-width of the 95 % confidence interval); NaN values are left out."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), float("nan")
    return float(v.mean()), t975(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)


def config_id(point: Point) -> str:
    """The id shared by repeats of one configuration (the point's id with seed 0)."""
    return id_of(dataclasses.replace(point, seed=0))


def id_of(point: Point) -> str:
    """`point.id`, hashed once per distinct point rather than once per object (the keys a
    sweep's points are grouped by, `config_id` and metrics.scaling_group, are a few points
    made again and again)."""
    try:
        return _id_of(point)
    except TypeError:  # a field that does not hash (a Point built with a list)
        return point.id


@functools.lru_cache(maxsize=4096)
def _id_of(point: Point) -> str:
    return point.id


def repeats(stats: pd.DataFrame, columns: Sequence[str] = REPEATED) -> pd.DataFrame:
    """One row per configuration: n repeats, and for each column its mean, CI half-width and CV."""
    if stats.empty:
        return pd.DataFrame(columns=["config", "repeats"])
    keys = [c for c in ("config", "framework", "backend", "model", "ranks", "batch_size") if c in stats]
    rows = []
    for key, group in stats.groupby(keys, sort=False, dropna=False):
        row: dict[str, object] = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        row["repeats"] = len(group)
        row["points"] = " ".join(group["point"])
        for col in columns:
            if col not in group:
                continue
            values = group[col].to_numpy(dtype=float)
            mean, half = mean_ci(values)
            finite = values[np.isfinite(values)]
            row[f"{col}_mean"] = mean
            row[f"{col}_ci95"] = half
            row[f"{col}_cv"] = (
                float(finite.std(ddof=1) / finite.mean()) if finite.size > 1 and finite.mean() else float("nan")
            )
        rows.append(row)
    return pd.DataFrame(rows)


_HOST_NOTES = ("other_cpus", "cpu_steal", "helper_cpus")  # the columns resources.host_notes reads


def point_warnings(table: pd.DataFrame) -> list[str]:
    """pyperf-style notes on points whose numbers should not be trusted as they are."""
    notes = []
    has_spread = {"step_min_s", "step_max_s", "step_mean_s"} <= set(table.columns)
    read = ("point", "timed_iterations", "cv", "step_mean_s", "step_min_s", "step_max_s", *_HOST_NOTES)
    for row in table[[c for c in read if c in table]].to_dict("records"):  # not iterrows: a Series per row
        if row["timed_iterations"] < MIN_TIMED:
            notes.append(
                f"point {row['point']}: only {row['timed_iterations']} timed iterations; "
                f"use iterations >= {MIN_TIMED} for a stable median"
            )
        if row["cv"] >= CV_WARNING:
            notes.append(
                f"point {row['point']}: iteration times vary by {row['cv']:.0%} (CV); the result is unstable: "
                "rerun with more iterations or warm-up, on an idle machine"
            )
        if has_spread and row["step_mean_s"] > 0:
            low = (row["step_mean_s"] - row["step_min_s"]) / row["step_mean_s"]
            high = (row["step_max_s"] - row["step_mean_s"]) / row["step_mean_s"]
            if max(low, high) >= OUTLIER_WARNING:
                notes.append(
                    f"point {row['point']}: slowest or fastest iteration is {max(low, high):.0%} from the mean "
                    f"(outliers); look at its timeline (hpcbench trace {row['point']}.h5 -o {row['point']}.json) "
                    "for pauses, and rerun on an idle machine"
                )
        notes += resources.host_notes(str(row["point"]), row)
    return notes


def repeat_warnings(table: pd.DataFrame) -> list[str]:
    """Notes on configurations whose repeats disagree or are too few for a confidence interval."""
    notes = []
    for _, row in table.iterrows():
        n = int(row["repeats"])
        if n < 2:
            continue
        cv = row.get("throughput_cv", float("nan"))
        if isinstance(cv, float) and cv >= CV_WARNING:
            notes.append(
                f"configuration {row['config']}: throughput varies by {cv:.0%} (CV) over {n} repeats; "
                "the mean is unstable: add repeats (more seeds) or run on an idle machine"
            )
        if n < MIN_REPEATS:
            notes.append(
                f"configuration {row['config']}: only {n} repeats; use >= {MIN_REPEATS} seeds for a usable "
                "confidence interval"
            )
    return notes
