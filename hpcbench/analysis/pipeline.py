"""The whole analysis of a sweep: its tables (tables.py), the performance model's predictions
and held-out validation (model/), the stragglers (stragglers/), and the headlines a reader needs
first. `analyze`, `report` and the studies run this; `compare` and `export` read the tables only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hpcbench.analysis import collectives, stats, workload
from hpcbench.analysis.model import predict, validate
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.stragglers import exposure
from hpcbench.analysis.stragglers import find as stragglers
from hpcbench.analysis.tables import FileHook, evaluations_table, load, points_table, samples_table, stats_table
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData


@dataclass
class Analysis:
    """A sweep's tables and the notes on what should not be trusted."""

    directory: Path
    data: list[PointData]
    points: pd.DataFrame
    stats: pd.DataFrame
    repeats: pd.DataFrame
    evaluations: pd.DataFrame
    predictions: pd.DataFrame
    warnings: list[str]  # files skipped
    notes: list[str]  # pyperf-style notes on unstable numbers
    held_out: pd.DataFrame = field(default_factory=pd.DataFrame)  # the model's leave-one-scale-out errors
    headlines: list[str] = field(default_factory=list)  # what a reader needs first, atop the report
    slow: stragglers.SweepStragglers = field(default_factory=stragglers.SweepStragglers)  # why it is slow
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # per point x op x axis, where layouts run

    def samples(self) -> pd.DataFrame:
        return samples_table(self.data)


def analyse(
    directory: Path | str,
    target_accuracy: float | None = None,
    link: LinkCost | None = None,
    on_file: FileHook | None = None,
) -> Analysis:
    """Load a sweep and derive every table. Raises HpcbenchError without a complete point.
    `on_file`: as `load`'s."""
    sweep = load(directory, on_file)
    if not sweep.points:
        raise HpcbenchError(f"{sweep.directory}: no complete point files to analyse")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise HpcbenchError(f"target accuracy {target_accuracy} is not a fraction in (0, 1]")
    exposures = {p.point_id: exposure.of(p.iterations, p.comm) for p in sweep.points}  # messages: one pass
    stats_frame = stats_table(sweep.points, target_accuracy, exposures)
    slow = stragglers.analyse(sweep.points, exposures)
    repeats = stats.repeats(stats_frame)
    indexed = stats_frame.set_index("point")
    preds = predict.predictions(sweep.points, indexed, link)
    held = validate.held_out(sweep.points, indexed, link)
    notes = workload.notes(stats_frame) + stats.point_warnings(stats_frame) + stats.repeat_warnings(repeats)
    headlines = [validate.headline(held), *_oversubscribed(preds), *([slow.headline] if slow.headline else [])]
    by_axis = collectives.table(sweep.points) if collectives.has_layouts(sweep.points) else pd.DataFrame()
    return Analysis(
        sweep.directory,
        sweep.points,
        points_table(sweep.points),
        stats_frame,
        repeats,
        evaluations_table(sweep.points),
        preds,
        sweep.warnings,
        notes,
        held,
        headlines,
        slow,
        by_axis,
    )


def _oversubscribed(preds: pd.DataFrame) -> list[str]:
    """A headline naming the points whose ranks had fewer cores than threads."""
    if "oversubscribed" not in preds:
        return []
    over = preds[preds["oversubscribed"].fillna(False).astype(bool)]
    if over.empty:
        return []
    names = ", ".join(f"{r.point} ({r.ranks} ranks)" for r in over.itertuples())
    return [
        f"Oversubscribed: {names} ran more threads than their host has cores; their compute and "
        "collectives are slowed by time-sharing (modelled as max(1, ranks x threads / cores))."
    ]
