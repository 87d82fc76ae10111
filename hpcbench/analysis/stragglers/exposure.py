"""Communication measured from the messages: time in flight, time exposed, per bucket.

For every gradient message of a timed iteration, its hand-over (`t_start`) and completion
(`t_end`) are set against the end of its rank's backward phase in that iteration,
b = t_start + data + h2d + forward + backward of the iteration row:

- in flight: the union, per rank and iteration, of the messages' intervals (overlapping
  per-parameter messages count once, unlike `comm_total`, which sums their durations);
- exposed: the union of the parts after b (what backward did not hide);
- per bucket (op and tensor name): how many messages were entirely hidden (ended by b)
  and how long the exposed part of each lasted.

`comm_union_share` and `comm_exposed_share` are the mean over ranks and timed iterations of
those unions divided by t_iter. On a point of more than SAMPLE_ITERATIONS timed iterations,
over every k-th of them, and where those hold more than MESSAGE_BUDGET messages, over every
j-th of those, at least MESSAGE_ITERATIONS (timed.py; the error bound: docs/stragglers.md).
Vectorised, in chunks of messages that hold whole (rank, iteration) groups, gathered a
chunk at a time: one stable sort by group (none when the table is in order already, as
written in one block), a running maximum per chunk, and a hash of the (op, name) bytes,
read in place, for the buckets (sorting ten million names would take seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from hpcbench.analysis.stragglers.timed import Sample, message_stride

BUCKET_COLUMNS = ["point", "op", "bucket", "messages", "bytes", "mean_s", "hidden_share", "exposed_mean_s",
                  "exposed_share"]  # fmt: skip
CHUNK = 1 << 16  # messages handled at a time (7 MB of records: they stay in the CPU's cache)
SELECT_ROWS = 1 << 20  # messages whose iteration is looked up at a time
# odd 64-bit multipliers of a multiplicative hash of (op, name), one per 8-byte lane
_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
                  0x94D049BB133111EB, 0xBF58476D1CE4E5B9, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53],
                 dtype=np.uint64)  # fmt: skip


@dataclass
class Exposure:
    union_s: float  # mean over ranks and timed iterations of the time any message was in flight
    exposed_s: float  # likewise, in flight after backward ended
    bucket_columns: dict[str, np.ndarray]  # BUCKET_COLUMNS without `point`, as columns (empty: no messages)
    sample: Sample | None = None  # the iterations measured (timed.py), for the attribution to reuse

    @cached_property
    def buckets(self) -> pd.DataFrame:
        """The per-bucket table (BUCKET_COLUMNS without `point`), made on demand: a sweep joins
        its points' columns into one table instead."""
        if not self.bucket_columns:
            return pd.DataFrame(columns=BUCKET_COLUMNS[1:])
        return pd.DataFrame(self.bucket_columns)


def _empty() -> Exposure:
    return Exposure(float("nan"), float("nan"), {})


def _unions(g: np.ndarray, start: np.ndarray, end: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """(union of the messages' intervals [start, end), union of their parts after `bwd`), each
    summed over groups; rows grouped by `g` (sorted by start within a group here if they are not)."""
    first = np.empty(g.size, dtype=bool)
    first[0] = True
    np.not_equal(g[1:], g[:-1], out=first[1:])
    if first.all():  # one message per group: each union is the message itself
        late_s, late_e = np.maximum(start, bwd), np.maximum(end, bwd)
        return np.array([np.clip(end - start, 0.0, None).sum(), np.clip(late_e - late_s, 0.0, None).sum()])
    if not ((start[1:] >= start[:-1]) | first[1:]).all():
        order = np.lexsort((start, g))  # the groups keep their places: only rows within a group move
        start, end, bwd = start[order], end[order], bwd[order]
    late_s = np.maximum(start, bwd)
    pairs = ((start, np.maximum(end, start)), (late_s, np.maximum(np.maximum(end, bwd), late_s)))
    head = np.maximum.accumulate(np.where(first, np.arange(g.size), 0))  # each row's group's first row
    base = start[head]
    # Groups laid end to end (group k within [k * span, (k + 1) * span)), so that one running
    # maximum of the ends never carries an end over into the next group.
    offset = np.cumsum(first) - 1.0
    offset *= float(max((pairs[0][1] - base).max(), (pairs[1][1] - base).max())) + 1e-6
    offset -= base
    totals = np.empty(2)
    for k, (s, e) in enumerate(pairs):
        rel_s, rel_e = s + offset, e + offset
        before = np.empty_like(rel_e)
        before[0] = -np.inf
        np.maximum.accumulate(rel_e[:-1], out=before[1:])
        totals[k] = np.clip(rel_e - np.maximum(rel_s, before), 0.0, None).sum()
    return totals


def _name_lanes(rows: np.ndarray) -> np.ndarray | None:
    """The (op, name) bytes of each row as 8-byte lanes, read in place (no copy), where the two
    fields lie side by side in the record (as in COMM_DTYPE); else None."""
    fields = rows.dtype.fields
    if fields is None or "op" not in fields or "name" not in fields or not rows.flags.c_contiguous:
        return None
    (op_type, op_at, *_), (name_type, name_at, *_) = fields["op"], fields["name"]
    size = op_type.itemsize + name_type.itemsize
    if name_at != op_at + op_type.itemsize or size % 8 or len(rows) == 0:
        return None
    raw = rows.view(np.uint8)
    shape, strides = (len(rows), size // 8), (rows.itemsize, 8)
    return np.asarray(np.ndarray(shape, dtype=np.uint64, buffer=raw, offset=int(op_at), strides=strides))


def _hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's (op, name) bytes: sum of lane k times multiplier k, folded."""
    lanes = _name_lanes(rows)
    if lanes is None:
        lanes = np.concatenate(
            (np.ascontiguousarray(rows["op"]).view(np.uint64).reshape(len(rows), -1),
             np.ascontiguousarray(rows["name"]).view(np.uint64).reshape(len(rows), -1)),
            axis=1,
        )  # fmt: skip
    with np.errstate(over="ignore"):
        h = lanes[:, 0] * _MULT[0]
        term = np.empty_like(h)
        for k in range(1, lanes.shape[1]):  # lane by lane: no (rows, lanes) temporary, no short-axis sum
            np.multiply(lanes[:, k], _MULT[k], out=term)
            h += term
        h ^= h >> np.uint64(31)
        return np.asarray(h)


class _Buckets:
    """Sums per (op, name) over chunks: messages, bytes, duration, hidden, exposed."""

    def __init__(self) -> None:
        self.code_of: dict[int, int] = {}
        self.names: list[tuple[str, str]] = []
        self.sums = np.zeros((5, 0))

    def add(self, h: np.ndarray, rows: np.ndarray, at: np.ndarray | None, nbytes: np.ndarray, start: np.ndarray,
            end: np.ndarray, exposed: np.ndarray) -> None:  # fmt: skip
        """Messages with (op, name) hashes `h`, `nbytes`, `start`, `end` and `exposed` time: rows
        `at` of the records `rows` (all of them if None), where the names are read."""
        if h[0] == h.min() == h.max():  # one bucket in the chunk (the common case): no factorising
            local, uniques = np.zeros(0, dtype=np.intp), h[:1]
        else:
            local, uniques = pd.factorize(h)  # codes in order of first appearance
        if len(uniques) == 1:
            first = np.zeros(1, dtype=np.int64)
        else:
            running = np.maximum.accumulate(local)
            first = np.flatnonzero(np.concatenate(([True], running[1:] > running[:-1])))
        glob = np.empty(len(uniques), dtype=np.int64)
        for k, (key, i) in enumerate(zip(uniques.tolist(), first.tolist(), strict=True)):
            code = self.code_of.get(key)
            if code is None:
                code = self.code_of[key] = len(self.names)
                row = rows[i if at is None else int(at[i])]
                self.names.append((bytes(row["op"]).decode(errors="replace"),
                                   bytes(row["name"]).decode(errors="replace")))  # fmt: skip
            glob[k] = code
        n = len(self.names)
        duration = np.clip(end - start, 0.0, None)
        weights = (nbytes.astype(np.float64), duration, (exposed <= 0.0).astype(np.float64), exposed)
        if len(uniques) == 1:  # one bucket in the chunk: plain sums
            sums = np.zeros((5, n))
            sums[:, glob[0]] = [len(h), *(float(w.sum()) for w in weights)]
        else:
            codes = glob[local]
            sums = np.stack([np.bincount(codes, minlength=n).astype(np.float64)]
                            + [np.bincount(codes, weights=w, minlength=n) for w in weights])  # fmt: skip
        if self.sums.shape[1] < n:
            grown = np.zeros((5, n))
            grown[:, : self.sums.shape[1]] = self.sums
            self.sums = grown
        self.sums += sums

    def columns(self) -> dict[str, np.ndarray]:
        count, nbytes, duration, hidden, exposed = self.sums
        mean_s, exposed_mean_s = duration / count, exposed / count
        with np.errstate(divide="ignore", invalid="ignore"):
            exposed_share = np.where(mean_s > 0, exposed_mean_s / mean_s, 0.0)
        order = np.argsort(-exposed_mean_s, kind="stable")  # the most exposed first
        columns = {
            "op": np.asarray([op for op, _ in self.names], dtype=object), "bucket": np.asarray(
                [name for _, name in self.names], dtype=object), "messages": count.astype(np.int64),
            "bytes": nbytes / count, "mean_s": mean_s, "hidden_share": hidden / count,
            "exposed_mean_s": exposed_mean_s, "exposed_share": exposed_share,
        }  # fmt: skip
        return {key: value[order] for key, value in columns.items()}


def backward_end(timed: np.ndarray) -> np.ndarray:
    """Per rank and timed iteration, when backward ended: t_start + data + h2d + forward + backward."""
    return np.asarray(timed["t_start"] + timed["data"] + timed["h2d"] + timed["forward"] + timed["backward"])


class _Pass:
    """One pass over the messages in (rank, iteration) order, in chunks that hold whole
    (rank, iteration) groups and fit in the CPU's cache (each record is read from memory once)."""

    def __init__(self, bwd: np.ndarray, columns: np.ndarray, buckets: bool, union: bool) -> None:
        self.n_ranks, self.n_timed = bwd.shape
        self.col_of = np.full(int(columns.max()) + 3, -1, dtype=np.int64)  # at iteration + 1: 0 and the last, out
        self.col_of[columns + 1] = np.arange(self.n_timed)
        self.bwd_of = bwd.reshape(-1)
        self.buckets, self.union = buckets, union
        self.totals = np.zeros(2)
        self.acc = _Buckets()

    def run(self, comm: np.ndarray, rows: np.ndarray | None, check: bool) -> bool:
        """Accumulate the messages `comm[rows]` (all of them if `rows` is None), taken a chunk at a
        time; with `check`, False (and nothing kept) if they are out of (rank, iteration) order."""
        lo, n, last = 0, len(comm) if rows is None else len(rows), -1
        while lo < n:
            hi = min(lo + CHUNK, n)
            chunk = comm[lo:hi] if rows is None else np.take(comm, rows[lo:hi])  # a chunk's gather stays in cache
            key = chunk["rank"].astype(np.int64)
            key <<= 32
            key += chunk["iteration"]
            if check and (key[0] < last or (key[1:] < key[:-1]).any()):
                return False
            if hi < n:  # leave the last group to the next chunk, unless it fills this one
                cut = int(np.searchsorted(key, key[-1], side="left"))
                if cut > 0:
                    chunk, key, hi = chunk[:cut], key[:cut], lo + cut
            last = int(key[-1])
            self._chunk(chunk)
            lo = hi
        return True

    def _chunk(self, rows: np.ndarray) -> None:
        it = rows["iteration"].astype(np.intp)
        it += 1
        col = np.take(self.col_of, it, mode="clip")  # -1: not an iteration measured
        keep = col >= 0
        rank, start, end, nbytes = rows["rank"], rows["t_start"], rows["t_end"], rows["bytes"]
        keep &= rank.view(np.uint32) < self.n_ranks  # a negative rank is a large unsigned one
        h = _hash(rows) if self.buckets else None  # in place, before any row is left out
        at = None
        if not keep.all():  # the columns of the rows kept, not a copy of their records
            at = np.flatnonzero(keep)
            if at.size == 0:
                return
            col, rank, start, end, nbytes = col[at], rank[at], start[at], end[at], nbytes[at]
            h = None if h is None else h[at]
        g = rank.astype(np.int64)
        g *= self.n_timed
        g += col
        bwd = np.take(self.bwd_of, g)
        if self.union:
            self.totals += _unions(g, start, end, bwd)
        if h is not None:
            self.acc.add(h, rows, at, nbytes, start, end, np.clip(end - np.maximum(start, bwd), 0.0, None))


def measure(
    timed: np.ndarray, columns: np.ndarray, comm: np.ndarray, buckets: bool = True, union: bool = True
) -> Exposure:
    """The exposure of one point: `timed` the timed iteration rows (ranks, n), `columns` the
    iteration index of each of its columns, `comm` every message (COMM_DTYPE). `buckets`,
    `union`: compute the per-bucket table, the unions (else NaN)."""
    if len(comm) == 0 or timed.shape[1] == 0:
        return _empty()
    return _measure(backward_end(timed), columns, comm, None, buckets, union)


def _measure(
    bwd: np.ndarray, columns: np.ndarray, comm: np.ndarray, rows: np.ndarray | None, buckets: bool, union: bool
) -> Exposure:
    """`measure` from the end of backward per rank and column, of the messages `comm[rows]` (all if None)."""
    n_ranks, n_timed = bwd.shape
    if len(comm) == 0 or n_timed == 0 or (rows is not None and rows.size == 0):
        return _empty()
    one = _Pass(bwd, columns, buckets, union)
    if not one.run(comm, rows, check=True):  # written in several blocks: sort by (rank, iteration) once
        chosen = comm if rows is None else np.take(comm, rows)
        key = chosen["rank"].astype(np.int64) * 2**32 + chosen["iteration"]
        order = np.argsort(key, kind="stable")  # sorted runs (the blocks) merge fast
        one = _Pass(bwd, columns, buckets, union)
        one.run(comm, order if rows is None else rows[order], check=False)
    cells = n_ranks * n_timed
    shares = one.totals / cells if union else (float("nan"), float("nan"))
    table = one.acc.columns() if buckets and one.acc.names else {}
    return Exposure(float(shares[0]), float(shares[1]), table)


def of(iterations: np.ndarray, comm: np.ndarray, buckets: bool = True, union: bool = True) -> Exposure:
    """The exposure of a point from its whole iteration array (warm-up included) and messages,
    over at most SAMPLE_ITERATIONS evenly spaced timed iterations (timed.py)."""
    sample = Sample.of(iterations)
    if len(comm) == 0 or sample.columns.size == 0:
        got = _empty()
    else:
        bwd = sample.arrays.backward_end  # as backward_end(sample.rows)
        stride = message_stride(sample.columns.size, len(comm) / iterations.shape[1])
        columns = sample.columns[::stride]
        rows = message_rows(comm, columns) if sample.sampled or stride > 1 else None
        got = _measure(np.ascontiguousarray(bwd[:, ::stride]), columns, comm, rows, buckets, union)
    got.sample = sample
    return got


def message_rows(comm: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """The indices, in table order, of the messages of the iterations `columns`: one read of the
    iteration field out of the records."""
    if len(comm) == 0 or columns.size == 0:
        return np.zeros(0, dtype=np.intp)
    wanted = np.zeros(int(columns.max()) + 3, dtype=bool)  # index i + 1 for iteration i; 0 and the last: out
    wanted[columns + 1] = True
    found = []
    for lo in range(0, len(comm), SELECT_ROWS):  # small temporaries: reused, not fresh pages each
        it = comm["iteration"][lo : lo + SELECT_ROWS].astype(np.intp)  # contiguous: the passes below stay in cache
        it += 1
        at = np.flatnonzero(np.take(wanted, it, mode="clip"))
        at += lo
        found.append(at)
    return np.concatenate(found)


def messages_of(comm: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """The messages of the iterations `columns`, in table order (one gather of the rows kept)."""
    return np.take(comm, message_rows(comm, columns))  # half a boolean index's time
