"""Fitting the model's parameters: α and β from messages, layers from a trace.

Messages come from a point file's `comm` table or from `python -m hpcbench.commbench`.
A message's cost is taken as the time the backend spent on it: backends run one rank's
collectives one after another, so a message handed over while an earlier one is still
running waits; its service time starts when it was handed over or when the previous
message of that rank ended, whichever is later. Of the ranks' service times of one
message (same iteration, same position in the iteration) the shortest is kept: the rank
that arrived last waited least for its peers, so its time is closest to the transfer itself.

Where a backend's ends are *seen in a wait* (the point's provenance says `comm_end: wait`:
the rank waits for its messages in the order it started them once backward is over, as
torch's MPI and Horovod exchanges and JAX do), an end is the moment the wait returned it,
not the moment the backend completed it: a message started early in backward seems to last
until backward ends, however short it was. Its service is then counted from when the rank
began to wait (its backward's end, `wait_starts`) at the earliest: the time the rank spent
on it, which is all of it where the library makes progress only inside the wait (MPI's
non-blocking collectives without a progress thread), and a lower bound where a background
thread ran part of it during backward (Horovod).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import LinkCost, MessageCost, ModelError
from hpcbench.analysis.model.iteration import Layer


@dataclass(frozen=True)
class Fit:
    """tc(M) = alpha + beta·M fitted by least squares on `n` messages."""

    alpha: float
    beta: float
    n: int
    r2: float

    @property
    def cost(self) -> MessageCost:
        return MessageCost(self.alpha, self.beta)


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min ||a·x0 + b·x1 − y|| with a, b >= 0: least squares, and where a coefficient comes out
    negative (noise on a flat or tiny range), the best fit with it held at 0."""
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    candidates = []
    for col in (0, 1):
        v = x[:, col]
        coef = max(float(v @ y) / float(v @ v), 0.0) if float(v @ v) > 0 else 0.0
        pair = (coef, 0.0) if col == 0 else (0.0, coef)
        candidates.append((float(((x @ np.array(pair) - y) ** 2).sum()), pair))
    return min(candidates)[1]


def fit_alpha_beta(n_bytes: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray) -> Fit:
    """α and β (both >= 0) of tc(M) = α + β·M by least squares."""
    m = np.asarray(n_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    keep = np.isfinite(m) & np.isfinite(t)
    m, t = m[keep], t[keep]
    if len(m) == 0:
        raise ModelError("no messages to fit α and β on")
    if len(np.unique(m)) < 2:  # one size: α and β cannot be told apart; all of it is β·M
        beta = float(t.mean() / m[0]) if m[0] > 0 else 0.0
        alpha = 0.0 if m[0] > 0 else float(t.mean())
        return Fit(alpha, beta, len(m), float("nan"))
    alpha, beta = _nonneg_lstsq(np.column_stack([np.ones_like(m), m]), t)
    return Fit(alpha, beta, len(m), _r2(t, alpha + beta * m))


def fit_ring_link(ranks: Sequence[int] | np.ndarray, n_bytes: Sequence[float] | np.ndarray,
                  seconds: Sequence[float] | np.ndarray) -> LinkCost:  # fmt: skip
    """The link α, β of ring all-reduce, 2(p−1)α + 2M(p−1)/p·β, fitted jointly over several rank counts."""
    p = np.asarray(ranks, dtype=float)
    m = np.asarray(n_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    keep = (p >= 2) & np.isfinite(m) & np.isfinite(t)
    if not keep.any():
        raise ModelError("no all-reduce between >= 2 ranks to fit a link cost on")
    p, m, t = p[keep], m[keep], t[keep]
    x = np.column_stack([2 * (p - 1), 2 * m * (p - 1) / p])
    alpha, beta = _nonneg_lstsq(x, t)
    return LinkCost(alpha, beta)


def fit_rules_link(
    rules: str, p: int, n_bytes: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray
) -> LinkCost:
    """The link α, β (>= 0) of messages that an MPI library's MPI_Allreduce ran on p ranks, each
    by the algorithm its size chose (mpi_rules.py: a·α + b·M·β, γ folded into β), by least squares."""
    m = np.asarray(n_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    keep = np.isfinite(m) & np.isfinite(t)
    m, t = m[keep], t[keep]
    if len(m) == 0 or p < 2:
        raise ModelError("no all-reduce between >= 2 ranks to fit a link cost on")
    alpha, beta = _nonneg_lstsq(mpi_rules.design(rules, m, np.full(len(m), p)), t)
    return LinkCost(alpha, beta)


MAX_ITERATIONS = 200  # messages of at most this many timed iterations (evenly spaced) are fitted


def spread(indices: np.ndarray, limit: int | None = MAX_ITERATIONS) -> np.ndarray:
    """At most `limit` of `indices`, evenly spaced (all of them when there are fewer)."""
    if limit is None or len(indices) <= limit:
        return indices
    chosen: np.ndarray = indices[np.linspace(0, len(indices) - 1, limit).round().astype(int)]
    return chosen


def timed_messages(comm: np.ndarray, timed: np.ndarray, limit: int | None = MAX_ITERATIONS) -> np.ndarray:
    """The messages of at most `limit` timed iterations (evenly spaced); `timed` is a mask over iterations."""
    if len(comm) == 0:
        return comm
    return _select(comm, spread(np.flatnonzero(timed), limit))


def _select(comm: np.ndarray, iterations: np.ndarray | None) -> np.ndarray:
    """The rows of `comm` whose iteration is in `iterations` (all rows for None)."""
    if iterations is None:
        return comm
    top = int(max(comm["iteration"].max(), iterations.max(initial=0))) + 1
    keep = np.zeros(top, dtype=bool)
    keep[iterations] = True
    selected: np.ndarray = comm[keep[comm["iteration"]]]
    return selected


def _sorted_groups(rank: np.ndarray, iteration: np.ndarray, t_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order sorting rows by rank, iteration, t_start; each sorted row's position in its (rank, iteration))."""
    order = np.lexsort((t_start, iteration, rank))
    r, i = rank[order], iteration[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (r[1:] != r[:-1]) | (i[1:] != i[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(order)))
    seq = np.arange(len(order)) - np.repeat(starts, counts)
    return order, seq


def wait_starts(iterations: np.ndarray) -> np.ndarray:
    """(ranks, iterations): when each rank's backward ended and its wait for the exchange began
    (seconds since the file's epoch, as the comm table's times)."""
    phases = ("t_start", "data", "h2d", "forward", "backward")
    began: np.ndarray = np.sum([iterations[name] for name in phases], axis=0)
    return began


def message_costs(comm: np.ndarray, timed_iterations: np.ndarray | None = None,
                  limit: int | None = MAX_ITERATIONS, waits: np.ndarray | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per message (op, iteration, seq, bytes, seconds): the service time, shortest over ranks.

    `timed_iterations` (indices) keeps only those iterations' messages, at most `limit` of
    them, evenly spaced (a fit needs no more; a point of 1000 ranks x 10^4 iterations holds
    10^7 messages). `waits` (`wait_starts`, for ends seen in a wait): a message that ended
    after its rank began to wait is served from then at the earliest.
    """
    columns = message_cost_columns(comm, timed_iterations, limit, waits)
    if columns is None:
        return pd.DataFrame(columns=["op", "iteration", "seq", "bytes", "seconds"])
    return pd.DataFrame(columns)


def message_cost_columns(comm: np.ndarray, timed_iterations: np.ndarray | None = None,
                         limit: int | None = MAX_ITERATIONS,
                         waits: np.ndarray | None = None) -> dict[str, np.ndarray] | None:  # fmt: skip
    """`message_costs` as its columns (None: no message), without a DataFrame per op."""
    if len(comm) == 0:
        return None
    chosen = spread(timed_iterations, limit) if timed_iterations is not None else None
    c = _select(comm, chosen)
    if len(c) == 0:
        return None
    order, seq = _sorted_groups(c["rank"], c["iteration"], c["t_start"])
    c = c[order]
    rank = c["rank"].astype(np.int64)
    t_start, t_end = c["t_start"], c["t_end"]
    if waits is not None:
        began = waits[rank, c["iteration"].astype(np.int64)]
        t_start = np.where(t_end > began, np.maximum(t_start, began), t_start)
    # running maximum of earlier ends of the same rank: offset each rank past the previous one
    offset = float(t_end.max() - t_start.min()) + 1.0
    key = (rank - rank.min()) * offset
    running = np.maximum.accumulate(t_end + key)
    previous = np.full(len(c), -np.inf)
    previous[1:] = running[:-1] - key[1:]
    seconds = t_end - np.maximum(t_start, previous)
    parts: dict[str, list[np.ndarray]] = {"op": [], "iteration": [], "seq": [], "bytes": [], "seconds": []}
    for op in np.unique(c["op"]):
        mine = c["op"] == op
        it, sq, by, sec = c["iteration"][mine].astype(np.int64), seq[mine], c["bytes"][mine], seconds[mine]
        message = it * (int(sq.max()) + 1) + sq
        uniq, inverse = np.unique(message, return_inverse=True)
        best = np.full(len(uniq), np.inf)
        np.minimum.at(best, inverse, sec)
        size = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(size, inverse, by)
        parts["op"].append(np.full(len(uniq), bytes(op).decode(errors="replace"), dtype=object))
        parts["iteration"].append(uniq // (int(sq.max()) + 1))
        parts["seq"].append(uniq % (int(sq.max()) + 1))
        parts["bytes"].append(size)
        parts["seconds"].append(best)
    return {name: np.concatenate(values) for name, values in parts.items()}


def layers_from_trace(iterations: np.ndarray, comm: np.ndarray, timed: np.ndarray,
                      limit: int | None = MAX_ITERATIONS) -> list[Layer]:  # fmt: skip
    """Gradient buckets as layers 1..L, from the timed iterations' messages (at most `limit`
    iterations, evenly spaced).

    A bucket is handed to the backend the moment its gradients are ready, so the gaps
    between hand-overs (from the start of backward) are the buckets' backward times; the
    first message is layer L. Iterations whose number of messages differs from the most
    common one (bucket rebuilds) are left out. Without messages: one layer holding the
    whole backward with 0 bytes.
    """
    timed_idx = np.flatnonzero(timed)
    backward = float(iterations["backward"][:, timed_idx].mean()) if timed_idx.size else 0.0
    if len(comm) == 0 or timed_idx.size == 0:
        return [Layer(0.0, backward)]
    c = _select(comm, spread(timed_idx, limit))
    if len(c) == 0:
        return [Layer(0.0, backward)]
    rows, cols = c["rank"].astype(np.int64), c["iteration"].astype(np.int64)
    if rows.max() >= iterations.shape[0] or cols.max() >= iterations.shape[1] or rows.min() < 0:
        raise ModelError("comm events name ranks or iterations that the iterations table does not hold")
    order, seq = _sorted_groups(rows, cols, c["t_start"])
    c, rows, cols = c[order], rows[order], cols[order]
    group_end = np.append(seq[1:] == 0, True)  # last message of each (rank, iteration)
    counts = seq[group_end] + 1
    modal = int(np.bincount(counts).argmax())
    keep = np.repeat(counts == modal, counts)
    c, rows, cols, seq = c[keep], rows[keep], cols[keep], seq[keep]
    # backward starts after data, h2d and forward of the same rank and iteration
    it = iterations[rows, cols]
    ready = c["t_start"] - (it["t_start"] + it["data"] + it["h2d"] + it["forward"])
    gap = np.where(seq == 0, ready, np.diff(ready, prepend=0.0)).clip(min=0.0)
    n = np.bincount(seq, minlength=modal)
    gaps = np.bincount(seq, weights=gap, minlength=modal) / n
    sizes = np.array([np.median(c["bytes"][seq == k]) for k in range(modal)])
    if gaps.sum() > 0:  # the gaps end at the last hand-over, where the backward phase ends: make them add up
        gaps = gaps * (backward / gaps.sum())
    # seq 0 is handed over first: layer L. Layers are listed 1..L.
    return [Layer(float(b), float(g)) for b, g in zip(sizes[::-1], gaps[::-1], strict=True)]
