"""Reading a sweep directory into tables."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData, read_point

_ASIDE = re.compile(r"\.attempt\d+$")  # earlier incomplete attempts kept by the executor


@dataclass
class SweepData:
    directory: Path
    points: list[PointData] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def point_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.h5") if not _ASIDE.search(p.stem))


def load(directory: Path | str) -> SweepData:
    """Every complete point file of a sweep; the others are skipped with a warning."""
    directory = Path(directory)
    if not directory.is_dir():
        raise HpcbenchError(f"{directory}: no such sweep directory")
    data = SweepData(directory)
    for path in point_files(directory):
        try:
            point = read_point(path)
        except HpcbenchError as exc:
            data.warnings.append(f"skipped {path.name}: {exc}")
            continue
        if not point.complete:
            data.warnings.append(f"skipped {path.name}: status {point.status or 'unknown'}, not complete")
            continue
        if point.iterations.size == 0:
            data.warnings.append(f"skipped {path.name}: no iterations recorded")
            continue
        data.points.append(point)
    return data


def samples_table(points: list[PointData]) -> pd.DataFrame:
    """One row per point x rank x iteration (the iteration records, tidy)."""
    frames = []
    for p in points:
        n_ranks, n_iters = p.iterations.shape
        frame = pd.DataFrame(p.iterations.reshape(-1))
        frame.insert(0, "iteration", list(range(n_iters)) * n_ranks)
        frame.insert(0, "rank", [r for r in range(n_ranks) for _ in range(n_iters)])
        frame.insert(0, "point", p.point_id)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
