"""Predictions without a trace (`hpcbench predict FILE.yaml`) and beyond a measured sweep
(`hpcbench predict SWEEP_DIR --nodes 8,16,32`).

For each node count: p = nodes × ranks_per_node ranks; every message costs the all-reduce of
its bytes on that machine (collectives.py: the spec's algorithm on its two levels; an MPI
library's own choice per message, mpi_rules.py, over the slowest level; or the
published fit of the nearest rank count when the level is given as fits); messages are
grouped and scheduled as the exchange says (exchange.py); t_iter = data + h2d + forward +
backward + exposed communication + update, with overlap (wait-free back-propagation) and
without. Efficiency is X(N) / (N·X(1)), X(1) the single rank's throughput.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from hpcbench.analysis import metrics, tables
from hpcbench.analysis.model import collectives as co
from hpcbench.analysis.model import exchange as ex
from hpcbench.analysis.model import mpi_rules, predict
from hpcbench.analysis.model.forecast_spec import ForecastSpec, Level
from hpcbench.analysis.model.iteration import Layer, PhaseTimes
from hpcbench.analysis.placement import placement_of, pollers
from hpcbench.store.reader import PointData

COLUMNS = ["nodes", "ranks", "t_iter_s", "throughput", "efficiency", "exposed_comm_s"]
MORE = ["t_iter_no_overlap_s", "throughput_no_overlap", "efficiency_no_overlap", "comm_total_s", "messages"]


def _fit_cost(level: Level, p: int) -> co.MessageCost:
    """The published fit at p ranks; else the nearest fit's link (ring), moved to p."""
    if p in level.fits:
        return level.fits[p]
    keys = sorted(level.fits)
    nearest = keys[max(0, bisect.bisect_right(keys, p) - 1)]
    link = co.link_from_collective_fit(nearest, level.fits[nearest].alpha, level.fits[nearest].beta)
    return co.ring_message_cost(p, link)


def message_cost(spec: ForecastSpec, nodes: int) -> ex.Cost:
    """Seconds of one all-reduce of n bytes on `nodes` nodes of the spec's machine."""
    p = nodes * spec.ranks_per_node
    if p == 1:
        return lambda n: 0.0
    level = spec.inter if nodes > 1 else spec.intra
    if level.fits:
        fit = _fit_cost(level, p)
        return fit.time
    zero = co.LinkCost(0.0, 0.0)
    topo = co.Topology(nodes, spec.ranks_per_node, spec.intra.link or zero, spec.inter.link or zero, spec.nics_per_node)
    if spec.algorithm in mpi_rules.RULES:  # a flat algorithm per message, as the library picks it
        return lambda n: mpi_rules.cost(spec.algorithm, n, p, topo.slowest)
    return lambda n: co.allreduce(n, topo, spec.algorithm)


def _t_iter(
    phases: PhaseTimes, layers: Sequence[Layer], cost: ex.Cost, exchange: ex.Exchange
) -> tuple[float, ex.Schedule]:
    s = ex.schedule(layers, cost, exchange)
    compute = phases.data + phases.h2d + phases.forward + s.backward + phases.update
    return compute + s.exposed, s


def forecast(spec: ForecastSpec) -> pd.DataFrame:
    """One row per node count: predicted t_iter, throughput, efficiency, exposed communication."""
    single, _ = _t_iter(spec.phases, spec.layers, lambda n: 0.0, spec.exchange)
    x1 = spec.batch_size / single
    serial_exchange = ex.Exchange(
        spec.exchange.fusion_bytes, spec.exchange.first_bucket_bytes, spec.exchange.cycle_s, False
    )
    rows = []
    for nodes in spec.nodes:
        ranks = nodes * spec.ranks_per_node
        cost = message_cost(spec, nodes)
        t, s = _t_iter(spec.phases, spec.layers, cost, spec.exchange)
        t_serial, _ = _t_iter(spec.phases, spec.layers, cost, serial_exchange)
        x, x_serial = ranks * spec.batch_size / t, ranks * spec.batch_size / t_serial
        rows.append({
            "nodes": nodes, "ranks": ranks, "t_iter_s": t, "throughput": x, "efficiency": x / (ranks * x1),
            "exposed_comm_s": s.exposed, "t_iter_no_overlap_s": t_serial, "throughput_no_overlap": x_serial,
            "efficiency_no_overlap": x_serial / (ranks * x1), "comm_total_s": s.comm_total,
            "messages": len(s.messages),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS + MORE)


def extrapolate(directory: Path, nodes: Sequence[int]) -> pd.DataFrame:
    """Each configuration of a measured sweep, calibrated on all its points, at `nodes` nodes
    of as many ranks per node as its largest point (one link for both levels: a sweep
    measures one network)."""
    sweep = tables.load(directory)
    stats = tables.stats_table(sweep.points).set_index("point")
    groups: dict[str, list[PointData]] = {}
    for p in sweep.points:
        groups.setdefault(metrics.scaling_group(p.point), []).append(p)
    rows = []
    for group in groups.values():
        cal = predict.calibrate(group, stats, None)
        largest = max(group, key=lambda p: p.iterations.shape[0])
        per_node = largest.point.ranks_per_node
        where = placement_of(largest)
        base = {"framework": largest.point.framework, "backend": largest.point.backend, "model": largest.point.model,
                "batch_size": largest.point.batch_size, "ranks_per_node": per_node}  # fmt: skip
        x1 = predict.predict_point(cal, 1, largest.point.batch_size, overlap=True).throughput
        for n in nodes:
            at = replace(where, pollers=pollers(largest, where.ranks_per_host, n * per_node))
            pred = predict.predict_point(cal, n * per_node, largest.point.batch_size, overlap=True, placement=at)
            rows.append({**base, "nodes": n, "ranks": n * per_node, "t_iter_s": pred.t_iter,
                         "throughput": pred.throughput, "efficiency": pred.throughput / (n * per_node * x1),
                         "exposed_comm_s": pred.comm_exposed, "comm_source": cal.comm_source})  # fmt: skip
    return pd.DataFrame(rows)
