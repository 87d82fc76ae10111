"""A point file's timeline as a Chrome trace (Trace Event Format, JSON Object Format).

The result opens in Perfetto's UI (https://ui.perfetto.dev) and in chrome://tracing:

- one process per rank (``pid`` = rank), named ``rank R (hostname)``;
- thread 0 "iterations": one complete event per iteration with its phases (data, h2d,
  forward, backward, comm, update) nested inside, laid end to end from ``t_start``;
- threads 1, 2, ... "communication": one complete event per gradient message; messages
  that overlap in time go to separate threads (greedy lanes), so no thread holds two
  overlapping events;
- counter tracks from the resource samples: "cpu %", "rss MiB", the GPU counters where the
  GPU was sampled, and "ib MB/s" computed from consecutive InfiniBand port counters.

Times in the arrays are seconds since the file's ``epoch_ns``; the trace is in
microseconds. Needs numpy only (no h5py, no MPI, no framework): pass it the arrays of a
``PointData``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.store.schema import PHASES

US = 1e6  # microseconds per second
MIB = 1024.0 * 1024.0
MB = 1e6

TID_ITERATIONS = 0
TID_COMM = 1  # first communication lane; further lanes are 2, 3, ...

CAT_ITERATION = "iteration"
CAT_WARMUP = "warmup"
CAT_PHASE = "phase"
CAT_COMM = "comm"


def _text(value: bytes | str) -> str:
    """A fixed-length ``S`` field as text (numpy already strips the trailing NULs)."""
    if isinstance(value, bytes):
        return value.rstrip(b"\0").decode("utf-8", errors="replace")
    return str(value)


def _number(value: float) -> float | None:
    """A float for JSON: NaN and infinities become None (JSON has no NaN)."""
    return value if math.isfinite(value) else None


def _meta(name: str, pid: int, args: dict[str, Any], tid: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid}
    if tid is not None:
        event["tid"] = tid
    event["args"] = args
    return event


def _complete(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _counter(name: str, ts: float, pid: int, args: dict[str, float]) -> dict[str, Any]:
    return {"name": name, "ph": "C", "ts": ts, "pid": pid, "args": args}


def _rank_ids(iterations: np.ndarray, ranks: np.ndarray) -> list[int]:
    """The rank of each row of ``iterations`` (the ranks table's order, else the row index)."""
    n_rows = iterations.shape[0]
    if len(ranks) >= n_rows and ranks.dtype.names is not None and "rank" in ranks.dtype.names:
        return [int(r) for r in ranks["rank"][:n_rows]]
    return list(range(n_rows))


def _iteration_events(iterations: np.ndarray, pids: list[int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    starts = (iterations["t_start"] * US).tolist()
    ends = (iterations["t_end"] * US).tolist()
    phases = {phase: (iterations[phase] * US).tolist() for phase in PHASES}
    samples = iterations["samples"].tolist()
    losses = iterations["loss"].astype(np.float64).tolist()
    warmups = iterations["warmup"].tolist()
    comm_totals = iterations["comm_total"].tolist()
    for row, pid in enumerate(pids):
        for i in range(iterations.shape[1]):
            start, end = starts[row][i], ends[row][i]
            if not (math.isfinite(start) and math.isfinite(end)) or end < start:
                continue  # not a recorded iteration
            warmup = bool(warmups[row][i])
            args = {
                "iteration": i,
                "samples": int(samples[row][i]),
                "loss": _number(losses[row][i]),
                "warmup": warmup,
                "comm_total_s": _number(comm_totals[row][i]),
            }
            cat = CAT_WARMUP if warmup else CAT_ITERATION
            events.append(_complete(f"iteration {i}", cat, start, end - start, pid, TID_ITERATIONS, args))
            phase_cat = f"{CAT_PHASE},{CAT_WARMUP}" if warmup else CAT_PHASE
            cursor = start
            for phase in PHASES:
                length = phases[phase][row][i]
                if not (math.isfinite(length) and length > 0.0):
                    continue  # a phase that does not apply (or was not measured)
                # Clamp to the iteration so rounding never lets a phase stick out of it.
                phase_end = min(cursor + length, end)
                if phase_end <= cursor:
                    break
                events.append(
                    _complete(phase, phase_cat, cursor, phase_end - cursor, pid, TID_ITERATIONS, {"iteration": i})
                )
                cursor = phase_end
    return events


def _comm_events(comm: np.ndarray) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Communication events with greedy lane assignment; also the number of lanes per rank."""
    events: list[dict[str, Any]] = []
    lanes_of: dict[int, int] = {}
    if len(comm) == 0:
        return events, lanes_of
    rank_col = comm["rank"].tolist()
    starts = (comm["t_start"] * US).tolist()
    ends = (comm["t_end"] * US).tolist()
    ops = [_text(v) for v in comm["op"].tolist()]
    axes = [_text(v) for v in comm["axis"].tolist()]
    names = [_text(v) for v in comm["name"].tolist()]
    dtypes = [_text(v) for v in comm["dtype"].tolist()]
    nbytes = comm["bytes"].tolist()
    its = comm["iteration"].tolist()
    valid = [k for k in range(len(comm)) if math.isfinite(starts[k]) and math.isfinite(ends[k])]
    # Per rank, by start (then end): each message goes to the first lane that is free by then.
    valid.sort(key=lambda k: (rank_col[k], starts[k], max(ends[k], starts[k])))
    lane_ends: dict[int, list[float]] = {}
    for k in valid:
        pid = int(rank_col[k])
        start = starts[k]
        dur = max(ends[k] - start, 0.0)
        lanes = lane_ends.setdefault(pid, [])
        lane = next((n for n, lane_end in enumerate(lanes) if lane_end <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(start + dur)
        else:
            lanes[lane] = start + dur
        args = {"bytes": int(nbytes[k]), "dtype": dtypes[k], "iteration": int(its[k]), "op": ops[k], "tensor": names[k],
                "axis": axes[k]}  # fmt: skip
        kind = ops[k] if axes[k] in ("dp", "") else f"{ops[k]} ({axes[k]})"  # a layout's other groups named
        name = f"{kind} {names[k]}".strip()
        events.append(_complete(name, CAT_COMM, start, dur, pid, TID_COMM + lane, args))
    lanes_of = {pid: len(lanes) for pid, lanes in lane_ends.items()}
    return events, lanes_of


# Per-sample gauges after the CPU counter, in this order: (track, series, column, divisor).
_GAUGES = (
    ("rss MiB", "rss", "rss_bytes", MIB),
    ("gpu util %", "util", "gpu_util", 1),
    ("gpu mem MiB", "used", "gpu_mem_bytes", MIB),
    ("gpu power W", "power", "gpu_power_w", 1),
    ("gpu sm clock MHz", "sm", "gpu_sm_clock_mhz", 1),
)
_FLOAT_COLUMNS = ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal", "gpu_util", "gpu_power_w", "gpu_sm_clock_mhz")
_INT_COLUMNS = ("rss_bytes", "gpu_mem_bytes", "ib_rx_bytes", "ib_tx_bytes")


class _Samples:
    """A rank- and time-sorted resource table as Python lists; absent values (NaN, or -1 for
    counters) read as None."""

    def __init__(self, resources: np.ndarray) -> None:
        res = resources[np.lexsort((resources["t"], resources["rank"]))]
        self.ranks = [int(r) for r in res["rank"].tolist()]
        self.t_s = res["t"].astype(np.float64).tolist()
        self.ts = (res["t"].astype(np.float64) * US).tolist()
        self._floats = {key: res[key].astype(np.float64).tolist() for key in _FLOAT_COLUMNS}
        self._ints = {key: res[key].tolist() for key in _INT_COLUMNS}

    def get(self, key: str, k: int) -> float | int | None:
        if key in self._ints:
            count: int = self._ints[key][k]
            return count if count >= 0 else None
        value: float = self._floats[key][k]
        return value if math.isfinite(value) and value >= 0.0 else None


def _sample_events(s: _Samples, k: int) -> list[dict[str, Any]]:
    """The counters of sample k: CPU shares, then each gauge that was measured."""
    pid, ts = s.ranks[k], s.ts[k]
    events: list[dict[str, Any]] = []
    states = ("user", "system", "iowait", "steal")
    cpu = {name: value for name in states if (value := s.get(f"cpu_{name}", k)) is not None}
    if cpu:
        events.append(_counter("cpu %", ts, pid, cpu))
    for track, series, key, divisor in _GAUGES:
        if (value := s.get(key, k)) is not None:
            events.append(_counter(track, ts, pid, {series: value / divisor}))
    return events


def _ib_rates(s: _Samples, j: int, k: int) -> dict[str, float]:
    """InfiniBand MB/s over (sample j, sample k] of one rank; counter resets are skipped."""
    dt = s.t_s[k] - s.t_s[j]
    rates: dict[str, float] = {}
    if not dt > 0.0:
        return rates
    for name, key in (("rx", "ib_rx_bytes"), ("tx", "ib_tx_bytes")):
        now, before = s.get(key, k), s.get(key, j)
        if now is not None and before is not None and now >= before:
            rates[name] = (now - before) / dt / MB
    return rates


def _resource_events(resources: np.ndarray) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if len(resources) == 0:
        return events
    s = _Samples(resources)
    previous: dict[int, int] = {}  # rank -> index of its previous sample
    for k, pid in enumerate(s.ranks):
        if not math.isfinite(s.ts[k]):
            continue
        events += _sample_events(s, k)
        # InfiniBand: the rate over (previous sample, this one], shown from the previous
        # sample on (a counter holds its value until the next event).
        j = previous.get(pid)
        previous[pid] = k
        if j is not None and (rates := _ib_rates(s, j, k)):
            events.append(_counter("ib MB/s", s.ts[j], pid, rates))
    return events


def _pids_of(resources: np.ndarray) -> list[int]:
    return [int(r) for r in resources["rank"].tolist()] if len(resources) else []


def chrome_trace(
    iterations: np.ndarray,
    ranks: np.ndarray,
    comm: np.ndarray,
    resources: np.ndarray,
    hostnames: list[str],
    label: str,
) -> dict[str, Any]:
    """The trace of one point: ``iterations`` (n_ranks, n) ITERATION_DTYPE, ``ranks`` RANK_DTYPE,
    ``comm`` COMM_DTYPE, ``resources`` RESOURCE_DTYPE, ``hostnames`` in the order of ``ranks``.

    Returns the JSON Object Format dict (plain Python types, no NaN): ``traceEvents``,
    ``displayTimeUnit`` and ``metadata`` (with ``label``).
    """
    if iterations.ndim == 1:
        iterations = iterations.reshape(1, -1)
    pids = _rank_ids(iterations, ranks)
    host_of: dict[int, str] = {}
    rank_order = [int(r) for r in ranks["rank"]] if len(ranks) else pids
    for position, rank in enumerate(rank_order):
        if position < len(hostnames):
            host_of[rank] = hostnames[position]

    body = _iteration_events(iterations, pids)
    comm_events, lanes_of = _comm_events(comm)
    body += comm_events
    body += _resource_events(resources)

    all_pids = sorted(set(pids) | set(rank_order) | {int(r) for r in comm["rank"].tolist()} | set(_pids_of(resources)))
    meta: list[dict[str, Any]] = []
    for pid in all_pids:
        meta.append(_meta("process_name", pid, {"name": f"rank {pid} ({host_of.get(pid, '?')})"}))
        meta.append(_meta("process_sort_index", pid, {"sort_index": pid}))
        meta.append(_meta("thread_name", pid, {"name": "iterations"}, tid=TID_ITERATIONS))
        meta.append(_meta("thread_sort_index", pid, {"sort_index": TID_ITERATIONS}, tid=TID_ITERATIONS))
        for lane in range(lanes_of.get(pid, 0)):
            tid = TID_COMM + lane
            name = "communication" if lane == 0 else f"communication {lane + 1}"
            meta.append(_meta("thread_name", pid, {"name": name}, tid=tid))
            meta.append(_meta("thread_sort_index", pid, {"sort_index": tid}, tid=tid))
    return {
        "traceEvents": meta + body,
        "displayTimeUnit": "ms",
        "metadata": {"label": label, "generator": "hpcbench", "time_unit": "us since the point file's epoch_ns"},
    }


def with_ideal(measured: dict[str, Any], ideal: dict[str, Any], what: str) -> dict[str, Any]:
    """One trace holding `measured` and, beside it, `ideal` (its processes renumbered after the
    measured ones and named "what-if: ..."), for comparing the two timelines."""
    pids = [e["pid"] for e in measured["traceEvents"] if "pid" in e]
    offset = (max(pids) + 1) if pids else 0
    events = []
    for event in ideal["traceEvents"]:
        event = {**event, "pid": event["pid"] + offset}
        if event["ph"] == "M" and event["name"] == "process_name":
            event["args"] = {"name": f"what-if: {event['args']['name']}"}
        elif event["ph"] == "M" and event["name"] == "process_sort_index":
            event["args"] = {"sort_index": event["args"]["sort_index"] + offset}
        events.append(event)
    metadata = {**measured["metadata"], "what_if": what, "what_if_first_pid": offset}
    return {**measured, "traceEvents": measured["traceEvents"] + events, "metadata": metadata}


def write_chrome_trace(path: Path, trace: dict[str, Any]) -> None:
    """Write ``trace`` as JSON to ``path`` atomically: a temporary file in the same
    directory, then ``os.replace``. A failure leaves ``path`` as it was and no temporary file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any new file
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(trace, f, allow_nan=False, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
