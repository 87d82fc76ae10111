"""What-if replay: a point re-timed as if its slow ranks ran at the speed of the other ranks
(the median of the others), or its communication were hidden, from the recorded phases alone.

Inputs are per (rank, timed iteration) arrays: compute c (data + h2d + forward + backward
+ update), the `comm` phase x (time in the exchange after backward: transfer plus waiting)
and the iteration's duration d (t_end - t_start); T_i = max_r d is the measured step.

- A rank's speed is s_r = median_i c[r, i]. A rank is replayed at the median speed of the
  OTHER ranks, m_r = median_{q != r} s_q (of an even number of others, the slower of the
  two middle ones: a speed some rank ran at), so that "without the straggler" means the
  same at any rank count: with 2 ranks, the other rank's speed (the median of both, their
  mean, would take the replay only halfway). For every rank that m_r slows down, m_r is one
  number, s_ref: the ((n - 1) // 2)-th smallest of the s_r (n odd: the median rank, as
  before; n even: the lower of the two middle ranks, the attribution's median rank).
  "At the median speed", rank r's compute becomes c[r, i] * min(1, s_ref / s_r): slower
  ranks are scaled down (keeping their iteration-to-iteration variation), faster ones kept.
- Synchronous exchange (all-reduce; parameter servers in synchronous mode): every rank
  waits in the exchange for the last one, so a step lasts max_r c + the transfer + overhead
  and the replayed step is T'_i = T_i - (max_r c[:, i] - max_r c'[:, i]).
- Asynchronous parameter servers: ranks do not wait for each other; each rank's own
  iteration shrinks by its own saving, T'_i = max_r (d - c + c')[:, i].
- Communication hidden: the transfer is the exchange time of the rank that waited least,
  e_i = min_r x[:, i] (the last to arrive does not wait), so T'_i = T_i - e_i; asynchronous,
  T'_i = max_r (d - x)[:, i].

Everything is a vectorised pass over the (ranks, iterations) arrays; replacing one rank uses
the per-iteration largest and second largest values, so each rank costs one pass over the
iterations. Limits: docs/stragglers.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcbench.store.reader import PointData
from hpcbench.store.schema import COMPUTE_PHASES


def asynchronous(p: PointData) -> bool:
    """Whether ranks exchange gradients without waiting for each other: parameter servers that
    apply each rank's gradients as they come (the point's traits `parameter_server` and
    `asynchronous`, store/traits.py), unless the point's `extra.sync` says they wait."""
    traits = p.traits
    return traits.parameter_server and traits.asynchronous and not bool(dict(p.point.extra).get("sync", False))


ROWS_BYTES = 4 << 20  # row_median's partitions, a block of rows at a time


def row_median(x: np.ndarray) -> np.ndarray:
    """The median of each row of a 2-d array (one partition per row, no sort)."""
    n = x.shape[1]
    if n == 0:
        return np.full(x.shape[0], np.nan)
    k = (n - 1) // 2
    out = np.empty(x.shape[0])
    step = max(1, ROWS_BYTES // max(1, n * x.itemsize))  # partition copies: a few MB at a time, reused
    for lo in range(0, x.shape[0], step):
        part = np.partition(x[lo : lo + step], k, axis=1)
        if n % 2:
            out[lo : lo + step] = part[:, k]
        else:  # the next value up is the smallest of those after k: a minimum, not a second partition
            # (partitioning at [k, k + 1] took five times one partition's time)
            out[lo : lo + step] = (part[:, k].astype(np.float64) + part[:, k + 1 :].min(axis=1)) / 2.0
    return out


def median_of(values: np.ndarray) -> float:
    """np.median of all the values (NaN if there are none or one is NaN), without its generic
    machinery: one partition, tens of microseconds less per call, which counts on small points."""
    x = np.asarray(values).reshape(-1)
    n = x.size
    if n == 0:
        return float("nan")
    k = (n - 1) // 2
    part = np.partition(x, k)
    tail = part[k:]
    if np.isnan(tail.max()):  # NaN sorts last: any NaN is in the tail
        return float("nan")
    if n % 2:
        return float(part[k])
    return float((part[k] + tail[1:].min()) / 2)  # in the values' own type, as np.median


@dataclass
class Top2:
    """Per column of a (ranks, iterations) array: the largest value, its rank, the second largest."""

    first: np.ndarray
    rank: np.ndarray
    second: np.ndarray

    @classmethod
    def of(cls, m: np.ndarray) -> Top2:
        rank = np.argmax(m, axis=0)
        cols = np.arange(m.shape[1])
        first = m[rank, cols]
        if m.shape[0] < 2:
            return cls(first, rank, np.full_like(first, -np.inf))
        saved = m[rank, cols].copy()
        m[rank, cols] = -np.inf  # the second largest: the largest once the first is out
        second = m.max(axis=0)
        m[rank, cols] = saved
        return cls(first, rank, second)

    def replaced(self, r: int, row: np.ndarray) -> np.ndarray:
        """Per column, the largest value once rank r's row is `row`."""
        others = np.where(self.rank == r, self.second, self.first)
        return np.asarray(np.maximum(others, row))


@dataclass
class Replay:
    """Per timed iteration step times of each scenario; each rank's speed factor."""

    measured: np.ndarray  # T_i
    factor: np.ndarray  # per rank, min(1, m_r / s_r), m_r the median speed of the other ranks
    all_median: np.ndarray  # every rank at (at most) the median speed of the other ranks
    comm_hidden: np.ndarray  # no transfer time exposed
    synchronous: bool
    _c: np.ndarray  # compute
    _d: np.ndarray  # iteration durations
    _top: Top2  # of c (synchronous) or d (asynchronous)

    def without_each(self, ranks: np.ndarray) -> np.ndarray:
        """Step times, one row per rank of `ranks`, with that rank alone at the other ranks' median speed."""
        c = self._c[ranks]
        saved = c * (1.0 - self.factor[ranks]).astype(c.dtype)[:, None]
        mine = self._top.rank[None, :] == ranks[:, None]
        others = np.where(mine, self._top.second[None, :], self._top.first[None, :])
        if self.synchronous:
            return np.asarray(self.measured - (self._top.first - np.maximum(others, c - saved)), dtype=np.float64)
        return np.asarray(np.maximum(others, self._d[ranks] - saved), dtype=np.float64)

    def without(self, r: int) -> np.ndarray:
        """Step times with rank r alone at the other ranks' median speed."""
        if self.factor[r] >= 1.0:
            return self.measured
        saved = self._c[r] * (1.0 - self.factor[r])
        if self.synchronous:
            return np.asarray(self.measured - (self._top.first - self._top.replaced(r, self._c[r] - saved)))
        return np.asarray(self._top.replaced(r, self._d[r] - saved), dtype=np.float64)


def reference_speed(speed: np.ndarray) -> float:
    """The speed a slow rank is replayed at: the median of the OTHER ranks' speeds (of an even
    number of others, the slower of the two middle ones). For every rank slower than it, that
    is the ((n - 1) // 2)-th smallest of all n speeds: the median rank of an odd count, the
    lower of the two middle ranks of an even count (with 2 ranks, the faster one). NaN if
    there are none or one is NaN."""
    x = np.asarray(speed, dtype=np.float64).reshape(-1)
    if x.size == 0 or np.isnan(x).any():
        return float("nan")
    k = (x.size - 1) // 2
    return float(np.partition(x, k)[k])


def speed_factors(speed: np.ndarray) -> np.ndarray:
    """Per rank, min(1, m_r / s_r) from s_r, each rank's median compute, m_r the median of the
    other ranks' (reference_speed; 1 where s_r is 0)."""
    med = reference_speed(speed)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(speed > 0, med / speed, 1.0)
    return np.asarray(np.minimum(np.nan_to_num(f, nan=1.0), 1.0))


def replay(
    c: np.ndarray, comm: np.ndarray, duration: np.ndarray, synchronous: bool = True, speed: np.ndarray | None = None
) -> Replay:
    """The scenarios of one point from (ranks, iterations) float arrays (float32 is enough);
    `speed`: each rank's median compute, when known already."""
    measured = duration.max(axis=0).astype(np.float64)
    factor = speed_factors(row_median(c) if speed is None else speed)
    scaled = c * factor.astype(c.dtype)[:, None]
    if synchronous:
        top = Top2.of(c)
        all_median = measured - (top.first - scaled.max(axis=0))
        comm_hidden = measured - comm.min(axis=0)
    else:
        top = Top2.of(duration)
        all_median = (duration - c + scaled).max(axis=0)
        comm_hidden = (duration - comm).max(axis=0)
    del scaled
    return Replay(measured, factor, np.asarray(all_median, dtype=np.float64),
                  np.asarray(comm_hidden, dtype=np.float64), synchronous, c, duration, top)  # fmt: skip


def ideal_iterations(iterations: np.ndarray, synchronous: bool = True) -> np.ndarray:
    """The iteration rows (all of them, warm-up included) re-timed with every rank at (at most)
    the median speed of the other ranks (speed_factors): compute phases scaled by each rank's
    factor (from the timed iterations), the time in the exchange and the iteration shortened
    by the step's saving, and every later iteration moved earlier by the savings before it.
    For `hpcbench trace --ideal`."""
    out = np.array(iterations, copy=True)
    if out.size == 0:
        return out
    timed = ~iterations["warmup"].any(axis=0)
    c = np.asarray(sum(iterations[p] for p in COMPUTE_PHASES), dtype=np.float64)
    factor = speed_factors(row_median(c[:, timed])) if timed.any() else np.ones(c.shape[0])
    for p in COMPUTE_PHASES:
        out[p] = iterations[p] * factor[:, None]
    saved = c * (1.0 - factor[:, None])  # each rank's own compute saving
    duration = iterations["t_end"] - iterations["t_start"]
    if synchronous:  # everyone's iteration shrinks by the step's saving; the wait absorbs the difference
        step = (c.max(axis=0) - (c - saved).max(axis=0))[None, :]
        out["comm"] = np.clip(iterations["comm"] - step + saved, 0.0, None)
        shorter = np.broadcast_to(step, c.shape)
    else:
        shorter = saved
    earlier = np.cumsum(shorter, axis=1) - shorter  # savings of the iterations before
    out["t_start"] = iterations["t_start"] - earlier
    out["t_end"] = out["t_start"] + duration - shorter
    return out
