"""Arrays with known contents for the analysis tests (plain numpy, no code under test)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hpcbench.store.schema import COMM_DTYPE, EVAL_DTYPE, ITERATION_DTYPE, RESOURCE_DTYPE


def iterations(
    n_ranks: int,
    n_iters: int,
    *,
    warmup: int = 0,
    data: float = 0.0,
    h2d: float = 0.0,
    forward: float = 0.0,
    backward: float = 0.0,
    comm: float = 0.0,
    update: float = 0.0,
    comm_total: float = 0.0,
    extra: float = 0.0,
    batch: int = 8,
    period: float = 1.0,
) -> np.ndarray:
    """Every rank and iteration with the same phases; t_end - t_start = their sum + extra."""
    a = np.zeros((n_ranks, n_iters), dtype=ITERATION_DTYPE)
    start = np.arange(n_iters) * period
    duration = data + h2d + forward + backward + comm + update + extra
    for r in range(n_ranks):
        a["t_start"][r] = start
        a["t_end"][r] = start + duration
    a["data"], a["h2d"], a["forward"], a["backward"] = data, h2d, forward, backward
    a["comm"], a["update"], a["comm_total"] = comm, update, comm_total
    a["samples"] = batch
    a["warmup"][:, :warmup] = 1
    return a


def comm_rows(rows: Sequence[tuple[int, int, int, float, float]], op: bytes = b"allreduce") -> np.ndarray:
    """(rank, iteration, bytes, t_start, t_end) -> COMM_DTYPE rows (seq names in order)."""
    out = np.zeros(len(rows), dtype=COMM_DTYPE)
    for i, (rank, it, nbytes, t0, t1) in enumerate(rows):
        out[i] = (rank, it, op, str(i).encode(), b"float32", nbytes, t0, t1)
    return out


def resource_rows(rows: Sequence[tuple[int, float, float, float, int]]) -> np.ndarray:
    """(rank, cpu_user, cpu_system, cpu_iowait, rss_bytes) -> RESOURCE_DTYPE rows without a GPU."""
    out = np.zeros(len(rows), dtype=RESOURCE_DTYPE)
    for i, (rank, user, system, iowait, rss) in enumerate(rows):
        out[i] = (rank, float(i), user, system, iowait, rss, np.nan, -1, np.nan, np.nan, -1, -1)
    return out


def eval_rows(rows: Sequence[tuple[int, int, float, float, int, int]]) -> np.ndarray:
    """(rank, epoch, train_time_s, test_time_s, correct, total) -> EVAL_DTYPE rows."""
    out = np.zeros(len(rows), dtype=EVAL_DTYPE)
    for i, (rank, epoch, train, test, correct, total) in enumerate(rows):
        out[i]["rank"], out[i]["epoch"], out[i]["iteration"] = rank, epoch, 10 * epoch
        out[i]["train_time_s"], out[i]["test_time_s"] = train, test
        out[i]["correct"], out[i]["total"], out[i]["loss"] = correct, total, 0.5
    return out
