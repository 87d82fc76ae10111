"""The whole analysis of a sweep: its tables (tables.py), the performance model's predictions
and held-out validation (model/), the stragglers (stragglers/), and the headlines a reader needs
first. `analyze`, `report` and the studies run this; `compare` and `export` read the tables only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hpcbench.analysis import cache, layouts_measured, loading, per_point, stats, workload
from hpcbench.analysis.cache import CacheStats
from hpcbench.analysis.loading import DerivedSweep
from hpcbench.analysis.model import predict, validate
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.stragglers import find as stragglers
from hpcbench.analysis.tables import FileHook, samples_table
from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.store.reader import PointData


@dataclass
class Analysis:
    """A sweep's tables and the notes on what should not be trusted."""

    directory: Path
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
    specs: dict[str, Point] = field(default_factory=dict)  # each point's fields by point id, in file order
    layouts: pd.DataFrame = field(default_factory=pd.DataFrame)  # layouts measured beside predicted (layouts_measured)
    cache: CacheStats = field(default_factory=CacheStats)  # what came from the cache (cache.py)
    sweep: DerivedSweep | None = field(default=None, repr=False)

    @property
    def data(self) -> list[PointData]:
        """The point files' arrays, read on first use where the tables came from the cache."""
        return self.sweep.data() if self.sweep is not None else []

    def samples(self) -> pd.DataFrame:
        return samples_table(self.data)


def analyse(
    directory: Path | str,
    target_accuracy: float | None = None,
    link: LinkCost | None = None,
    on_file: FileHook | None = None,
    use_cache: bool = True,
) -> Analysis:
    """Load a sweep and derive every table. Raises HpcbenchError without a complete point.
    `on_file`: as `load`'s; `use_cache`: take and keep what each point file derives in the
    sweep directory's cache (cache.py; the model's tables too, where no `link` is given)."""
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise HpcbenchError(f"target accuracy {target_accuracy} is not a fraction in (0, 1]")
    sweep = loading.load(directory, on_file, use_cache, target_accuracy)
    if not sweep.points:
        raise HpcbenchError(f"{sweep.directory}: no complete point files to analyse")
    store = sweep.store if link is None else None  # a commbench-fitted link is not part of the key
    key = cache.sweep_key(sweep.keys, target_accuracy)
    model = store.sweep(key) if store is not None else None
    if model is None:
        sweep.data()  # the model reads the arrays: every file, an entry whose file changed derived again
    if any(p.point.parallel for p in sweep.points):
        sweep.with_collectives()
    stats_frame = per_point.stats_table(sweep.points)
    slow = per_point.straggler_tables(sweep.points)
    repeats = stats.repeats(stats_frame)
    if model is None:
        indexed = stats_frame.set_index("point")
        model = {
            "predictions": predict.predictions(sweep.data(), indexed, link),
            "held_out": validate.held_out(sweep.data(), indexed, link),
            "layouts": _layouts(sweep, stats_frame, link),
        }
        if store is not None:
            store.put_sweep(cache.sweep_key(sweep.keys, target_accuracy), model)
    preds, held = model["predictions"], model["held_out"]
    lost = layouts_measured.out_of_memory_points(sweep.directory, [p.point_id for p in sweep.points])
    layouts = layouts_measured.with_out_of_memory(model.get("layouts", pd.DataFrame()), lost)
    notes = workload.notes(stats_frame) + stats.point_warnings(stats_frame) + stats.repeat_warnings(repeats)
    headlines = [validate.headline(held), *layouts_measured.headlines(layouts), *_oversubscribed(preds)]
    headlines += [slow.headline] if slow.headline else []
    by_axis = per_point.collectives_table(sweep.points) if any(p.point.parallel for p in sweep.points) else None
    return Analysis(
        sweep.directory,
        per_point.points_table(sweep.points),
        stats_frame,
        repeats,
        per_point.evaluations_table(sweep.points),
        preds,
        sweep.warnings,
        notes,
        held,
        headlines,
        slow,
        pd.DataFrame() if by_axis is None else by_axis,
        {p.point_id: p.point for p in sweep.points},
        layouts,
        sweep.cache_stats,
        sweep,
    )


def _layouts(sweep: DerivedSweep, stats_frame: pd.DataFrame, link: LinkCost | None) -> pd.DataFrame:
    """The layouts measured beside predicted (layouts_measured.table), the points out of memory
    aside (added on every analysis: they are not among the cache key's complete points)."""
    if not any(p.point.parallel for p in sweep.points):
        return pd.DataFrame(columns=layouts_measured.COLUMNS)
    data = sweep.data()
    return layouts_measured.table([(p.point_id, p.point) for p in sweep.points], stats_frame, data.__getitem__, link)


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
