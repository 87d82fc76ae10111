"""A calibrated configuration (`Calibration`, what calibrate.py fits on its smallest runs) and
its prediction at any scale, batch and placement (`predict_point`).

What the prediction must know of the configuration's backend and launcher it reads from their
traits (store/traits.py), carried in the calibration as the calibration point recorded them:
whether the exchange's threads sleep while they wait (`sleeping_wait`: the scheduler's wait on
time-shared cores, contention.exchange_wait), whether every message's ring waits for them
(`waits_per_message`), and, fitted from them, the parameter servers (`servers`), the MPI
library's rules (`mpi`), whether the messages progress beside backward (`overlaps`) and a
background thread's cycle at one rank (`cycle_wait`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hpcbench.analysis.model import mpi_rules, skew
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.model.contention import compute_scale, exchange_wait, ranks_take_turns, rings_that_wait
from hpcbench.analysis.model.iteration import IterationPrediction, Layer, PhaseTimes, predict_iteration
from hpcbench.analysis.model.servers import Servers
from hpcbench.analysis.placement import Placement
from hpcbench.store.traits import Traits

Sharing = tuple[bool, bool]  # (ranks take turns on the CPUs, threads poll beside their compute)


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
    traits: Traits = field(default_factory=Traits)  # its backend's and launcher's (contention.ring_sleeps)
    servers: Servers | None = None  # a parameter-server backend's (servers.py); None: a ring
    mpi: str = ""  # the rules of the MPI library whose MPI_Allreduce exchanged (mpi_rules.py); "": a ring
    sync: float = 0.0  # the wait for the last rank at `sync_ranks` ranks (skew.py)
    sync_ranks: int = 0
    sync_shared: Sharing | None = None  # how the measured points shared the CPUs (None: they did not)
    local_exchange: float = 0.0  # the exchange phase of a one-rank calibration point (model.predict_iteration)
    cycle_wait: float = 0.0  # without one: a background thread's wait for its cycle at one rank, not CPU work
    overlaps: bool = True  # its messages progress beside backward (not through MPI_Allreduce: `mpi_exchange`)

    def on(self, where: Placement) -> Placement:
        """`where` with the host's effective cores in place of its CPU count, when fitted."""
        return replace(where, cores=self.cores) if self.cores > 0 else where


def scaled(layers: Sequence[Layer], factor: float) -> list[Layer]:
    """The layers with their backward times `factor` times as long."""
    return [Layer(layer.grad_bytes, layer.backward_s * factor) for layer in layers]


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
        wait = exchange_wait(host, cal.traits, ranks) * rings_that_wait(cal.traits, messages)
    servers, rules = cal.servers, cal.mpi
    cost: Callable[[float], float] | None = None
    if servers:
        cost = lambda n: servers.step_cost(n, ranks, link)  # noqa: E731
    elif rules:
        cost = lambda n: mpi_rules.cost(rules, n, ranks, link)  # noqa: E731
    carried = cal.sync > 0 and (cal.sync_shared is None or sharing(cal, host) == cal.sync_shared)
    sync = cal.sync * skew.growth(cal.sync_ranks, ranks) if carried else 0.0
    return predict_iteration(
        phases, scaled(cal.layers, s), link, ranks, batch_size, overlap=overlap and cal.overlaps,
        overhead=cal.overhead, exchange_wait=wait, message_cost=cost, sync_wait=sync,
        local_exchange=cal.local_exchange * shared + cal.cycle_wait,
    )  # fmt: skip
