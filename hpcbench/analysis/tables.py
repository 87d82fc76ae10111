"""Reading a sweep directory into tables: points, samples (point × rank × iteration), stats.

- `points`: one row per point file: every Point field, its id, its repeat group (`config`),
  rank count, hosts, the file.
- `samples`: the iteration records of every rank of every point, tidy (built on demand:
  it is the largest table and no metric needs it, they work on the arrays directly).
- `stats`: one row per point: the metrics (metrics.py), resources (resources.py),
  accuracy (accuracy.py), the workload's figures (workload.py) and energy (energy.py).

Derived from these: `repeats` (mean and confidence interval over seeds, stats.py) and
`evaluations` (point × evaluation). This module reads and tabulates only: the model, its
validation and the stragglers run in `pipeline.py`, so `compare` and `export` need none of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcbench.analysis import accuracy, energy, metrics, resources, stats, workload
from hpcbench.analysis.placement import placement_of
from hpcbench.analysis.stragglers.exposure import Exposure
from hpcbench.errors import HpcbenchError
from hpcbench.spec import FIELD_NAMES
from hpcbench.store import schema
from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.layout import RESULT_SUFFIX, SweepDir, is_attempt

FileHook = Callable[[int, int], None]  # (files read, files in all)


@dataclass
class SweepData:
    directory: Path
    points: list[PointData] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def point_files(directory: Path) -> list[Path]:
    return SweepDir(directory).results()  # earlier attempts kept aside are not points


def attempts_of(directory: Path) -> dict[str, int]:
    """Point id -> how many earlier attempts of it are kept aside (`<id>.attempt<N>.h5`)."""
    counts: dict[str, int] = {}
    for path in directory.glob(f"*.attempt*{RESULT_SUFFIX}"):
        if is_attempt(path):
            key = path.name.partition(".")[0]
            counts[key] = counts.get(key, 0) + 1
    return counts


def load(directory: Path | str, on_file: FileHook | None = None) -> SweepData:
    """Every complete point file of a sweep; the others are skipped with a warning.

    A point run more than once (stopped or failed, then resumed or requeued) keeps its earlier
    attempts aside; only its last, complete attempt is read, with a warning. The attempts are
    not joined: a rerun starts again at iteration 0 (no framework here resumes from a
    checkpoint), with its own warm-up, processes, placement and clock epoch, so its
    iterations repeat the earlier ones rather than continue them.

    `on_file(done, total)` is called after each file is read (for progress displays).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise HpcbenchError(f"{directory}: no such sweep directory")
    data = SweepData(directory)
    attempts = attempts_of(directory)
    files = point_files(directory)
    for done, path in enumerate(files):
        if on_file is not None:
            on_file(done, len(files))
        point = read_checked(path, data.warnings)
        if point is not None:
            data.warnings.extend(attempt_warnings(path, attempts))
            data.points.append(point)
    if on_file is not None:
        on_file(len(files), len(files))
    return data


def read_checked(path: Path, warnings: list[str]) -> PointData | None:
    """The point file at `path` where it is complete, else None and a warning saying why not."""
    try:
        point = read_point(path)
    except HpcbenchError as exc:
        warnings.append(f"skipped {path.name}: {exc}")
        return None
    if point.stopped:
        done, planned = point.iterations.shape[1], point.attrs.get("n_iterations", "?")
        why = point.attrs.get("stop_reason") or "no reason recorded"
        warnings.append(
            f"skipped {path.name}: stopped ({why}) after {done} of {planned} iterations, not complete; "
            "`resume` reruns it"
        )
        return None
    if point.status == schema.STATUS_OOM:  # a result, not a failure: listed with the memory it reached
        # `point ID: ...`: the report groups the points that ran out of memory into one note
        warnings.append(f"point {path.stem}: {point.point.label()}: {out_of_memory_line(point.attrs)} (no timings)")
        return None
    if not point.complete:
        warnings.append(f"skipped {path.name}: status {point.status or 'unknown'}, not complete")
        return None
    if point.iterations.size == 0:
        warnings.append(f"skipped {path.name}: no iterations recorded")
        return None
    return point


def out_of_memory_line(attrs: dict[str, Any]) -> str:
    """`out of memory: rank 1 in step at iteration 0, peak RSS 0.97 GiB (limit 1.00 GiB)`, from
    an out_of_memory file's `oom_*` attributes (docs/point-file.md)."""
    gib = 2**30
    where = f"rank {attrs.get('oom_rank', '?')} in {attrs.get('oom_phase', '?')}"
    if int(attrs.get("oom_iteration", -1)) >= 0:
        where += f" at iteration {attrs['oom_iteration']}"
    reached = f"peak RSS {int(attrs.get('oom_peak_rss_bytes', 0)) / gib:.2f} GiB"
    if int(attrs.get("oom_device_peak_bytes", -1)) >= 0:
        reached += f", device peak {int(attrs['oom_device_peak_bytes']) / gib:.2f} GiB"
    if int(attrs.get("oom_limit_bytes", -1)) >= 0:
        reached += f" (limit {int(attrs['oom_limit_bytes']) / gib:.2f} GiB)"
    return f"out of memory: {where}, {reached}"


def attempt_warnings(path: Path, attempts: dict[str, int]) -> list[str]:
    """The warning on a complete point with earlier attempts kept aside (`attempts_of`), if it has any."""
    if n := attempts.get(path.stem):
        return [
            f"{path.name}: its last, complete attempt only; {n} earlier incomplete attempt(s) kept aside are "
            "not joined to it (a rerun starts again at iteration 0, it does not continue them)"
        ]
    return []


def samples_table(points: list[PointData]) -> pd.DataFrame:
    """One row per point x rank x iteration (the iteration records, tidy), plus `duration`."""
    frames = []
    for p in points:
        n_ranks, n_iters = p.iterations.shape
        flat = p.iterations.reshape(-1)
        rank_ids = p.ranks["rank"][:n_ranks] if len(p.ranks) >= n_ranks else np.arange(n_ranks)
        columns: dict[str, object] = {
            "point": np.full(flat.size, p.point_id, dtype=object),
            "rank": np.repeat(np.asarray(rank_ids, dtype=np.int32), n_iters),
            "iteration": np.tile(np.arange(n_iters, dtype=np.int32), n_ranks),
        }
        columns.update({name: flat[name] for name in flat.dtype.names or ()})
        frame = pd.DataFrame(columns)
        frame["duration"] = frame["t_end"] - frame["t_start"]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def listing_row(p: PointData) -> dict[str, object]:
    """One row of the points table: fields (mappings as JSON text), id, repeat group, ranks, hosts, file."""
    fields = p.point.as_dict()
    row: dict[str, object] = {"point": p.point_id, "config": stats.config_id(p.point)}
    for name in sorted(FIELD_NAMES):
        value = fields[name]
        row[name] = json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
    row["ranks"] = int(p.iterations.shape[0])
    row["hosts"] = len(set(p.hostnames))
    row["file"] = str(p.path)
    blas = p.provenance.get("blas")
    if isinstance(blas, list):
        row["blas"] = " ".join(sorted({str(b.get("internal_api")) for b in blas if isinstance(b, dict)}))
    return row


def points_table(points: list[PointData]) -> pd.DataFrame:
    """One row per point (`listing_row`)."""
    return pd.DataFrame([listing_row(p) for p in points])


def stats_table(
    points: list[PointData], target_accuracy: float | None = None, exposures: dict[str, Exposure] | None = None
) -> pd.DataFrame:
    """One row per point: metrics, resources and accuracy, with speedup and efficiency;
    `exposures`: each point's measured communication (exposure.py) by id, else measured here."""
    known = exposures or {}
    comms = [known.get(p.point_id, p.comm) for p in points]
    table = metrics.summary([(p.point, p.point_id, p.iterations) for p in points], comms)
    if table.empty:
        return table
    extra = []
    for p in points:
        row: dict[str, object] = {"point": p.point_id, "config": stats.config_id(p.point), "seed": p.point.seed}
        row.update(resources.of_point(p))
        row.update(accuracy.accuracy_row(p.eval, p.iterations, target_accuracy))
        row["oversubscribed"] = placement_of(p).oversubscribed
        extra.append(row)
    table = workload.add(table.merge(pd.DataFrame(extra), on="point", how="left"), points)
    return energy.add(table, points)  # what the energy counters read over the timed window


def evaluations_table(points: list[PointData]) -> pd.DataFrame:
    """One row per point x evaluation."""
    frames = []
    for p in points:
        frame = accuracy.evaluations(p.eval)
        if not frame.empty:
            frame.insert(0, "point", p.point_id)
            frames.append(frame)
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["point", *accuracy.EVALUATION_COLUMNS])
    )
