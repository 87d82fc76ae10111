"""Arrays with known contents for the analysis tests (plain numpy, no code under test)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hpcbench.spec import Point
from hpcbench.store.schema import COMM_DTYPE, EVAL_DTYPE, ITERATION_DTYPE, RESOURCE_DTYPE
from hpcbench.testing.fabricate import write_point_file


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


MIB = 2**20
BATCH = 8

# ------------------------------------------------------------------------------------
# A configuration that follows the model exactly: two layers, ring all-reduce over a link.
ALPHA, BETA = 2e-4, 1e-8  # link α (s), β (s/byte)
TB = (0.004, 0.006)  # backward of layer 1, layer 2
BYTES = (4e5, 1e6)  # gradient bytes of layer 1, layer 2
DATA, FORWARD, UPDATE = 0.001, 0.01, 0.002


def hand_schedule(n: int) -> tuple[float, float, tuple[float, float]]:
    """(exposed comm, total comm, (tc1, tc2)) at n ranks, worked out by hand for two layers."""
    if n == 1:
        return 0.0, 0.0, (0.0, 0.0)
    a, b = 2 * (n - 1) * ALPHA, 2 * (n - 1) / n * BETA  # ring all-reduce: tc(M) = a + b·M
    tc1, tc2 = a + b * BYTES[0], a + b * BYTES[1]
    tau_c1 = max(TB[1] + tc2, TB[1] + TB[0])  # τc[2] = τb[2] + tb[2] = tb[2]
    exposed = tau_c1 + tc1 - (TB[1] + TB[0])
    return exposed, tc1 + tc2, (tc1, tc2)


def model_point(directory: Path, n: int) -> tuple[Point, float]:
    exposed, total, (tc1, tc2) = hand_schedule(n)
    it = iterations(n, 12, warmup=2, data=DATA, forward=FORWARD, backward=sum(TB), comm=exposed, update=UPDATE,
                    comm_total=total, batch=BATCH)  # fmt: skip
    rows = []
    if n > 1:
        for r in range(n):
            for i in range(12):
                start = it["t_start"][r, i] + DATA + FORWARD
                rows.append((r, i, int(BYTES[1]), start + TB[1], start + TB[1] + tc2))  # layer 2 first
                end = start + max(TB[1] + tc2, TB[1] + TB[0]) + tc1
                rows.append((r, i, int(BYTES[0]), start + TB[1] + TB[0], end))
    point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=n, batch_size=BATCH)
    write_point_file(directory / f"{point.id}.h5", point, it, comm=comm_rows(rows) if rows else None)
    return point, DATA + FORWARD + sum(TB) + exposed + UPDATE
