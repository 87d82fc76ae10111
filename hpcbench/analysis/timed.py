"""Which iterations are timed, and the evenly spaced sample of them that the analyses of
every message and of every (rank, iteration) cell use on long points.

A column of a point's (ranks, iterations) array is timed unless some rank flagged it as
warm-up. The straggler attribution and the messages' exposure work on at most
`SAMPLE_ITERATIONS` timed iterations: a point with more is analysed on every k-th one (k
the smallest stride that fits), which keeps their cost bounded on long points while the
shares and medians they report stay estimates over thousands of iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLE_ITERATIONS = 2000


def timed_columns(iterations: np.ndarray, limit: int | None = None) -> np.ndarray:
    """The columns of the timed iterations; with `limit`, at most that many, evenly spaced
    (every k-th timed iteration, k the smallest stride that fits)."""
    columns = np.flatnonzero(~iterations["warmup"].any(axis=0))
    return _spaced(columns, limit) if limit else columns


def _spaced(columns: np.ndarray, limit: int) -> np.ndarray:
    """Every k-th of `columns`, k the smallest stride that leaves at most `limit`."""
    stride = -(-columns.size // limit)
    return columns[::stride] if stride > 1 else columns


def columns_of(iterations: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """The iteration rows of `columns`: a view when they are one block, else a copy."""
    if columns.size and columns[-1] - columns[0] + 1 == columns.size:
        return iterations[:, columns[0] : columns[-1] + 1]
    return np.take(iterations, columns, axis=1)  # a third of fancy indexing's time on records


@dataclass
class Sample:
    """The timed iterations a point is analysed on (at most SAMPLE_ITERATIONS): their column
    indices and their rows, (ranks, len(columns)), a view where they are one block. Taken once
    per point and shared by the exposure and the straggler attribution."""

    columns: np.ndarray
    rows: np.ndarray
    sampled: bool  # whether some timed iterations were left out

    @classmethod
    def of(cls, iterations: np.ndarray) -> Sample:
        every = timed_columns(iterations)
        columns = _spaced(every, SAMPLE_ITERATIONS)
        return cls(columns, columns_of(iterations, columns), columns.size < every.size)
