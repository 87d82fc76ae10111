"""Parameter-server backends in sweep predictions (trait `parameter_server`, store/traits.py).

A worker of a parameter-server backend pushes each gradient tensor to its server and pulls
the tensor's parameters back: two transfers per tensor and step, each of them crossing a
server's link together with the other workers' in synchronous mode (W workers, S servers:
the link carries W/S of them at once) or alone in asynchronous mode (1/S). The step's cost
of one tensor of n bytes is then `collectives.parameter_server`: 2α + 2·share·n·β, with
share = W/S (synchronous) or 1/S (asynchronous). Unlike a ring, it is not zero on one
worker: the servers are other processes, and a single worker's pushes and pulls cross to
them too, so a one-rank point's messages calibrate the link.

The recorded messages (`push` and `pull`, one of each per tensor and step) are fitted as
transfers: t = α + share·β·n at the point's W (`link_from_transfers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcbench.analysis.model.collectives import LinkCost, MessageCost, ModelError, parameter_server
from hpcbench.spec import Point
from hpcbench.store.traits import Traits

DEFAULT_SERVERS = 1  # as the adapters start them (`extra.servers`)


@dataclass(frozen=True)
class Servers:
    count: int
    sync: bool

    def share(self, workers: int) -> float:
        """How many workers' transfers a server's link carries at once, per server."""
        return (workers if self.sync else 1) / self.count

    def step_cost(self, grad_bytes: float, workers: int, link: LinkCost) -> float:
        """Seconds of one tensor's push and pull on `workers` workers."""
        return parameter_server(grad_bytes, workers, self.count, link, self.sync)


def servers_of(point: Point, traits: Traits) -> Servers | None:
    """The point's parameter servers, or None when its backend has none (`traits`, the point's:
    `parameter_server`); a step waits for every worker's push unless the backend is
    `asynchronous`, or as the point's `extra.sync` says."""
    if not traits.parameter_server:
        return None
    extra = dict(point.extra)
    count = int(extra.get("servers", DEFAULT_SERVERS))
    if count < 1:
        raise ModelError(f"a parameter-server point needs >= 1 server, got {count}")
    return Servers(count, bool(extra.get("sync", not traits.asynchronous)))


def link_from_transfers(cost: MessageCost, servers: Servers, workers: int) -> LinkCost:
    """The link whose transfers of n bytes cost `cost`(n) = α + β'·n on `workers` workers."""
    return LinkCost(cost.alpha, cost.beta / servers.share(workers))
