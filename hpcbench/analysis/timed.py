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
from functools import cached_property

import numpy as np

from hpcbench.store.schema import PHASES

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
    """The iteration rows of `columns`: a view when they are evenly spaced (one block, or every
    k-th of one), else a copy."""
    if columns.size > 1:
        step = int(columns[1] - columns[0])
        if step > 0 and columns[-1] - columns[0] == step * (columns.size - 1) and (np.diff(columns) == step).all():
            return iterations[:, columns[0] : columns[-1] + 1 : step]
    elif columns.size == 1:
        return iterations[:, columns[0] : columns[0] + 1]
    return np.take(iterations, columns, axis=1)  # a third of fancy indexing's time on records


FIELDS = ("t_start", "t_end", *PHASES)  # the float fields the analyses of a sample read
BLOCK_BYTES = 1 << 20  # records copied field by field a block of ranks at a time: the block stays in the cache


def float_fields(rows: np.ndarray, names: tuple[str, ...] = FIELDS) -> dict[str, np.ndarray]:
    """Contiguous float64 copies of the fields `names` of the (ranks, n) records `rows`. Copied a
    block of ranks at a time, so that each record is read from memory once rather than once per
    field (records of 81 bytes: every field read alone touches every cache line)."""
    out = {name: np.empty(rows.shape, dtype=np.float64) for name in names}
    block = max(1, BLOCK_BYTES // max(1, rows.shape[1] * rows.dtype.itemsize))
    for lo in range(0, rows.shape[0], block):
        part = rows[lo : lo + block]
        for name in names:
            out[name][lo : lo + block] = part[name]
    return out


@dataclass
class Sample:
    """The timed iterations a point is analysed on (at most SAMPLE_ITERATIONS): their column
    indices and their rows, (ranks, len(columns)), a view where they are evenly spaced. Taken
    once per point and shared by the exposure and the straggler attribution, with the float
    fields both read (`fields`, copied once)."""

    columns: np.ndarray
    rows: np.ndarray
    sampled: bool  # whether some timed iterations were left out

    @cached_property
    def fields(self) -> dict[str, np.ndarray]:
        """FIELDS of `rows` as contiguous float64 (ranks, len(columns)) arrays."""
        return float_fields(self.rows)

    @classmethod
    def of(cls, iterations: np.ndarray) -> Sample:
        every = timed_columns(iterations)
        columns = _spaced(every, SAMPLE_ITERATIONS)
        return cls(columns, columns_of(iterations, columns), columns.size < every.size)
