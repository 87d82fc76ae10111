"""What the analysis derives from one point file alone, and the sweep's tables joined from it.

A point's `PointTables` hold its metrics row (metrics.point_row, its messages' exposure
measured once), its resources, accuracy, workload and energy rows, its row of the points
table, its evaluations, its straggler attribution and, where asked, its collectives per mesh
axis: everything of the sweep's tables that one file determines. The sweep-wide steps
(speedup and efficiency against the one-rank point, repeats, the model) run on these in
`tables.py` and `pipeline.py`, in the same order as on the files, so a sweep analysed from
its files and one analysed from its cached PointTables (cache.py) give the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hpcbench.analysis import accuracy, collectives, energy, metrics, resources, stats, workload
from hpcbench.analysis.placement import placement_of
from hpcbench.analysis.stragglers import exposure
from hpcbench.analysis.stragglers import find as stragglers
from hpcbench.analysis.tables import listing_row
from hpcbench.spec import Point
from hpcbench.store.reader import PointData

Row = dict[str, object]
Columns = dict[str, np.ndarray]  # a table as equal-length columns: made one DataFrame per sweep


@dataclass
class PointTables:
    """One complete point's derived rows and tables (the unit the cache keeps)."""

    point: Point
    point_id: str
    path: Path
    target_accuracy: float | None  # what `extra`'s time-to-accuracy was computed against
    metrics: Row  # metrics.point_row, with the exposure's union and exposed shares
    extra: Row  # the stats table's other columns: config, seed, resources, accuracy, oversubscribed
    resources: Row  # resources.of_point (its host notes)
    workload: Row  # workload.row at the metrics row's throughput
    energy: Row  # energy.row
    listing: Row  # the points table's row
    placement: str  # placement_of(p).describe(), "" where the point was not oversubscribed
    evaluations: Columns  # accuracy.evaluations with the point column, as columns (empty: none)
    stragglers: stragglers.PointStragglers | None  # None: one rank, or no timed iteration
    collectives: pd.DataFrame | None = field(default=None)  # collectives.of_point; None: not computed


def derive(p: PointData, target_accuracy: float | None = None, with_collectives: bool = False) -> PointTables:
    """Everything the analysis takes from the point file `p` alone; its messages are passed over once."""
    measured = exposure.of(p.iterations, p.comm)
    row = metrics.point_row(p.point, p.point_id, p.iterations, measured)
    use = resources.rank_use(p.resources, p.iterations)  # the resource columns' and the stragglers'
    used = resources.of_point(p, use)
    where = placement_of(p)
    extra: Row = {"point": p.point_id, "config": stats.config_id(p.point), "seed": p.point.seed}
    extra.update(used)
    evaluations = accuracy.evaluation_columns(p.eval)
    extra.update(accuracy.accuracy_row(p.eval, p.iterations, target_accuracy, evaluations))
    extra["oversubscribed"] = where.oversubscribed
    evaluated: Columns = {}
    if evaluations:
        evaluated = {"point": np.full(len(evaluations["epoch"]), p.point_id, dtype=object), **evaluations}
    return PointTables(
        p.point,
        p.point_id,
        p.path,
        target_accuracy,
        row,
        extra,
        dict(used),
        workload.row(p, float(row["throughput"])),  # type: ignore[arg-type]
        energy.row(p),
        listing_row(p),
        where.describe() if where.oversubscribed else "",
        evaluated,
        stragglers.of_point(p, measured, use),
        collectives.of_point(p) if with_collectives or p.point.parallel else None,
    )


def summary_table(points: list[PointTables]) -> pd.DataFrame:
    """The scaling table (metrics.summary's, then the workload's and the energy's columns), as
    `hpcbench analyze` prints and writes it."""
    if not points:
        return energy.add(workload.add(metrics.summary([]), []), [])  # the empty table's columns
    table = _scaled(points)
    return _joined(_joined(table, points, "workload", workload.COLUMNS), points, "energy", energy.COLUMNS)


def stats_table(points: list[PointTables]) -> pd.DataFrame:
    """The stats table: the scaling table's metrics, then resources and accuracy, workload and energy."""
    if not points:
        return metrics.summary([])
    table = _scaled(points).merge(pd.DataFrame([p.extra for p in points]), on="point", how="left")
    return _joined(_joined(table, points, "workload", workload.COLUMNS), points, "energy", energy.COLUMNS)


def points_table(points: list[PointTables]) -> pd.DataFrame:
    return pd.DataFrame([p.listing for p in points])


def evaluations_table(points: list[PointTables]) -> pd.DataFrame:
    """One row per point x evaluation: the points' columns joined (as pd.concat of their frames would)."""
    tables = [p.evaluations for p in points if p.evaluations]
    if not tables:
        return pd.DataFrame(columns=["point", *accuracy.EVALUATION_COLUMNS])
    return pd.DataFrame({c: np.concatenate([t[c] for t in tables]) for c in tables[0]})


def collectives_table(points: list[PointTables]) -> pd.DataFrame:
    frames = [p.collectives for p in points if p.collectives is not None and not p.collectives.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=collectives.COLUMNS)


def straggler_tables(points: list[PointTables]) -> stragglers.SweepStragglers:
    return stragglers.sweep([p.stragglers for p in points if p.stragglers is not None])


def _scaled(points: list[PointTables]) -> pd.DataFrame:
    """metrics.summary's steps on the points' rows: speedup and efficiency, then the order."""
    table = metrics.add_scaling(pd.DataFrame([p.metrics for p in points]), [p.point for p in points])
    order = ["framework", "backend", "env", "launcher", "model", "device", "batch_size", "nodes", "ranks"]
    return table[metrics.SUMMARY_COLUMNS].sort_values(order, kind="stable").reset_index(drop=True)


def _joined(table: pd.DataFrame, points: list[PointTables], part: str, columns: list[str]) -> pd.DataFrame:
    """workload.add's and energy.add's merge, of rows already derived (`part` of each point)."""
    by_id = {p.point_id: getattr(p, part) for p in points}
    rows = [{"point": pid, **by_id[pid]} for pid in table["point"]]
    return table.merge(pd.DataFrame(rows)[["point", *columns]], on="point", how="left")
