"""Predictions without a trace (`hpcbench predict FILE.yaml`) and beyond a measured sweep
(`hpcbench predict SWEEP_DIR --nodes 8,16,32`).

For each node count: p = nodes × ranks_per_node ranks, each driving devices_per_rank devices
(d, default 1); the all-reduce runs over the p·d devices, nodes × ranks_per_node·d of them per
node. Every message costs the all-reduce of its bytes on that machine (collectives.py: the
spec's algorithm on its two levels; an MPI library's own choice per message, mpi_rules.py,
over the slowest level; or the published fit of the nearest rank count when the level is
given as fits); messages are grouped and scheduled as the exchange says (exchange.py);
t_iter = data + h2d + forward + backward + exposed communication + update + (d − 1)·h, h the
host work per device that one process does for each of its devices in turn
(iteration.serialised_host), with overlap (wait-free back-propagation) and without.
Efficiency is X(N) / (N·X(1)), N the devices, X(1) one device's throughput driven by a
process of its own.
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
from hpcbench.analysis.model.calibrated import Calibration
from hpcbench.analysis.model.forecast_spec import ForecastSpec, Level
from hpcbench.analysis.model.iteration import IterationPrediction, Layer, PhaseTimes, serialised_host
from hpcbench.analysis.placement import Placement, placement_of, pollers
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData

COLUMNS = ["nodes", "ranks", "t_iter_s", "throughput", "efficiency", "exposed_comm_s"]
MORE = ["t_iter_no_overlap_s", "throughput_no_overlap", "efficiency_no_overlap", "comm_total_s", "messages",
        "devices", "host_serial_s"]  # fmt: skip
EFFICIENCY_ROUNDING = 1e-9  # an efficiency this little above 1 is the same t_iter, rounded


def _fit_cost(level: Level, p: int) -> co.MessageCost:
    """The published fit at p ranks; else the nearest fit's link (ring), moved to p."""
    if p in level.fits:
        return level.fits[p]
    keys = sorted(level.fits)
    nearest = keys[max(0, bisect.bisect_right(keys, p) - 1)]
    link = co.link_from_collective_fit(nearest, level.fits[nearest].alpha, level.fits[nearest].beta)
    return co.ring_message_cost(p, link)


def message_cost(spec: ForecastSpec, nodes: int) -> ex.Cost:
    """Seconds of one all-reduce of n bytes on `nodes` nodes of the spec's machine, over every
    device (the devices of one process exchange over the intra-node level like ranks do)."""
    per_node = spec.devices_per_node
    p = nodes * per_node
    if p == 1:
        return lambda n: 0.0
    level = spec.inter if nodes > 1 else spec.intra
    if level.fits:
        fit = _fit_cost(level, p)
        return fit.time
    zero = co.LinkCost(0.0, 0.0)
    topo = co.Topology(nodes, per_node, spec.intra.link or zero, spec.inter.link or zero, spec.nics_per_node)
    if spec.algorithm in mpi_rules.RULES:  # a flat algorithm per message, as the library picks it
        return lambda n: mpi_rules.cost(spec.algorithm, n, p, topo.slowest)
    return lambda n: co.allreduce(n, topo, spec.algorithm)


def _t_iter(
    phases: PhaseTimes, layers: Sequence[Layer], cost: ex.Cost, exchange: ex.Exchange, host_serial: float = 0.0
) -> tuple[float, ex.Schedule]:
    s = ex.schedule(layers, cost, exchange)
    compute = phases.data + phases.h2d + phases.forward + s.backward + phases.update + host_serial
    return compute + s.exposed, s


def forecast(spec: ForecastSpec) -> pd.DataFrame:
    """One row per node count: predicted t_iter, throughput, efficiency, exposed communication."""
    single, _ = _t_iter(spec.phases, spec.layers, lambda n: 0.0, spec.exchange)
    x1 = spec.batch_size / single
    serial_exchange = ex.Exchange(
        spec.exchange.fusion_bytes, spec.exchange.first_bucket_bytes, spec.exchange.cycle_s, False
    )
    rows = []
    host = serialised_host(spec.host_s, spec.devices_per_rank)
    for nodes in spec.nodes:
        ranks = nodes * spec.ranks_per_node
        devices = ranks * spec.devices_per_rank
        cost = message_cost(spec, nodes)
        t, s = _t_iter(spec.phases, spec.layers, cost, spec.exchange, host)
        t_serial, _ = _t_iter(spec.phases, spec.layers, cost, serial_exchange, host)
        x, x_serial = devices * spec.batch_size / t, devices * spec.batch_size / t_serial
        rows.append({
            "nodes": nodes, "ranks": ranks, "t_iter_s": t, "throughput": x, "efficiency": x / (devices * x1),
            "exposed_comm_s": s.exposed, "t_iter_no_overlap_s": t_serial, "throughput_no_overlap": x_serial,
            "efficiency_no_overlap": x_serial / (devices * x1), "comm_total_s": s.comm_total,
            "messages": len(s.messages), "devices": devices, "host_serial_s": host,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS + MORE)


def _no_link(directory: Path, largest: PointData, nodes: Sequence[int]) -> HpcbenchError:
    """The refusal of a configuration measured on one rank only, at node counts of >= 2 ranks:
    one rank sends no message, so no message cost (the link's α, β) can be fitted, and a
    prediction without one would cost the exchange nothing (the single rank's own exchange
    phase, which the model does not carry to more ranks, then made the efficiency exceed 1)."""
    p = largest.point
    ranks = [n * p.ranks_per_node for n in nodes if n * p.ranks_per_node >= 2]
    return HpcbenchError(
        f"{directory}: {p.framework}/{p.backend} {p.model} b={p.batch_size} was measured on 1 rank only: "
        f"calibrating a link (the exchange's message cost) needs points of >= 2 ranks with messages, so it "
        f"cannot be predicted at {', '.join(map(str, ranks))} ranks; add a point of >= 2 ranks to the sweep, or "
        "describe the run in a prediction file with its links (`links:`, or `from_commbench:` on `hpcbench "
        "commbench` files; docs/predict.md)"
    )


def above_one(cal: Calibration, single: IterationPrediction, pred: IterationPrediction, where: Placement) -> str:
    """Why the efficiency of `pred` (at pred.ranks) against `single` (one rank, the same batch)
    exceeds 1, from the parts of the two predictions: t_iter(N) < t_iter(1) means a shorter
    exchange or a shorter compute at N ranks (the time in no phase is the same at both)."""
    e1, en = single.comm_exposed, pred.comm_exposed
    c1 = single.data + single.h2d + single.forward + single.backward + single.update
    cn = pred.data + pred.h2d + pred.forward + pred.backward + pred.update
    reasons = []
    if en < e1:
        alone = f"measured on {cal.point}" if cal.local_exchange > 0 else "half its background thread's cycle"
        costed = "its messages over the fitted link" if cal.link else "no link: only the wait for the last rank"
        reasons.append(
            f"one rank's own exchange ({e1 * 1e3:.2f} ms, {alone}: its all-reduce over itself) is not carried to "
            f"{pred.ranks} ranks, where the model exposes {en * 1e3:.2f} ms of exchange ({costed})"
        )
    if cn < c1:
        reasons.append(
            f"compute per rank is {cn * 1e3:.2f} ms at {pred.ranks} ranks ({where.describe()}) against "
            f"{c1 * 1e3:.2f} ms on one rank ({cal.on(cal.placement).describe()}): fewer rank(s) share each core, or "
            "more threads per rank"
        )
    if not reasons:  # rounding only: no part is shorter
        reasons.append(f"t_iter {pred.t_iter * 1e3:.2f} ms at {pred.ranks} ranks against {single.t_iter * 1e3:.2f} ms")
    return f"efficiency above 100 % at {pred.ranks} ranks: " + "; ".join(reasons)


ONE_NODE_NOTE = (
    "measured on one node: 2 nodes or more are costed with the link fitted inside it (no network was "
    "measured); give the network with --links FILE.yaml"
)


def extrapolate(directory: Path, nodes: Sequence[int], network: tuple[co.LinkCost, str] | None = None) -> pd.DataFrame:
    """Each configuration of a measured sweep, calibrated on all its points, at `nodes` nodes
    of as many ranks per node as its largest point. The link is the one fitted on the sweep,
    except on two nodes or more where `network` (a link and where it came from: `--links`)
    is given: the ring's every step waits for its slowest hop, a network one. Without it, a
    configuration measured on one node costs more nodes with the link of that node, and its
    rows' `note` says so (notes one per line). A configuration measured on one rank only, without a link, is
    refused at >= 2 ranks (HpcbenchError): it has nothing to cost the exchange with. A row
    whose efficiency exceeds 1 says why in `note` (above_one)."""
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
        if cal.link is None and largest.iterations.shape[0] < 2 and any(n * per_node >= 2 for n in nodes):
            raise _no_link(directory, largest, nodes)
        where = placement_of(largest)
        base = {"framework": largest.point.framework, "backend": largest.point.backend, "model": largest.point.model,
                "batch_size": largest.point.batch_size, "ranks_per_node": per_node}  # fmt: skip
        single = predict.predict_point(cal, 1, largest.point.batch_size, overlap=True)
        one_node = all(p.point.nodes == 1 for p in group)
        for n in nodes:
            at = replace(where, pollers=pollers(largest, where.ranks_per_host, n * per_node))
            costed, source, note = cal, cal.comm_source, ""
            if n >= 2 and network is not None:
                costed, source = replace(cal, link=network[0]), f"{network[1]} (the network, from --links)"
            elif n >= 2 and one_node:
                note = ONE_NODE_NOTE
            pred = predict.predict_point(costed, n * per_node, largest.point.batch_size, overlap=True, placement=at)
            efficiency = pred.throughput / (n * per_node * single.throughput)
            if efficiency > 1 + EFFICIENCY_ROUNDING:
                note = "\n".join(filter(None, (note, above_one(costed, single, pred, costed.on(at)))))
            rows.append({**base, "nodes": n, "ranks": n * per_node, "t_iter_s": pred.t_iter,
                         "throughput": pred.throughput, "efficiency": efficiency, "exposed_comm_s": pred.comm_exposed,
                         "comm_source": source, "note": note})  # fmt: skip
    return pd.DataFrame(rows)
