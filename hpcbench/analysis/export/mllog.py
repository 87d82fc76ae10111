"""MLPerf-style logs: one `mllog/<point>.log` per point, one `:::MLLOG {json}` line per event.

Each line's JSON holds, in this order, `namespace`, `time_ms` (integer milliseconds since
the Unix epoch: the point's `epoch_ns` plus the recorded time), `event_type`
(POINT_IN_TIME, INTERVAL_START or INTERVAL_END), `key`, `value` and `metadata`, as the
MLPerf logging library writes them. MLPerf's keys are in the default namespace (""); what
MLPerf has no key for is in namespace "hpcbench" with keys prefixed `hpcbench_`.

The times come from the point file: the run starts at the first iteration's start (the
earliest rank), training blocks and epochs run between evaluations, an evaluation starts
when the slowest rank ends the iteration before it and stops when the last rank's test
ends (its recorded test time). Lines are in the log's logical order with non-decreasing
`time_ms`: an event the ranks' clocks place a moment before the one logged before it
(ranks overlapping at a boundary) is logged at that one's time.
"""

from __future__ import annotations

import heapq
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcbench.analysis import accuracy
from hpcbench.analysis.export.summary import plain
from hpcbench.spec import Point
from hpcbench.store.energy import RECORDED_SOURCES, EnergySample, energy_between
from hpcbench.store.reader import PointData

PREFIX = ":::MLLOG "
MLPERF, HPCBENCH = "", "hpcbench"  # namespaces
POINT_IN_TIME, INTERVAL_START, INTERVAL_END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
DIRECTORY = "mllog"


@dataclass(frozen=True)
class Evaluation:
    epoch: int  # epochs completed; 0 when the point counts iterations
    accuracy: float
    block_start_s: float  # start of the training block before it (its first iteration, earliest rank)
    samples: int  # training samples of all ranks up to the evaluation
    start_s: float
    stop_s: float


@dataclass(frozen=True)
class PowerReading:
    """The average power of one counter between two of its readings, at the second one."""

    t_s: float
    since_s: float  # the window's first reading
    watts: float
    host: str
    rank: int
    source: str
    domain: str


@dataclass(frozen=True)
class Run:
    """What a point's log says, taken from its arrays (small: a few numbers per evaluation)."""

    point_id: str
    point: Point
    file: str
    hpcbench_version: str
    epoch_ns: int
    hosts: list[str]
    ranks: int
    start_s: float  # first iteration's start
    warmup_stop_s: float | None  # end of the last warm-up iteration
    stop_s: float  # end of training (and of the last evaluation)
    evaluations: list[Evaluation] = field(default_factory=list)
    eval_samples: int = 0  # samples of one evaluation, all ranks' shards
    power: list[PowerReading] = field(default_factory=list)  # between start_s and stop_s, by time

    @classmethod
    def of(cls, p: PointData) -> Run:
        it = p.iterations
        n_ranks = it.shape[0]
        starts, ends = it["t_start"].min(axis=0), it["t_end"].max(axis=0)
        samples = np.cumsum(it["samples"].sum(axis=0, dtype=np.int64))
        warm = np.flatnonzero(it["warmup"].any(axis=0))
        warm_end = int(warm[-1]) if warm.size and warm[0] == 0 else -1  # warm-up comes first
        evals = _evaluations(p, starts, ends, samples, warm_end + 1)
        stop = max([float(ends[-1]), *(e.stop_s for e in evals)])
        return cls(
            p.point_id,
            p.point,
            p.path.name,
            str(p.attrs.get("hpcbench_version", "")),
            int(p.attrs.get("epoch_ns", 0)),
            sorted(set(p.hostnames)),
            n_ranks,
            float(starts[0]),
            float(ends[warm_end]) if warm_end >= 0 else None,
            stop,
            evals,
            int(p.eval["total"][p.eval["epoch"] == p.eval["epoch"][0]].sum()) if len(p.eval) else 0,
            _power(p, float(starts[0]), stop),
        )


def _power(p: PointData, start: float, stop: float) -> list[PowerReading]:
    """Every energy counter's average power between consecutive readings inside the run, by
    time: one reader per host's domain or GPU (the lowest rank that read it), windows long
    enough for the counter to have moved (`store/energy.py`) only, as the analysis takes them."""
    rows = p.energy
    if not len(rows):
        return []
    host_of = dict(zip((int(r) for r in p.ranks["rank"]), p.hostnames, strict=True))
    readings: dict[tuple[str, str, str], dict[int, list[EnergySample]]] = {}
    for row in rows:
        t, rank = float(row["t"]), int(row["rank"])
        if start - 1e-6 <= t <= stop + 1e-6:
            source, domain = row["source"].decode(), row["domain"].decode()
            key = (host_of.get(rank, f"rank {rank}"), source, domain)
            sample = EnergySample(round(t * 1e9), source, domain, int(row["microjoules"]))
            readings.setdefault(key, {}).setdefault(rank, []).append(sample)
    out = []
    for (host, source, domain), by_rank in readings.items():
        rank = min(by_rank)
        samples = sorted(by_rank[rank], key=lambda s: s.t_ns)
        interval = RECORDED_SOURCES.get(source, max(RECORDED_SOURCES.values()))
        for before, after in itertools.pairwise(samples):
            window = energy_between(before, after, interval)
            if window.trustworthy:
                out.append(PowerReading(after.t_ns / 1e9, before.t_ns / 1e9, window.watts, host, rank, source, domain))
    return sorted(out, key=lambda r: (r.t_s, r.host, r.source, r.domain))


def _evaluations(
    p: PointData, starts: np.ndarray, ends: np.ndarray, samples: np.ndarray, first: int
) -> list[Evaluation]:
    """Each evaluation (the rows of all ranks with one epoch), with the block of training before it."""
    n_ranks, n_iters = p.iterations.shape
    first = min(first, n_iters - 1)
    out = []
    for row in accuracy.evaluations(p.eval).to_dict("records"):
        rows = p.eval[p.eval["epoch"] == row["epoch"]]
        last = int(np.clip(int(row["iteration"]) - 1, first, n_iters - 1))
        ranks = np.clip(rows["rank"], 0, n_ranks - 1)
        start = float(ends[last])
        stop = max(start, float((p.iterations["t_end"][ranks, last] + rows["test_time_s"]).max()))
        block = float(starts[first])
        out.append(Evaluation(int(row["epoch"]), float(row["accuracy"]), block, int(samples[last]), start, stop))
        first = min(last + 1, n_iters - 1)
    return out


Event = tuple[float, str, str, str, Any, dict[str, Any]]  # (seconds, namespace, event type, key, value, metadata)


def _descriptors(run: Run) -> list[Event]:
    p, t = run.point, run.start_s
    point = {"file": run.file, "ranks": run.ranks, **p.as_dict()}
    platform = {"nodes": p.nodes, "ranks_per_node": p.ranks_per_node, "device": p.device}
    events: list[Event] = [
        (t, MLPERF, POINT_IN_TIME, "submission_benchmark", p.model, {}),
        (t, MLPERF, POINT_IN_TIME, "submission_platform", ",".join(run.hosts), platform),
        (t, HPCBENCH, POINT_IN_TIME, "hpcbench_point", run.point_id, point),
        (t, HPCBENCH, POINT_IN_TIME, "hpcbench_version", run.hpcbench_version, {}),
        (t, MLPERF, POINT_IN_TIME, "seed", p.seed, {}),
        (t, MLPERF, POINT_IN_TIME, "global_batch_size", run.ranks * p.rank_batch, {}),
        (t, MLPERF, POINT_IN_TIME, "gradient_accumulation_steps", 1, {}),
        (t, MLPERF, POINT_IN_TIME, "opt_name", p.optimizer, {}),
        (t, MLPERF, POINT_IN_TIME, "opt_base_learning_rate", p.lr, {}),
    ]
    if run.evaluations:
        events.append((t, MLPERF, POINT_IN_TIME, "eval_samples", run.eval_samples, {}))
    return events


def _training(run: Run) -> list[Event]:
    """Blocks of training between evaluations (with their epoch when the point counts epochs),
    each followed by its evaluation."""
    events: list[Event] = []
    previous = 0
    for e in run.evaluations:
        if e.epoch > 0:
            where = {"first_epoch_num": previous + 1, "epoch_count": e.epoch - previous}
            at = {"epoch_num": e.epoch}
        else:
            where = {"samples_count": e.samples}
            at = {"samples_count": e.samples}
        block_start = e.block_start_s
        events.append((block_start, MLPERF, INTERVAL_START, "block_start", None, where))
        one_epoch = e.epoch > 0 and e.epoch - previous == 1
        if one_epoch:
            events.append((block_start, MLPERF, INTERVAL_START, "epoch_start", None, at))
            events.append((e.start_s, MLPERF, INTERVAL_END, "epoch_stop", None, at))
        events += [
            (e.start_s, MLPERF, INTERVAL_END, "block_stop", None, where),
            (e.start_s, MLPERF, INTERVAL_START, "eval_start", None, at),
            (e.stop_s, MLPERF, INTERVAL_END, "eval_stop", None, at),
            (e.stop_s, MLPERF, POINT_IN_TIME, "eval_accuracy", e.accuracy, at),
        ]
        previous = e.epoch
    return events


def events(run: Run, stats: dict[str, Any]) -> list[Event]:
    """Every event of the point's log in order; `stats`: its row of the stats table."""
    out = _descriptors(run)
    out.append((run.start_s, MLPERF, INTERVAL_START, "run_start", None, {}))
    if run.warmup_stop_s is not None:
        out.append((run.start_s, HPCBENCH, INTERVAL_START, "hpcbench_warmup_start", None, {}))
        out.append((run.warmup_stop_s, HPCBENCH, INTERVAL_END, "hpcbench_warmup_stop", None, {}))
    out += _training(run)
    unit = {"unit": "samples/s", "t_iter_s": stats.get("t_iter_s"), "ranks": run.ranks}
    out.append((run.stop_s, MLPERF, POINT_IN_TIME, "throughput", stats.get("throughput"), unit))
    out.append((run.stop_s, HPCBENCH, POINT_IN_TIME, "hpcbench_stats", stats, {}))
    out.append((run.stop_s, MLPERF, INTERVAL_END, "run_stop", None, {"status": "success"}))
    return out


def power_events(run: Run) -> list[Event]:
    """MLPerf power's events: the measurement's interval (from the first reading of any
    counter's window to the last reading), `conversion_eff` 1 (the counters read the devices and packages, not
    the wall), and a `power_reading` in watts per counter and window, naming its counter."""
    if not run.power:
        return []
    first, last = min(r.since_s for r in run.power), run.power[-1].t_s
    out: list[Event] = [
        (first, MLPERF, INTERVAL_START, "power_measurement_start", None, {}),
        (first, MLPERF, POINT_IN_TIME, "conversion_eff", 1.0, {}),
    ]
    for r in run.power:
        where = {"host": r.host, "rank": r.rank, "source": r.source, "domain": r.domain, "unit": "W"}
        out.append((r.t_s, MLPERF, POINT_IN_TIME, "power_reading", r.watts, where))
    out.append((last, MLPERF, INTERVAL_END, "power_measurement_stop", None, {}))
    return out


def text(run: Run, stats: dict[str, Any]) -> str:
    """The log of one point: one line per event, time_ms never decreasing; the power events
    merged into the run's by time (before the run's own at the same time, so `run_stop` ends it)."""
    lines, last = [], None
    merged = heapq.merge(power_events(run), events(run, stats), key=lambda event: event[0])
    for seconds, namespace, kind, key, value, metadata in merged:
        ms = (run.epoch_ns + round(seconds * 1e9)) // 1_000_000
        last = ms if last is None else max(last, ms)
        record = {"namespace": namespace, "time_ms": last, "event_type": kind, "key": key, "value": plain(value),
                  "metadata": plain(metadata)}  # fmt: skip
        lines.append(PREFIX + json.dumps(record, allow_nan=False))
    return "\n".join(lines) + "\n"
