"""Calibrating a configuration on its smallest runs (`calibrate`): phases, layers, the link,
CPU contention, the single rank's exchange and the wait for the last rank, as predict.py
lists them.

Whatever depends on how the backend and launcher behave is read from the traits the
calibration point recorded (`PointData.traits`, store/traits.py), never from their names:
`parameter_server` and `asynchronous` (servers.py), `mpi_exchange` (its gradients go through
MPI_Allreduce: costed by the MPI library's rules, served after backward), `background_thread`
with `launcher_mpi` (a thread whose controller is MPI: MPI's all-reduce on CPU tensors, and a
cycle wait at one rank), `sleeping_wait` and `waits_per_message` (contention.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

import numpy as np
import pandas as pd

from hpcbench.analysis.model import fit, mpi_rules
from hpcbench.analysis.model.calibrated import Calibration, predict_point, scaled, sharing
from hpcbench.analysis.model.collectives import LinkCost, ModelError, ring_link
from hpcbench.analysis.model.contention import (
    effective_cores_from_wait,
    exchange_wait,
    fit_effective_cores,
    fit_phi,
    ring_sleeps,
    rings_that_wait,
)
from hpcbench.analysis.model.derived import Derived, timed_mask
from hpcbench.analysis.model.exchange import HOROVOD_CYCLE_S
from hpcbench.analysis.model.iteration import Layer, PhaseTimes
from hpcbench.analysis.model.servers import link_from_transfers, servers_of
from hpcbench.analysis.placement import Placement, thread_over_mpi
from hpcbench.store.reader import PointData

CYCLE_TIME = "HOROVOD_CYCLE_TIME"  # a background thread's cycle in ms, as the ranks' environment set it


def cycle_wait(p: PointData) -> float:
    """What one rank waits after backward though it sends nothing, where a background thread
    runs its collectives (trait `background_thread`: Horovod's): the thread takes the tensors
    handed to it once per cycle (HOROVOD_CYCLE_TIME in ms, as the ranks' environment set it,
    else Horovod's default), on average half a cycle after the last gradient is ready. 0 for
    other backends."""
    if not p.traits.background_thread:
        return 0.0
    value = p.environment.get(CYCLE_TIME, "")
    try:
        cycle = float(value) / 1e3 if value else HOROVOD_CYCLE_S
    except ValueError:
        cycle = HOROVOD_CYCLE_S
    return cycle / 2 if math.isfinite(cycle) and cycle > 0 else HOROVOD_CYCLE_S / 2


def mpi_rules_of(p: PointData) -> str:
    """The all-reduce rules (mpi_rules.py) of a point on CPU whose gradients went through
    MPI_Allreduce, from the MPI library its provenance names; "" otherwise (a ring). That is
    a backend of trait `mpi_exchange`, or one whose background thread's controller is MPI
    (`placement.thread_over_mpi`: Horovod runs MPI's all-reduce on CPU tensors there, Gloo's
    ring where `horovodrun` started it with Gloo)."""
    traits = p.traits
    through_mpi = thread_over_mpi(p) if traits.background_thread else traits.mpi_exchange
    if not through_mpi or p.point.device != "cpu":
        return ""
    return mpi_rules.library(p.provenance.get("mpi"), p.provenance.get("environment"))


def fit_link_from_points(
    points: Sequence[PointData], derived: Derived | None = None, cpu: bool = False, cores: float = 0.0
) -> tuple[LinkCost, str]:
    """The link α, β from the gradient messages of points with the same rank count, each message
    costed as the backend's all-reduce ran it (a ring, or the algorithm the MPI library chose
    for its size: mpi_rules.py; with `cpu`, less the hops' scheduling wait and divided by their
    oversubscription: the link of ranks that each have their cores)."""
    derived = derived or Derived()
    ranks = {p.iterations.shape[0] for p in points}
    if len(ranks) != 1:
        raise ModelError(f"messages of different rank counts {sorted(ranks)} fitted as one")
    sizes, times = zip(*(derived.costs(p) for p in points), strict=True)
    result = fit.fit_alpha_beta(np.concatenate(sizes), np.concatenate(times))
    names = " ".join(p.point_id for p in points)
    (n,) = ranks
    traits = points[0].traits
    servers = servers_of(points[0].point, traits)
    rules = mpi_rules_of(points[0])
    if servers:
        link = link_from_transfers(result.cost, servers, n)
    elif rules:
        link = fit.fit_rules_link(rules, n, np.concatenate(sizes), np.concatenate(times))
    else:
        link = ring_link(result.cost, n)
    places = [(w, replace(w, cores=cores) if cores > 0 else w) for w in (derived.measured_placement(p) for p in points)]
    host, where = max(places, key=lambda pair: pair[1].oversubscription)
    oversub = where.oversubscription if cpu else 1.0
    if oversub > 1:
        # the scheduling waits of its rings (rings_that_wait), spread over its messages, are not the link's
        per_iteration = len(sizes[0]) / max(len(np.unique(derived.messages(points[0])["iteration"])), 1)
        rings = rings_that_wait(traits, round(per_iteration))
        wait = exchange_wait(host, traits, n) * rings / max(per_iteration, 1.0)  # 0 below 2 ranks
        alpha = max(link.alpha - wait / (2 * (n - 1)), 0.0) if wait > 0 else link.alpha
        link = LinkCost(alpha / oversub, link.beta / oversub, link.gamma / oversub)
    note = f", {oversub:.1f}x oversubscribed" if oversub > 1 else ""
    note += f", {rules} all-reduce rules" if rules else ""
    return link, f"messages of {names} (N={n}, {result.n} messages{note})"


def _first_fit(
    order: Sequence[PointData], derived: Derived, fitter: Callable[[Placement, Placement, float, float], float | None]
) -> tuple[float, PointData, Placement] | None:
    """The first value `fitter` finds between the base point (order[0]) and a later point, that
    point and its placement; None where no pair fits."""
    base = order[0]
    a = derived.measured_placement(base)
    for p in order[1:]:
        b = derived.measured_placement(p)
        value = fitter(a, b, derived.compute_s(base), derived.compute_s(p))
        if value is not None:
            return value, p, b
    return None


def _thread_exponent(order: Sequence[PointData], derived: Derived) -> tuple[float, str, str | None]:
    """φ from the base point and the smallest point with other threads; its source and that point."""
    base, a = order[0], derived.measured_placement(order[0])
    found = _first_fit(order, derived, fit_phi)
    if found is not None:
        phi, p, b = found
        return phi, f"fitted on {base.point_id} ({a.threads} threads) and {p.point_id} ({b.threads})", p.point_id
    return 0.0, "not measured (no calibration points with other threads): threads assumed not to help", None


def _effective_cores(order: Sequence[PointData], derived: Derived) -> tuple[float, str, str | None]:
    """C_eff from the base point, when it runs one thread-load, and the smallest point of more
    ranks per host with its threads; its source and that point."""
    base, a = order[0], derived.measured_placement(order[0])
    found = _first_fit(order, derived, fit_effective_cores)
    if found is not None:
        cores, p, b = found
        source = f"fitted on {base.point_id} (1 rank) and {p.point_id} ({b.ranks_per_host} ranks per host)"
        return cores, f"{cores:.2f} of {a.cores:g} cores, {source}", p.point_id
    wait = derived.cpu_wait(base)
    from_wait = effective_cores_from_wait(a, wait)
    if from_wait is not None:
        waited = f"{a.ranks_per_host} ranks per host, their loops waited {wait:.0%}"
        source = f"from the run-queue wait of {base.point_id} ({waited})"
        return from_wait, f"{from_wait:.2f} of {a.cores:g} cores, {source}", None
    unknown = "no one-rank and several-rank calibration points, no run-queue wait of a loop that computes"
    return 0.0, f"not measured ({unknown}): the CPU count", None


def _spread(layers: Sequence[Layer], backward: float) -> list[Layer]:
    """The measured backward time over the layers: in proportion to their measured backward,
    or, where none was measured, to their bytes (every layer kept)."""
    total = sum(layer.backward_s for layer in layers)
    if total > 0:
        return scaled(layers, backward / total)
    size = sum(layer.grad_bytes for layer in layers)
    if size > 0:
        return [Layer(layer.grad_bytes, backward * layer.grad_bytes / size) for layer in layers]
    return [Layer(layer.grad_bytes, backward / len(layers)) for layer in layers]


def _run_shape(p: PointData) -> tuple[int, int, int, int]:
    """What a repeat shares with the run it repeats: ranks, their placement, the batch."""
    return p.iterations.shape[0], p.point.nodes, p.point.ranks_per_node, p.point.batch_size


def calibrate(
    group: Sequence[PointData], stats: pd.DataFrame, link: LinkCost | None, derived: Derived | None = None
) -> Calibration:
    """Calibrate one configuration (its points, any scale) from its smallest runs; `derived`:
    what earlier calibrations from the same `stats` derived from the points."""
    derived = derived if derived is not None and derived.stats is stats else Derived(stats)
    order = sorted(group, key=lambda p: (p.iterations.shape[0], p.point.seed, p.point.batch_size, p.point_id))
    base = order[0]
    traits = base.traits
    repeats = [p.point_id for p in order if _run_shape(p) == _run_shape(base)]
    row = stats.loc[repeats].mean(numeric_only=True)  # the base's repeats: one run's noise averaged out
    phases = PhaseTimes(float(row["data_s"]), float(row["h2d_s"]), float(row["forward_s"]), float(row["update_s"]))
    measured = sum(float(row[f"{name}_s"]) for name in ("data", "h2d", "forward", "backward", "comm", "update"))
    overhead = max(float(row["t_iter_s"]) - measured, 0.0)
    servers = servers_of(base.point, traits)
    # a single rank's exchange, where no message of it is modelled (a parameter server's one
    # worker already pushes to and pulls from its servers); unmeasured, a background thread's cycle wait
    measured_alone = base.iterations.shape[0] == 1
    alone = float(row["comm_s"]) if measured_alone and not servers else 0.0
    backward = float(row["backward_s"])
    calibration = set(repeats)
    with_messages = [p for p in order if len(p.comm)]
    if with_messages:
        source = with_messages[0]
        timed = timed_mask(source.iterations)
        messages = derived.messages(source)
        if servers:  # each tensor once: its push leaves when its gradient is ready
            messages = messages[messages["op"] == b"push"]
        layers = _spread(fit.layers_from_trace(source.iterations, messages, timed, None), backward)
    else:
        layers = [Layer(0.0, backward)]
    cpu = base.point.device == "cpu"
    cores, cores_source, cores_point = _effective_cores(order, derived) if cpu else (0.0, "GPU", None)
    calibration |= {cores_point} if cores_point else set()
    comm_source = "commbench" if link is not None else ""
    if link is None:
        # a ring needs >= 2 ranks to show a message's cost; a parameter server's one worker
        # already crosses to the servers
        multi = [p for p in with_messages if p.iterations.shape[0] >= (1 if servers else 2)]
        if multi:
            smallest = min(p.iterations.shape[0] for p in multi)
            chosen = [p for p in multi if p.iterations.shape[0] == smallest]
            link, comm_source = fit_link_from_points(chosen, derived, cpu, cores)
            calibration |= {p.point_id for p in chosen}
        else:
            comm_source = "none: no messages recorded between >= 2 ranks, communication not modelled"
    if servers:
        comm_source += f"; parameter servers: {servers.count} ({'sync' if servers.sync else 'async'})"
    phi, phi_source, phi_point = _thread_exponent(order, derived) if cpu else (0.0, "GPU: no CPU contention", None)
    calibration |= {phi_point} if phi_point else set()
    cal = Calibration(
        base.point_id, base.point.batch_size, phases, layers, overhead, link, comm_source, calibration,
        derived.measured_placement(base), phi, phi_source, cpu, cores, cores_source, traits, servers,
        mpi_rules_of(base), local_exchange=alone if math.isfinite(alone) else 0.0,
        cycle_wait=0.0 if measured_alone else cycle_wait(base), overlaps=not traits.mpi_exchange,
    )  # fmt: skip
    return _with_sync_wait(cal, order, stats, derived)


def _with_sync_wait(cal: Calibration, order: Sequence[PointData], stats: pd.DataFrame, derived: Derived) -> Calibration:
    """`cal` with the wait for the last rank (skew.py) measured on its smallest points of two
    or more ranks: their exchange phase beyond the modelled exposed exchange, at least 0.
    Not for a ring whose threads sleep while they wait (contention.ring_sleeps): its wait for
    the peers' threads is the scheduler's (contention.exchange_wait), not the order statistic's."""
    multi = [p for p in order if p.iterations.shape[0] >= 2]
    if not multi or ring_sleeps(cal.traits):
        return cal
    n = multi[0].iterations.shape[0]
    chosen = [p for p in multi if p.iterations.shape[0] == n]
    waits = []
    for p in chosen:
        pred = predict_point(cal, n, p.point.batch_size, overlap=True, placement=derived.measured_placement(p))
        waits.append(float(cast(float, stats.loc[p.point_id, "t_iter_s"])) - pred.t_iter)
    wait = float(np.nanmean(waits)) if np.isfinite(waits).any() else 0.0
    if not wait > 0:
        return cal
    points = cal.calibration_points | {p.point_id for p in chosen}
    shared = sharing(cal, derived.placement(chosen[0]))  # one configuration, one rank count: one placement
    return replace(cal, sync=wait, sync_ranks=n, sync_shared=shared, calibration_points=points)
