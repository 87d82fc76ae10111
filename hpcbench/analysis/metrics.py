"""Metrics exactly as the project defines them (see README, "Metrics").

Arrays are the stored `iterations` records, shape (n_ranks, n_iterations); every function
is vectorised over ranks and iterations and uses the timed (non-warm-up) iterations only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from hpcbench.analysis.stats import CV_WARNING, MIN_TIMED, id_of, point_warnings
from hpcbench.analysis.stragglers import exposure
from hpcbench.analysis.stragglers.timed import columns_of, timed_columns
from hpcbench.spec import Point
from hpcbench.store.schema import COMPUTE_PHASES, PHASES

__all__ = ["CV_WARNING", "MIN_TIMED"]


def timed(iterations: np.ndarray) -> np.ndarray:
    """The non-warm-up iterations (a column is warm-up if any rank flagged it)."""
    return columns_of(iterations, timed_columns(iterations))  # one block (warm-up first): a view


def step_times(iterations: np.ndarray) -> np.ndarray:
    """Per timed iteration, the ranks' mean t_end - t_start: shape (n_timed,).

    Each rank's iterations follow one another, so its times add up to its wall time and the
    mean over ranks is the step's period however far the ranks' iterations are offset from
    one another. (The slowest rank's time of each iteration is not: when time-shared ranks
    start and end their iterations milliseconds apart, each iteration's maximum picks a
    different rank's longest window, and their sum exceeds the wall time.)"""
    return _step_times(timed(iterations))


def _step_times(t: np.ndarray) -> np.ndarray:
    """`step_times` of the timed iterations `t` (each function below taking `t` reads the
    warm-up flags of a large point's records once instead of once per metric)."""
    return np.asarray((t["t_end"] - t["t_start"]).mean(axis=0))


def t_iter(iterations: np.ndarray) -> float:
    """Median over timed iterations of the ranks' mean iteration time (seconds)."""
    times = step_times(iterations)
    return float(np.median(times)) if times.size else float("nan")


def data_ranks(point: Point, n_ranks: int) -> int:
    """Of a point's `n_ranks` ranks, the batches of `batch_size` an iteration reads: one per rank
    and device it drives (`devices_per_rank`), but only one per tensor-parallel group and
    pipeline (spec/parallel.py), whose ranks share a batch."""
    layout = point.layout
    ranks = max(n_ranks // (layout.tp * layout.pp), 1) if point.parallel else n_ranks
    return ranks * point.devices_per_rank


def throughput(n_ranks: int, batch_size: int, t_iteration: float) -> float:
    """Samples per second, N * b / t_iter (NaN when t_iter is not a positive time)."""
    return n_ranks * batch_size / t_iteration if t_iteration > 0 else float("nan")


def compute_time(iterations: np.ndarray) -> np.ndarray:
    """Per rank and timed iteration, the time not spent waiting in communication."""
    return _compute_time(timed(iterations))


def _compute_time(t: np.ndarray) -> np.ndarray:
    return np.asarray(sum(t[phase] for phase in COMPUTE_PHASES))


def load_imbalance(iterations: np.ndarray) -> tuple[float, float]:
    """(LIF, excess): means over timed iterations of max_r c / mean_r c and (max_r c - mean_r c) / mean_r c."""
    return _load_imbalance(timed(iterations))


def _load_imbalance(t: np.ndarray) -> tuple[float, float]:
    c = _compute_time(t)
    mean = c.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # no compute at all: NaN, not a warning
        ratio = c.max(axis=0) / mean
    return float(ratio.mean()), float((ratio - 1.0).mean())


def phase_means(iterations: np.ndarray) -> dict[str, float]:
    """Mean seconds per phase (and comm_total) over ranks and timed iterations."""
    return _phase_means(timed(iterations))


def _phase_means(t: np.ndarray) -> dict[str, float]:
    return {name: float(t[name].mean()) for name in (*PHASES, "comm_total")}


def variation(iterations: np.ndarray) -> float:
    """Coefficient of variation of the step times."""
    times = step_times(iterations)
    return float(times.std() / times.mean()) if times.size > 1 else float("nan")


Messages = np.ndarray | exposure.Exposure | None  # a point's messages, or their exposure measured already


def point_row(point: Point, point_id: str, iterations: np.ndarray, comm: Messages = None) -> dict[str, object]:
    """All per-point metrics of one point file; `comm`: its messages or their exposure (for the
    union and exposed communication shares, else NaN)."""
    n_ranks = iterations.shape[0]
    rows = timed(iterations)
    steps = _step_times(rows)
    t = float(np.median(steps)) if steps.size else float("nan")
    lif, excess = _load_imbalance(rows)
    phases = _phase_means(rows)
    row: dict[str, object] = {
        "point": point_id,
        "framework": point.framework,
        "backend": point.backend,
        "env": point.env or "",
        "launcher": point.launcher,
        "model": point.model,
        "device": point.device,
        "nodes": point.nodes,
        "ranks_per_node": point.ranks_per_node,
        "ranks": n_ranks,
        "batch_size": point.batch_size,
        "timed_iterations": int(rows.shape[1]),
        "t_iter_s": t,
        "throughput": throughput(data_ranks(point, n_ranks), point.batch_size, t),
        "lif": lif,
        "lif_excess": excess,
        "cv": float(steps.std() / steps.mean()) if steps.size > 1 and steps.mean() > 0 else float("nan"),
        "step_mean_s": float(steps.mean()) if steps.size else float("nan"),
        "step_min_s": float(steps.min()) if steps.size else float("nan"),
        "step_max_s": float(steps.max()) if steps.size else float("nan"),
    }
    row.update({f"{name}_s": value for name, value in phases.items()})
    row["comm_share"] = phases["comm_total"] / t if t > 0 else float("nan")  # NaN t: NaN share too
    shares = comm_shares(iterations, comm, t)
    row.update(shares)
    row["overlap"] = overlap(shares["comm_union_share"], shares["comm_exposed_share"])
    return row


def overlap(union_share: float, exposed_share: float) -> float:
    """The share of the time messages were in flight that backward hid: 1 − exposed / in
    flight, in [0, 1]; NaN without messages. Not 1 − comm_s / comm_total_s: summed durations
    count concurrent messages (and their time queued) more than once, and the comm phase
    holds the wait for slower ranks and the backend's own work, which no message covers."""
    if not union_share > 0:
        return float("nan")
    return 1.0 - min(exposed_share / union_share, 1.0)


def comm_shares(iterations: np.ndarray, comm: Messages, t: float) -> dict[str, float]:
    """comm_union_share (time any message was in flight) and comm_exposed_share (in flight after
    backward ended), means over ranks and timed iterations divided by t_iter (exposure.py)."""
    nan = float("nan")
    if comm is None or not t > 0:
        return {"comm_union_share": nan, "comm_exposed_share": nan}
    measured = comm if isinstance(comm, exposure.Exposure) else exposure.of(iterations, comm, buckets=False)
    return {"comm_union_share": measured.union_s / t, "comm_exposed_share": measured.exposed_s / t}


def scaling_group(point: Point) -> str:
    """Points that differ only in scale (nodes, ranks per node, batch size) or repeat (seed) share
    a key (found once per point: the tables and the model ask it of every point, again and again)."""
    try:
        return _scaling_group(point)
    except TypeError:  # a field that does not hash (a Point built with a list)
        return dataclasses.replace(point, nodes=1, ranks_per_node=1, batch_size=1, seed=0).id


@functools.lru_cache(maxsize=65536)
def _scaling_group(point: Point) -> str:
    return id_of(dataclasses.replace(point, nodes=1, ranks_per_node=1, batch_size=1, seed=0))


def add_scaling(table: pd.DataFrame, points: Sequence[Point]) -> pd.DataFrame:
    """speedup S(N) = X(N) / X(1), efficiency E(N) = X(N) / (N X(1)), and the scaling kind.

    X(1) is the one-rank point of the same configuration with the same per-rank batch
    (weak scaling) or, failing that, with the same global batch N * b (strong scaling);
    with repeats (seeds) of the one-rank point, the mean of their throughputs.
    Without such a point both stay empty.
    """
    table = table.copy()
    keys = [scaling_group(p) for p in points]
    rows = list(zip(table["ranks"].tolist(), table["batch_size"].tolist(), table["throughput"].tolist(), strict=True))
    runs: dict[tuple[str, int], list[float]] = {}
    for key, (ranks, batch, rate) in zip(keys, rows, strict=True):
        if ranks == 1:
            runs.setdefault((key, int(batch)), []).append(float(rate))
    base = {k: float(np.mean(v)) for k, v in runs.items()}
    speedup, kind = [], []
    for key, (ranks, batch, rate) in zip(keys, rows, strict=True):
        n, b = int(ranks), int(batch)
        if n == 1:
            reference, label = base.get((key, b)), "baseline"
        elif (key, b) in base:
            reference, label = base[(key, b)], "weak"
        elif (key, n * b) in base:
            reference, label = base[(key, n * b)], "strong"
        else:
            reference, label = None, ""
        speedup.append(float(rate) / reference if reference else float("nan"))
        kind.append(label)
    table["speedup"] = speedup
    table["efficiency"] = table["speedup"] / table["ranks"]
    table["scaling"] = kind
    return table


SUMMARY_COLUMNS = [
    "point", "framework", "backend", "env", "launcher", "model", "device", "nodes", "ranks_per_node", "ranks",
    "batch_size", "timed_iterations", "t_iter_s", "throughput", "speedup", "efficiency", "scaling", "lif",
    "lif_excess", "cv", *(f"{p}_s" for p in PHASES), "comm_total_s", "comm_share", "comm_union_share",
    "comm_exposed_share", "overlap",
    "step_mean_s", "step_min_s", "step_max_s",
]  # fmt: skip


def names_environments(table: pd.DataFrame) -> bool:
    """Whether some point of a summary names its environment: tables then show `env`, since
    points alike in every other column (Theano 1.0.5 and PyTensor) would look the same."""
    return "env" in table and bool(table["env"].fillna("").astype(bool).any())


def summary(points: Sequence[tuple[Point, str, np.ndarray]], comms: Sequence[Messages] | None = None) -> pd.DataFrame:
    """One row per point, sorted by configuration then scale; `comms`: each point's messages
    (or their exposure)."""
    if not points:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    messages: list[Messages] = list(comms) if comms is not None else [None] * len(points)
    table = pd.DataFrame([point_row(p, pid, it, c) for (p, pid, it), c in zip(points, messages, strict=True)])
    table = add_scaling(table, [p for p, _, _ in points])
    order = ["framework", "backend", "env", "launcher", "model", "device", "batch_size", "nodes", "ranks"]
    return table[SUMMARY_COLUMNS].sort_values(order, kind="stable").reset_index(drop=True)


def warnings_for(table: pd.DataFrame) -> list[str]:
    """pyperf-style notes on numbers that should not be trusted as they are (see stats.point_warnings)."""
    return point_warnings(table)
