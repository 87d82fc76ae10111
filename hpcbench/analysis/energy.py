"""The energy a point spent, from the counters its ranks read between steps (the `/energy`
table; docs/metrics-and-model.md, "Energy sources"):

- the **timed window** of each counter: its first reading once warm-up is over (the reading
  its rank took when warm-up ended, or when the loop began where there was no warm-up) to its
  last one (when the loop ended); a counter is one host's RAPL domain or one GPU, read by one
  rank (where two ranks read the same host's domain or GPU, the lower rank's readings count);
- its energy `energy_between` those two readings (store/energy.py): a window shorter than the
  counter's update interval (NVML's 100 ms; RAPL's 1 ms), a counter read once, or one that
  went backwards is not a measurement: the point's energy figures are then left blank and
  `energy_note` says which counter and why;
- `energy_j`: Σ over the counters of the packages ("package-N"), DRAM ("dram-N") and GPUs,
  each host's "psys" instead of its packages where it has no package counter; the cores'
  and uncore's counters are inside their package's and are not added again;
- `energy_per_sample_j` = `energy_j` / the samples the ranks trained in their timed
  iterations; `energy_per_token_j` = that / tokens per sample (sequence models);
- `power_gpu_w`: the mean over GPUs of each one's joules / seconds; `power_cpu_w` and
  `power_dram_w`: the mean over hosts of the host's packages' (DRAM's) summed watts;
  `power_node_w`: the mean over hosts of the node meter's watts (IPMI DCMI, where the site has
  one): the whole node, so it is not added into `energy_j`, which sums the parts;
- `energy_note`: why the figures are blank: no source was read (each source's reason, from
  the provenance `energy_sources` of rank 0, which reads its host's RAPL), a file written
  before energy was recorded, or an untrusted window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from hpcbench.store.energy import RECORDED_SOURCES, EnergySample, EnergyWindow, energy_between
from hpcbench.store.reader import PointData

COLUMNS = ["energy_j", "energy_per_sample_j", "energy_per_token_j", "power_gpu_w", "power_cpu_w", "power_dram_w",
           "power_node_w", "energy_note", "power_samples", "power_sample_hz", "power_note"]  # fmt: skip
MLPERF_MIN_HZ, MLPERF_MIN_SAMPLES = 1.0, 60  # MLPerf power's sampling: at least 1 Hz, at least 60 samples
SHOWN = ("energy_per_sample_j", "power_gpu_w", "power_cpu_w", "power_dram_w")  # `analyze`'s columns
_KIND = re.compile(r"^(package|dram|gpu|psys|node)(?:-\d+)?(?:@.*)?$")


@dataclass(frozen=True)
class Counter:
    """One counter's timed window: whose it is and what it read."""

    host: str
    rank: int
    source: str
    domain: str
    window: EnergyWindow

    @property
    def kind(self) -> str:
        """ "package", "dram", "gpu", "psys", "node" (a node meter), or "" for a counter inside
        another (core, uncore)."""
        found = _KIND.match(self.domain)
        return found.group(1) if found else ""

    def describe(self) -> str:
        return f"{self.source} {self.domain} of rank {self.rank} on {self.host}"


def _window_opens(p: PointData) -> np.ndarray:
    """Per rank (by index), the time its timed window opened: the end of its last warm-up
    iteration, or -inf without warm-up."""
    it = p.iterations
    opens = np.full(it.shape[0], -np.inf)
    for r in range(it.shape[0]):
        warm = np.flatnonzero(it["warmup"][r] != 0)
        if warm.size:
            opens[r] = it["t_end"][r, warm[-1]]
    return opens


def counters(p: PointData) -> list[Counter]:
    """Every counter read in the point's timed window, with its window."""
    rows = p.energy
    if not len(rows):
        return []
    opens = _window_opens(p)
    hosts = p.hostnames
    ranks = [int(r) for r in p.ranks["rank"]]
    host_of = {rank: hosts[i] for i, rank in enumerate(ranks)}
    index_of = {rank: i for i, rank in enumerate(ranks)}
    readings: dict[tuple[str, str, str], dict[int, list[EnergySample]]] = {}
    for row in rows:
        rank = int(row["rank"])
        i = index_of.get(rank, rank)
        if i < len(opens) and row["t"] < opens[i] - 1e-6:  # before warm-up ended (a µs for rounding)
            continue
        source, domain = row["source"].decode(), row["domain"].decode()
        key = (host_of.get(rank, f"rank {rank}"), source, domain)
        sample = EnergySample(round(float(row["t"]) * 1e9), source, domain, int(row["microjoules"]))
        readings.setdefault(key, {}).setdefault(rank, []).append(sample)
    out = []
    for (host, source, domain), by_rank in sorted(readings.items()):
        rank = min(by_rank)  # one reader per host's domain or GPU: the lower rank's
        samples = sorted(by_rank[rank], key=lambda s: s.t_ns)
        interval = RECORDED_SOURCES.get(source, max(RECORDED_SOURCES.values()))
        if len(samples) < 2:
            window = EnergyWindow(math.nan, 0.0, False, "read once in the timed window")
        else:
            window = energy_between(samples[0], samples[-1], interval)
        out.append(Counter(host, rank, source, domain, window))
    return out


def _counted(found: list[Counter]) -> list[Counter]:
    """The counters `energy_j` adds: packages, DRAM and GPUs; psys where a host has no package."""
    with_package = {c.host for c in found if c.kind == "package"}
    return [
        c for c in found if c.kind in ("package", "dram", "gpu") or (c.kind == "psys" and c.host not in with_package)
    ]


def _per_host(found: list[Counter], kind: str) -> float:
    watts: dict[str, float] = {}
    for c in found:
        if c.kind == kind:
            watts[c.host] = watts.get(c.host, 0.0) + c.window.watts
    return float(np.mean(list(watts.values()))) if watts else math.nan


def _samples(p: PointData) -> int:
    """The samples trained in the timed iterations: each rank's, once per group of ranks that
    share a batch (tensor- and pipeline-parallel peers)."""
    it = p.iterations
    shared = p.point.layout.tp * p.point.layout.pp if p.point.parallel else 1
    return int(it["samples"][it["warmup"] == 0].astype(np.int64).sum()) // shared if it.size else 0


def not_measured(p: PointData) -> str:
    """Why a point without readings has no energy: its rank 0's sources, or an older file."""
    recorded = p.provenance.get("energy_sources")
    if not isinstance(recorded, list) or not recorded:
        return "written before hpcbench recorded energy"
    first = recorded[0] if isinstance(recorded[0], dict) else {}
    said = "; ".join(f"{name}: {why}" for name, why in first.items())
    return f"no energy source was read: {said}" if said else "no energy source was read"


def row(p: PointData) -> dict[str, Any]:
    """The energy columns of one point."""
    out: dict[str, Any] = dict.fromkeys(COLUMNS, math.nan)
    out.update(power_sampling(p))
    found = counters(p)
    if not found:
        out["energy_note"] = not_measured(p) if not len(p.energy) else "no energy reading in the timed window"
        return out
    untrusted = [c for c in found if not c.window.trustworthy]
    if untrusted:
        out["energy_note"] = "untrusted: " + "; ".join(f"{c.describe()}: {c.window.why}" for c in untrusted)
        return out
    joules = sum(c.window.joules for c in _counted(found))
    samples = _samples(p)
    tokens = int(p.provenance.get("tokens_per_sample") or 0)
    gpus = [c.window.watts for c in found if c.kind == "gpu"]
    out.update(
        energy_j=joules,
        energy_per_sample_j=joules / samples if samples else math.nan,
        energy_per_token_j=joules / samples / tokens if samples and tokens > 0 else math.nan,
        power_gpu_w=float(np.mean(gpus)) if gpus else math.nan,
        power_cpu_w=_per_host(found, "package"),
        power_dram_w=_per_host(found, "dram"),
        power_node_w=_per_host(found, "node"),
        energy_note="",
    )
    return out


def watts(p: PointData) -> float:
    """The point's power over its timed window: Σ of the counted counters' (packages, DRAM,
    GPUs; psys without a package) joules / seconds; NaN where `row` leaves energy blank."""
    found = counters(p)
    if not found or not all(c.window.trustworthy for c in found):
        return math.nan
    return float(sum(c.window.watts for c in _counted(found)))


def power_sampling(p: PointData) -> dict[str, Any]:
    """The point's power samples as MLPerf power asks of a run: the resource sampler's GPU
    power readings inside each GPU rank's timed window (first timed iteration's start to the
    last one's end); `power_samples` and `power_sample_hz` are the fewest and the slowest of
    any GPU, `power_note` why they fall short of 1 Hz and 60 samples ("" when they do not)."""
    out: dict[str, Any] = {"power_samples": math.nan, "power_sample_hz": math.nan}
    it, res = p.iterations, p.resources
    timed = it["warmup"] == 0 if it.size else np.zeros((0, 0), bool)
    ranks = np.flatnonzero(timed.any(axis=1)) if timed.size else np.zeros(0, int)
    begin = np.full(it.shape[0], np.inf)  # a rank without a timed iteration has no window
    end = np.full(it.shape[0], -np.inf)
    if ranks.size:
        first, last = timed[ranks].argmax(axis=1), timed.shape[1] - 1 - timed[ranks, ::-1].argmax(axis=1)
        begin[ranks], end[ranks] = it["t_start"][ranks, first], it["t_end"][ranks, last]
    rank = res["rank"].astype(np.int64)
    known = (rank >= 0) & (rank < it.shape[0])
    rank, t = rank[known], res["t"][known]
    inside = (t >= begin[rank]) & (t <= end[rank]) & np.isfinite(res["gpu_power_w"][known])
    seen = np.bincount(rank[inside], minlength=it.shape[0])  # one pass over the samples, not one per rank
    counts, rates = [], []
    for r in ranks:
        n, span = int(seen[r]), float(end[r]) - float(begin[r])
        if n and span > 0:
            counts.append(n)
            rates.append(n / span)
    if not counts:
        out["power_note"] = "no power samples: the sampler reads GPU power only (RAPL is read between flush blocks)"
        return out
    out.update(power_samples=min(counts), power_sample_hz=min(rates))
    short = []
    if min(rates) < MLPERF_MIN_HZ:
        short.append(f"{min(rates):.2f} Hz, under {MLPERF_MIN_HZ:g} Hz: lower options.sample_period_s")
    if min(counts) < MLPERF_MIN_SAMPLES:
        short.append(f"{min(counts)} samples, under {MLPERF_MIN_SAMPLES}: train longer")
    out["power_note"] = "; ".join(short)
    return out


def add(table: pd.DataFrame, points: Sequence[PointData]) -> pd.DataFrame:
    """`table` (one row per point, a `point` column) with the energy columns."""
    if table.empty:
        return table.reindex(columns=[*table.columns, *COLUMNS])
    by_id = {p.point_id: p for p in points}
    rows = [{"point": pid, **row(by_id[pid])} for pid in table["point"]]
    return table.merge(pd.DataFrame(rows)[["point", *COLUMNS]], on="point", how="left")


def measured(table: pd.DataFrame) -> bool:
    """Whether some point of `table` has its energy."""
    return "energy_j" in table and bool(table["energy_j"].notna().any())


def sweep_note(table: pd.DataFrame) -> str:
    """One line for a sweep none of whose points has its energy: the first point's reason
    ("" where some point has it)."""
    if measured(table) or table.empty or "energy_note" not in table:
        return ""
    return f"energy: not measured: {table['energy_note'].iloc[0]}"
