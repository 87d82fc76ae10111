"""Which iterations are timed, and the evenly spaced sample of them that the analyses of
every message and of every (rank, iteration) cell use on long points.

A column of a point's (ranks, iterations) array is timed unless some rank flagged it as
warm-up. The straggler attribution and the messages' exposure work on at most
`SAMPLE_ITERATIONS` timed iterations: a point with more is analysed on every k-th one (k
the smallest stride that fits), which keeps their cost bounded on long points while the
shares and medians they report stay estimates over thousands of iterations. The exposure
measures the messages of at most MESSAGE_BUDGET of them, thinning those iterations further
(but keeping at least MESSAGE_ITERATIONS; docs/stragglers.md gives the error bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hpcbench.store.schema import COMPUTE_PHASES

SAMPLE_ITERATIONS = 2000
MESSAGE_BUDGET = 1 << 19  # messages whose exposure is measured per point, unless that leaves too few iterations
MESSAGE_ITERATIONS = 500  # ... fewer than this many


def timed_columns(iterations: np.ndarray, limit: int | None = None) -> np.ndarray:
    """The columns of the timed iterations; with `limit`, at most that many, evenly spaced
    (every k-th timed iteration, k the smallest stride that fits)."""
    columns = np.flatnonzero(~iterations["warmup"].any(axis=0))
    return _spaced(columns, limit) if limit else columns


def _spaced(columns: np.ndarray, limit: int) -> np.ndarray:
    """Every k-th of `columns`, k the smallest stride that leaves at most `limit`."""
    stride = -(-columns.size // limit)
    return columns[::stride] if stride > 1 else columns


def message_stride(n_columns: int, per_iteration: float) -> int:
    """Of a sample of `n_columns` iterations with about `per_iteration` messages each, the messages
    of every k-th are measured: k the smallest stride that leaves at most MESSAGE_BUDGET messages,
    but at most the stride that still leaves MESSAGE_ITERATIONS iterations (all of them when the
    sample has no more)."""
    wanted = -(-int(np.ceil(per_iteration * n_columns)) // MESSAGE_BUDGET)
    return max(1, min(wanted, n_columns // MESSAGE_ITERATIONS))


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


BLOCK_PHASES = (*COMPUTE_PHASES, "comm")  # the rows of SampleArrays.block, then compute
BLOCK_BYTES = 1 << 20  # records read a block of ranks at a time: the block stays in the cache


@dataclass
class SampleArrays:
    """What the exposure and the straggler attribution read of a sample's rows, each read out
    of the records once: per rank and column, when backward ended (float64, t_start + data +
    h2d + forward + backward in that order), the iteration's duration (float64, t_end -
    t_start), and `block`, float32 (len(BLOCK_PHASES) + 1, ranks, columns): each phase of
    BLOCK_PHASES, then compute (data + h2d + forward + backward + update, added in that order)."""

    backward_end: np.ndarray
    duration: np.ndarray
    block: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray) -> SampleArrays:
        # A block of ranks at a time, so that each record (81 bytes, every field read alone
        # touches every cache line) comes from memory once rather than once per field; the
        # outputs are allocated once (fresh pages cost a fault each on first touch).
        shape = rows.shape
        bwd, duration = np.empty(shape), np.empty(shape)
        block = np.empty((len(BLOCK_PHASES) + 1, *shape), dtype=np.float32)
        step = max(1, BLOCK_BYTES // max(1, shape[1] * rows.dtype.itemsize))
        for lo in range(0, shape[0], step):
            part, at = rows[lo : lo + step], slice(lo, lo + step)
            start = part["t_start"]
            np.subtract(part["t_end"], start, out=duration[at])
            out = bwd[at]
            np.add(start, part["data"], out=out)
            for name in ("h2d", "forward", "backward"):
                out += part[name]
            for k, name in enumerate(BLOCK_PHASES):
                block[k, at] = part[name]
            compute = block[-1, at]
            np.add(block[0, at], block[1, at], out=compute)
            for k in range(2, len(COMPUTE_PHASES)):
                compute += block[k, at]
        return cls(bwd, duration, block)


@dataclass
class Sample:
    """The timed iterations a point is analysed on (at most SAMPLE_ITERATIONS): their column
    indices and their rows, (ranks, len(columns)), a view where they are evenly spaced. Taken
    once per point and shared by the exposure and the straggler attribution, with the arrays
    both read (`arrays`, read out of the records once)."""

    columns: np.ndarray
    rows: np.ndarray
    sampled: bool  # whether some timed iterations were left out

    @cached_property
    def arrays(self) -> SampleArrays:
        return SampleArrays.of(self.rows)

    @classmethod
    def of(cls, iterations: np.ndarray) -> Sample:
        every = timed_columns(iterations)
        columns = _spaced(every, SAMPLE_ITERATIONS)
        return cls(columns, columns_of(iterations, columns), columns.size < every.size)
