"""Prediction beside measurement: fit the model on a configuration's smallest runs, predict the rest.

A configuration is the points that differ only in scale (nodes, ranks per node, batch
size) and seed. Its calibration:

- phases (data, h2d, forward, backward, update) and the time in no phase ("overhead":
  t_iter minus all measured phases) from the point with the fewest ranks, the mean over its
  repeats (points that differ from it only in seed); compute phases scale linearly with the
  per-rank batch when a point's batch differs;
- layers (gradient buckets: bytes and backward time) from the smallest point that recorded
  messages, their backward times scaled to add up to the calibration point's backward;
- the link's α and β: from a commbench file when one is given, else from the messages of
  the points with the smallest rank count >= 2 (tc(M) = α_p + β_p·M fitted, then turned
  into the link cost of a ring all-reduce of p ranks, which gives tc at any other N; where
  the gradients went through MPI_Allreduce, each message costed by the algorithm the MPI
  library chose for its size and rank count, mpi_rules.py); for a
  parameter-server backend from every push and pull of the smallest points with messages,
  one worker included, as servers.py turns them into a step's cost at any other N.

- CPU contention (contention.py): compute follows the cores each rank really has, from the
  placement recorded in the point file (ranks per host, threads, cores); the thread exponent
  φ from two calibration points with different threads; on CPU the collectives' per-hop
  costs grow with oversubscription too, and where the backend's threads sleep while they wait
  the exchange's first ring waits half a scheduler slice per step for its threads (a
  CPU-driven ring waits for peers to be scheduled), so the link is fitted per unit of
  oversubscription, that wait taken out.
- whether the backend's messages progress beside backward: not where its gradients go
  through MPI_Allreduce (`MPI_EXCHANGES`): a blocking call after backward, or a non-blocking
  one that MPI progresses only inside MPI calls (no progress thread: measured,
  benchmarks/mpi_progress.py), so that its service begins with the wait after backward;
- the exchange a single rank still runs (its backend's all-reduce over one rank: the wait
  for its hooks, its buckets' copies): the exchange phase of a one-rank calibration point,
  predicted at one rank only (from two ranks on, the messages the link was fitted on
  carry it); where no rank ran alone, Horovod's one rank waits half its cycle for its
  background thread (`cycle_wait`);
- the wait for the last rank (skew.py): the exchange phase of the smallest points of two or
  more ranks beyond the exposed exchange modelled for them, carried to N ranks as the
  expected largest of N normal draws grows.

Every point is then predicted with and without wait-free back-propagation and compared with
its measured t_iter; calibration points are marked (their error is in-sample). How well the
model predicts scales it was not fitted on is validate.py's (leave one scale out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np
import pandas as pd

from hpcbench.analysis.model import fit, mpi_rules, skew
from hpcbench.analysis import metrics
from hpcbench.analysis.model.collectives import LinkCost, ModelError, ring_link
from hpcbench.analysis.model.contention import (
    SLEEPING_WAITS,
    Placement,
    compute_scale,
    effective_cores_from_wait,
    exchange_wait,
    fit_effective_cores,
    fit_phi,
    horovod_over_mpi,
    placement_of,
    ranks_take_turns,
    rings_that_wait,
)
from hpcbench.analysis.model.exchange import HOROVOD_CYCLE_S
from hpcbench.analysis.model.iteration import IterationPrediction, Layer, PhaseTimes, predict_iteration
from hpcbench.analysis.model.servers import Servers, link_from_transfers, servers_of
from hpcbench.store import schema
from hpcbench.store.reader import PointData

LOOP_COMPUTES = 0.25  # the loop's runnable share within this of the compute share: the loop computes

PREDICTION_COLUMNS = [
    "point", "framework", "backend", "model", "ranks", "batch_size", "seed", "calibration",
    "measured_t_iter_s", "predicted_t_iter_s", "rel_error", "predicted_no_overlap_s", "rel_error_no_overlap",
    "measured_throughput", "predicted_throughput", "measured_efficiency", "predicted_efficiency",
    "pred_comm_total_s", "pred_comm_exposed_s", "pred_sync_wait_s", "alpha_s", "beta_s_per_byte", "comm_source",
    "oversubscribed", "compute_scale", "note",
]  # fmt: skip
COMPUTE_PHASES = ("data", "h2d", "forward", "backward", "update")


@dataclass
class Calibration:
    """What a configuration's predictions are made from."""

    point: str
    batch_size: int
    phases: PhaseTimes
    layers: list[Layer]
    overhead: float
    link: LinkCost | None  # per unit of oversubscription when `cpu`
    comm_source: str
    calibration_points: set[str] = field(default_factory=set)
    placement: Placement = field(default_factory=lambda: Placement(1, 1, 0))  # where the phases were measured
    phi: float = 0.0  # thread exponent (contention.py)
    phi_source: str = "not measured: threads assumed not to help"
    cpu: bool = True  # CPU-driven collectives: their cost grows with oversubscription
    cores: float = 0.0  # the host's effective cores for compute (contention.py); 0: its CPU count
    cores_source: str = "not measured: the CPU count"
    backend: str = ""  # whose collectives (contention.SLEEPING_WAITS)
    servers: Servers | None = None  # a parameter-server backend's (servers.py); None: a ring
    mpi: str = ""  # the rules of the MPI library whose MPI_Allreduce exchanged (mpi_rules.py); "": a ring
    sync: float = 0.0  # the wait for the last rank at `sync_ranks` ranks (skew.py)
    sync_ranks: int = 0
    sync_shared: Sharing | None = None  # how the measured points shared the CPUs (None: they did not)
    local_exchange: float = 0.0  # the exchange phase of a one-rank calibration point (model.predict_iteration)
    cycle_wait: float = 0.0  # without one: Horovod's wait for its cycle at one rank (`cycle_wait`), not CPU work
    overlaps: bool = True  # its messages progress beside backward (not through MPI_Allreduce: MPI_EXCHANGES)

    def on(self, where: Placement) -> Placement:
        """`where` with the host's effective cores in place of its CPU count, when fitted."""
        return replace(where, cores=self.cores) if self.cores > 0 else where


def _timed_mask(iterations: np.ndarray) -> np.ndarray:
    return np.asarray(~iterations["warmup"].any(axis=0))


def _scaled(layers: Sequence[Layer], factor: float) -> list[Layer]:
    return [Layer(layer.grad_bytes, layer.backward_s * factor) for layer in layers]


def _main_op(comm: np.ndarray) -> bytes | None:
    """The collective most messages used (all-reduce in data-parallel training)."""
    if len(comm) == 0:
        return None
    if (comm["op"] == comm["op"][0]).all():
        return bytes(comm["op"][0])
    ops, counts = np.unique(comm["op"], return_counts=True)
    return bytes(ops[int(np.argmax(counts))])


# Files written before `comm_end` was recorded: the exchanges that saw their ends in a wait then
_WAITED_BEFORE_COMM_END = (("torch_exchange", "mpi"), ("torch_exchange", "horovod"), ("jax_exchange", "pmean"))


def ends_seen_in_wait(p: PointData) -> bool:
    """Whether the point's message ends are the moments a wait after backward saw them (fit.py)."""
    recorded = p.provenance.get("comm_end")
    if recorded is not None:
        return bool(recorded == schema.COMM_END_WAIT)
    return any(p.provenance.get(key) == value for key, value in _WAITED_BEFORE_COMM_END)


class Derived:
    """What calibrations derive from a sweep's points, each once per analysis: the leave-one-
    scale-out check calibrates every configuration once per scale from the same points (a big
    point's messages are selected and timed once, not once per calibration)."""

    def __init__(self, stats: pd.DataFrame | None = None) -> None:
        """`stats` (indexed by point id): the points' phases, for `compute_s`."""
        self.stats = stats
        self._compute: dict[str, float] = {}
        if stats is not None:
            compute = stats[[f"{name}_s" for name in COMPUTE_PHASES]].sum(axis=1, skipna=False)
            self._compute = {str(k): float(v) for k, v in compute.items()}
        self._messages: dict[str, np.ndarray] = {}
        self._costs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._placements: dict[str, Placement] = {}

    def cpu_wait(self, p: PointData) -> float:
        """The share of its runnable time that the point's training loop waited for a CPU
        (resources.py), where the loop is what computes: it was runnable for the compute
        phases' share of t_iter (or, a loop that polls in the exchange as MPI's does, for
        the compute's and the exchange's), within LOOP_COMPUTES. NaN otherwise, or not
        measured: a loop that hands the compute to a framework's own threads (TensorFlow,
        MXNet, JAX) or process (CNTK) does not wait for a CPU when they do."""
        columns = ("cpu_wait", "loop_runnable", "t_iter_s", "comm_s")
        if self.stats is None or not set(columns) <= set(self.stats.columns) or p.point_id not in self.stats.index:
            return math.nan
        wait, runnable, t_iter, comm = (float(cast(float, self.stats.loc[p.point_id, c])) for c in columns)
        compute = self._compute.get(p.point_id, math.nan)
        if not t_iter > 0 or not runnable > 0:
            return math.nan
        computes = any(abs(runnable * t_iter / busy - 1) <= LOOP_COMPUTES for busy in (compute, compute + comm))
        return wait if computes else math.nan

    def compute_s(self, p: PointData) -> float:
        """The point's compute phases per sample (s)."""
        return self._compute[p.point_id] / p.point.batch_size

    def placement(self, p: PointData) -> Placement:
        if p.point_id not in self._placements:
            self._placements[p.point_id] = placement_of(p)
        return self._placements[p.point_id]

    def work_wait(self, p: PointData) -> float:
        """The run-queue wait share of the point's threads, each weighted by its time on a CPU
        (`work_wait`, schema 7); NaN where not measured."""
        if self.stats is None or "work_wait" not in self.stats.columns or p.point_id not in self.stats.index:
            return math.nan
        return float(cast(float, self.stats.loc[p.point_id, "work_wait"]))

    def measured_placement(self, p: PointData) -> Placement:
        """`placement(p)` with its pollers as the point's waits measured them: threads that
        waited a share w of their runnable time for a CPU had C / (1 − w) thread-loads beside
        them. The wait is its training loop's where the loop computes (`cpu_wait`), else its
        threads' by their work (`work_wait`): the framework's own threads that compute (a loop
        that hands them the compute waits for them, not for a CPU) and the polling thread
        itself, which spins on a CPU only as long as it is scheduled."""
        where = self.placement(p)
        if where.pollers == 0 or not where.cores > 0:
            return where
        wait = self.cpu_wait(p)
        wait = wait if 0 <= wait < 1 else self.work_wait(p)
        if not 0 <= wait < 1:
            return where
        return replace(where, pollers=where.pollers_seen(where.cores / (1 - wait)))

    def messages(self, p: PointData) -> np.ndarray:
        """The point's messages of (at most fit.MAX_ITERATIONS) timed iterations."""
        if p.point_id not in self._messages:
            self._messages[p.point_id] = fit.timed_messages(p.comm, _timed_mask(p.iterations))
        return self._messages[p.point_id]

    def costs(self, p: PointData) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, seconds) of the point's main collective's messages (of every push and pull
        of a parameter-server backend)."""
        if p.point_id not in self._costs:
            selected = self.messages(p)
            if servers_of(p.point):  # pushes queue behind pushes, pulls behind pulls
                streams = [selected[selected["op"] == op] for op in np.unique(selected["op"])]
            else:
                op = _main_op(selected)
                streams = [selected if op is None or (selected["op"] == op).all() else selected[selected["op"] == op]]
            waits = fit.wait_starts(p.iterations) if ends_seen_in_wait(p) else None
            costs = pd.concat([fit.message_costs(comm, None, waits=waits) for comm in streams], ignore_index=True)
            self._costs[p.point_id] = (costs["bytes"].to_numpy(dtype=float), costs["seconds"].to_numpy(dtype=float))
        return self._costs[p.point_id]


# Backends whose gradients go through MPI_Allreduce from the training loop's thread: blocking
# after backward (Chainer, Theano, Caffe, CNTK), or non-blocking from backward's hooks (torch
# `mpi`, through mpi4py), which MPI progresses only inside MPI calls (Open MPI has no progress
# thread): either way a message is served once backward is over. (Horovod's background thread
# runs its all-reduces beside backward.)
MPI_EXCHANGES = frozenset({"mpi", "naive"})


def cycle_wait(p: PointData) -> float:
    """What one rank of Horovod waits after backward though it sends nothing: its background
    thread takes the tensors handed to it once per cycle (HOROVOD_CYCLE_TIME in ms, as the
    ranks' environment set it, else Horovod's default), on average half a cycle after the
    last gradient is ready. 0 for other backends."""
    if p.point.backend != "horovod":
        return 0.0
    value = p.environment.get("HOROVOD_CYCLE_TIME", "")
    try:
        cycle = float(value) / 1e3 if value else HOROVOD_CYCLE_S
    except ValueError:
        cycle = HOROVOD_CYCLE_S
    return cycle / 2 if math.isfinite(cycle) and cycle > 0 else HOROVOD_CYCLE_S / 2


def mpi_rules_of(p: PointData) -> str:
    """The all-reduce rules (mpi_rules.py) of a point whose backend exchanges its gradients by
    MPI_Allreduce, from the MPI library its provenance names; "" otherwise (a ring). Horovod
    runs MPI's all-reduce on CPU tensors where its controller is MPI (launched by mpirun or
    srun), Gloo's ring where `horovodrun` started it with Gloo."""
    through_mpi = horovod_over_mpi(p) if p.point.backend == "horovod" else p.point.backend in MPI_EXCHANGES
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
    servers = servers_of(points[0].point)
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
        backend = points[0].point.backend
        rings = rings_that_wait(backend, round(per_iteration))
        wait = exchange_wait(host, backend, n) * rings / max(per_iteration, 1.0)  # 0 below 2 ranks
        alpha = max(link.alpha - wait / (2 * (n - 1)), 0.0) if wait > 0 else link.alpha
        link = LinkCost(alpha / oversub, link.beta / oversub, link.gamma / oversub)
    note = f", {oversub:.1f}x oversubscribed" if oversub > 1 else ""
    note += f", {rules} all-reduce rules" if rules else ""
    return link, f"messages of {names} (N={n}, {result.n} messages{note})"


def _thread_exponent(order: Sequence[PointData], derived: Derived) -> tuple[float, str, str | None]:
    """φ from the base point and the smallest point with other threads; its source and that point."""
    base = order[0]
    a = derived.measured_placement(base)
    for p in order[1:]:
        b = derived.measured_placement(p)
        phi = fit_phi(a, b, derived.compute_s(base), derived.compute_s(p))
        if phi is not None:
            return phi, f"fitted on {base.point_id} ({a.threads} threads) and {p.point_id} ({b.threads})", p.point_id
    return 0.0, "not measured (no calibration points with other threads): threads assumed not to help", None


def _effective_cores(order: Sequence[PointData], derived: Derived) -> tuple[float, str, str | None]:
    """C_eff from the base point, when it runs one thread-load, and the smallest point of more
    ranks per host with its threads; its source and that point."""
    base = order[0]
    a = derived.measured_placement(base)
    for p in order[1:]:
        b = derived.measured_placement(p)
        cores = fit_effective_cores(a, b, derived.compute_s(base), derived.compute_s(p))
        if cores is not None:
            source = f"fitted on {base.point_id} (1 rank) and {p.point_id} ({b.ranks_per_host} ranks per host)"
            return cores, f"{cores:.2f} of {a.cores:g} cores, {source}", p.point_id
    wait = derived.cpu_wait(base)
    cores = effective_cores_from_wait(a, wait)
    if cores is not None:
        waited = f"{a.ranks_per_host} ranks per host, their loops waited {wait:.0%}"
        return cores, f"{cores:.2f} of {a.cores:g} cores, from the run-queue wait of {base.point_id} ({waited})", None
    unknown = "no one-rank and several-rank calibration points, no run-queue wait of a loop that computes"
    return 0.0, f"not measured ({unknown}): the CPU count", None


def _spread(layers: Sequence[Layer], backward: float) -> list[Layer]:
    """The measured backward time over the layers: in proportion to their measured backward,
    or, where none was measured, to their bytes (every layer kept)."""
    total = sum(layer.backward_s for layer in layers)
    if total > 0:
        return _scaled(layers, backward / total)
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
    repeats = [p.point_id for p in order if _run_shape(p) == _run_shape(base)]
    row = stats.loc[repeats].mean(numeric_only=True)  # the base's repeats: one run's noise averaged out
    phases = PhaseTimes(float(row["data_s"]), float(row["h2d_s"]), float(row["forward_s"]), float(row["update_s"]))
    measured = sum(float(row[f"{name}_s"]) for name in ("data", "h2d", "forward", "backward", "comm", "update"))
    overhead = max(float(row["t_iter_s"]) - measured, 0.0)
    servers = servers_of(base.point)
    # a single rank's exchange, where no message of it is modelled (a parameter server's one
    # worker already pushes to and pulls from its servers); unmeasured, Horovod's cycle wait
    measured_alone = base.iterations.shape[0] == 1
    alone = float(row["comm_s"]) if measured_alone and not servers else 0.0
    backward = float(row["backward_s"])
    calibration = set(repeats)
    with_messages = [p for p in order if len(p.comm)]
    if with_messages:
        source = with_messages[0]
        timed = _timed_mask(source.iterations)
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
        derived.measured_placement(base), phi, phi_source, cpu, cores, cores_source, base.point.backend, servers,
        mpi_rules_of(base), local_exchange=alone if math.isfinite(alone) else 0.0,
        cycle_wait=0.0 if measured_alone else cycle_wait(base), overlaps=base.point.backend not in MPI_EXCHANGES,
    )  # fmt: skip
    return _with_sync_wait(cal, order, stats, derived)


def _with_sync_wait(cal: Calibration, order: Sequence[PointData], stats: pd.DataFrame, derived: Derived) -> Calibration:
    """`cal` with the wait for the last rank (skew.py) measured on its smallest points of two
    or more ranks: their exchange phase beyond the modelled exposed exchange, at least 0.
    Not for a backend whose threads sleep while they wait: its wait for the peers' threads is
    the scheduler's (contention.exchange_wait), not the order statistic's."""
    multi = [p for p in order if p.iterations.shape[0] >= 2]
    if not multi or cal.backend in SLEEPING_WAITS:
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


Sharing = tuple[bool, bool]  # (ranks take turns on the CPUs, threads poll beside their compute)


def sharing(cal: Calibration, where: Placement) -> Sharing | None:
    """How an exchange through MPI shares the CPUs with the ranks' compute at `where`: its
    ranks take turns on them, or threads spin beside them; None for neither, or for another
    exchange."""
    shared = (ranks_take_turns(where), where.pollers > 0)
    return shared if cal.mpi and any(shared) else None


def predict_point(
    cal: Calibration, ranks: int, batch_size: int, overlap: bool, placement: Placement | None = None
) -> IterationPrediction:
    """The calibrated configuration at `ranks` ranks and `batch_size` per rank, its ranks
    placed as `placement` (default: as the calibration point's); `overlap`: wait-free
    back-propagation, where the backend's messages progress beside backward (`overlaps`)."""
    host = placement or cal.placement
    where = cal.on(host)
    shared = compute_scale(cal.on(cal.placement), where, cal.phi) if cal.cpu else 1.0
    s = batch_size / cal.batch_size * shared
    phases = PhaseTimes(cal.phases.data * s, cal.phases.h2d * s, cal.phases.forward * s, cal.phases.update * s)
    link = cal.link if cal.link is not None else LinkCost(0.0, 0.0)
    wait = 0.0
    if cal.cpu and where.oversubscribed:
        k = where.oversubscription
        link = LinkCost(link.alpha * k, link.beta * k, link.gamma * k)
        messages = sum(1 for layer in cal.layers if layer.grad_bytes > 0)
        wait = exchange_wait(host, cal.backend, ranks) * rings_that_wait(cal.backend, messages)
    servers, rules = cal.servers, cal.mpi
    cost: Callable[[float], float] | None = None
    if servers:
        cost = lambda n: servers.step_cost(n, ranks, link)  # noqa: E731
    elif rules:
        cost = lambda n: mpi_rules.cost(rules, n, ranks, link)  # noqa: E731
    carried = cal.sync > 0 and (cal.sync_shared is None or sharing(cal, host) == cal.sync_shared)
    sync = cal.sync * skew.growth(cal.sync_ranks, ranks) if carried else 0.0
    return predict_iteration(
        phases, _scaled(cal.layers, s), link, ranks, batch_size, overlap=overlap and cal.overlaps,
        overhead=cal.overhead, exchange_wait=wait, message_cost=cost, sync_wait=sync,
        local_exchange=cal.local_exchange * shared + cal.cycle_wait,
    )  # fmt: skip


def _rel(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured and math.isfinite(measured) else float("nan")


def predictions(points: Sequence[PointData], stats: pd.DataFrame, link: LinkCost | None = None) -> pd.DataFrame:
    """Predicted beside measured for every point; `stats` is indexed by point id."""
    groups: dict[str, list[PointData]] = {}
    for p in points:
        groups.setdefault(metrics.scaling_group(p.point), []).append(p)
    rows: list[dict[str, object]] = []
    derived = Derived(stats)
    for group in groups.values():
        try:
            cal = calibrate(group, stats, link, derived)
        except ModelError as exc:
            rows += [{"point": p.point_id, "note": f"no prediction: {exc}"} for p in group]
            continue
        for p in group:
            row = stats.loc[p.point_id]
            n, b = int(row["ranks"]), int(row["batch_size"])
            calibrated = p.point_id in cal.calibration_points
            where = derived.measured_placement(p) if calibrated else derived.placement(p)
            wfbp = predict_point(cal, n, b, overlap=True, placement=where)
            serial = predict_point(cal, n, b, overlap=False, placement=where)
            single = predict_point(cal, 1, b, overlap=True)
            measured = float(row["t_iter_s"])
            rows.append(
                {
                    "point": p.point_id,
                    "framework": p.point.framework,
                    "backend": p.point.backend,
                    "model": p.point.model,
                    "ranks": n,
                    "batch_size": b,
                    "seed": p.point.seed,
                    "calibration": calibrated,
                    "measured_t_iter_s": measured,
                    "predicted_t_iter_s": wfbp.t_iter,
                    "rel_error": _rel(wfbp.t_iter, measured),
                    "predicted_no_overlap_s": serial.t_iter,
                    "rel_error_no_overlap": _rel(serial.t_iter, measured),
                    "measured_throughput": float(row["throughput"]),
                    "predicted_throughput": wfbp.throughput,
                    "measured_efficiency": float(row["efficiency"]),
                    "predicted_efficiency": wfbp.throughput / (n * single.throughput),
                    "pred_comm_total_s": wfbp.comm_total,
                    "pred_comm_exposed_s": wfbp.comm_exposed,
                    "pred_sync_wait_s": wfbp.sync_wait,
                    "alpha_s": cal.link.alpha if cal.link else float("nan"),
                    "beta_s_per_byte": cal.link.beta if cal.link else float("nan"),
                    "comm_source": cal.comm_source,
                    "oversubscribed": where.oversubscribed,
                    "compute_scale": compute_scale(cal.on(cal.placement), cal.on(where), cal.phi) if cal.cpu else 1.0,
                    "note": "",
                }
            )
    frame = pd.DataFrame(rows, columns=PREDICTION_COLUMNS)
    return frame.sort_values(["framework", "backend", "model", "batch_size", "ranks"], kind="stable").reset_index(
        drop=True
    )
