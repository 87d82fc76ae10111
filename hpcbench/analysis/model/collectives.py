"""All-reduce and parameter-server costs on a two-level machine: nodes × ranks per node.

Each level has its own α (s per message), β (s per byte) and γ (s per byte reduced): `intra`
between ranks of one node (shared memory, PCIe, NVLink), `inter` between nodes (the network).
Algorithms (n bytes per rank, p = N·k ranks, lg = ⌈log2⌉):

- ring: 2(p−1)α + 2n(p−1)/p·β + n(p−1)/p·γ. Across nodes a flat ring is as slow as its
  slowest hop: α and β of the network whenever N ≥ 2 (each rank's chunk crosses it once
  per phase).
- tree (recursive doubling): lg p·α + n·lg p·β + n·lg p·γ.
- rabenseifner (reduce-scatter by recursive halving, all-gather by doubling):
  2·lg p·α + 2n(p−1)/p·β + n(p−1)/p·γ.
- hierarchical (NCCL across nodes, Horovod's hierarchical mode): reduce-scatter inside each
  node (ring of k over `intra`), a ring all-reduce of n/k bytes across the N nodes (k of them
  at once sharing the node's NICs: β_inter × k / nics), all-gather inside each node.

`hpcbench predict` runs the algorithm its description names (a ring unless told); a measured
sweep's MPI_Allreduce follows the library's own choice per message (mpi_rules.py). A parameter
server (TensorFlow `ps`, MXNet kvstore): each of W workers pushes its n bytes of gradients
and pulls n bytes of parameters, spread over S servers; synchronous, a server's link carries
2·W·n/S bytes per step; asynchronous, a worker waits only for its own push and pull.
Definitions: docs/metrics-and-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from hpcbench.errors import HpcbenchError


class ModelError(HpcbenchError):
    """Inputs the model cannot use (negative times, no ranks)."""


@dataclass(frozen=True)
class LinkCost:
    """Point-to-point cost of the network: α s per message, β s per byte, γ s per byte reduced."""

    alpha: float
    beta: float
    gamma: float = 0.0


@dataclass(frozen=True)
class MessageCost:
    """tc(M) = alpha + beta * M for one collective at one rank count."""

    alpha: float
    beta: float

    def time(self, n_bytes: float) -> float:
        return self.alpha + self.beta * n_bytes


# --------------------------------------------------------------------------------------
# Collective costs (α latency, β s/byte, γ reduction s/byte, n bytes, p ranks)


def check_ranks(p: int) -> None:
    if p < 1:
        raise ModelError(f"number of ranks must be >= 1, got {p}")


def ring_allreduce(n: float, p: int, link: LinkCost) -> float:
    """2(p−1)α + 2n(p−1)/p·β + n(p−1)/p·γ."""
    check_ranks(p)
    return 2 * (p - 1) * link.alpha + 2 * n * (p - 1) / p * link.beta + n * (p - 1) / p * link.gamma


def rabenseifner_allreduce(n: float, p: int, link: LinkCost) -> float:
    """2 lg p·α + 2n(p−1)/p·β + n(p−1)/p·γ (p a power of two)."""
    check_ranks(p)
    if p & (p - 1):
        raise ModelError(f"Rabenseifner's all-reduce needs a power of two ranks, got {p}")
    lg = math.log2(p)
    return 2 * lg * link.alpha + 2 * n * (p - 1) / p * link.beta + n * (p - 1) / p * link.gamma


def recursive_doubling_allreduce(n: float, p: int, link: LinkCost) -> float:
    """lg p·α + n lg p·β + n lg p·γ."""
    check_ranks(p)
    lg = math.log2(p)
    return lg * link.alpha + n * lg * link.beta + n * lg * link.gamma


def ring_allgather(n: float, p: int, link: LinkCost) -> float:
    """(p−1)α + n(p−1)/p·β."""
    check_ranks(p)
    return (p - 1) * link.alpha + n * (p - 1) / p * link.beta


def binomial_broadcast(n: float, p: int, link: LinkCost) -> float:
    """lg p·α + n lg p·β."""
    check_ranks(p)
    lg = math.log2(p)
    return lg * link.alpha + n * lg * link.beta


def ring_message_cost(p: int, link: LinkCost) -> MessageCost:
    """The ring all-reduce of p ranks as tc(M) = α_p + β_p·M."""
    check_ranks(p)
    return MessageCost(2 * (p - 1) * link.alpha, 2 * (p - 1) / p * link.beta + (p - 1) / p * link.gamma)


def ring_link(cost: MessageCost, p: int) -> LinkCost:
    """The link α, β that make a ring all-reduce of p ranks cost `cost` (γ folded into β)."""
    if p < 2:
        raise ModelError(f"a link cost needs messages between >= 2 ranks, got {p}")
    return LinkCost(cost.alpha / (2 * (p - 1)), cost.beta * p / (2 * (p - 1)))


def fused_cost(messages: Sequence[float], cost: MessageCost, threshold: float) -> tuple[float, float]:
    """(unfused, fused) time of messages m_i: Σ(α + β m_i) vs ⌈Σm/F⌉·α + β·Σm (Horovod tensor fusion,
    copies and cycle wait left out)."""
    total = float(sum(messages))
    unfused = sum(cost.time(m) for m in messages)
    fused = math.ceil(total / threshold) * cost.alpha + cost.beta * total if total else 0.0
    return unfused, fused


Algorithm = Literal["ring", "tree", "rabenseifner", "hierarchical"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int
    intra: LinkCost
    inter: LinkCost
    nics_per_node: int = 1

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ModelError(f"a machine of {self.nodes} nodes × {self.ranks_per_node} ranks per node")
        if self.nics_per_node < 1:
            raise ModelError(f"nics_per_node must be >= 1, got {self.nics_per_node}")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def slowest(self) -> LinkCost:
        """The hop a flat algorithm is limited by: the network when there are nodes to cross."""
        return self.inter if self.nodes > 1 else self.intra


def _half_ring(n: float, p: int, link: LinkCost, reduce: bool) -> float:
    """A ring reduce-scatter (reduce=True) or all-gather of n bytes over p ranks."""
    if p <= 1:
        return 0.0
    return (p - 1) * link.alpha + n * (p - 1) / p * (link.beta + (link.gamma if reduce else 0.0))


def hierarchical(n: float, topo: Topology) -> float:
    k, nodes = topo.ranks_per_node, topo.nodes
    if nodes == 1:
        return ring_allreduce(n, k, topo.intra)
    shared = LinkCost(topo.inter.alpha, topo.inter.beta * k / topo.nics_per_node, topo.inter.gamma)
    across = ring_allreduce(n / k, nodes, shared)
    return _half_ring(n, k, topo.intra, reduce=True) + across + _half_ring(n, k, topo.intra, reduce=False)


def allreduce(n: float, topo: Topology, algorithm: str = "ring") -> float:
    """Seconds of one all-reduce of n bytes per rank on `topo` with `algorithm`."""
    if n < 0 or not math.isfinite(n):
        raise ModelError(f"message size {n!r} is not a non-negative byte count")
    p = topo.ranks
    if p == 1 or n == 0:
        return 0.0
    if algorithm == "ring":
        return ring_allreduce(n, p, topo.slowest)
    if algorithm == "tree":
        return recursive_doubling_allreduce(n, p, topo.slowest)
    if algorithm == "rabenseifner":
        return rabenseifner_allreduce(n, p, topo.slowest)
    if algorithm == "hierarchical":
        return hierarchical(n, topo)
    raise ModelError(f"unknown all-reduce algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def parameter_server(n: float, workers: int, servers: int, link: LinkCost, sync: bool = True) -> float:
    """Seconds of one step's push of n bytes of gradients and pull of n bytes of parameters."""
    if workers < 1 or servers < 1:
        raise ModelError(f"a parameter server needs >= 1 worker and server, got {workers} and {servers}")
    sharing = workers if sync else 1  # synchronous: every worker's traffic crosses the servers' links together
    return 2 * link.alpha + 2 * sharing * n / servers * link.beta + sharing * n / servers * link.gamma


def link_from_rate(bandwidth_gbps: float, latency_us: float) -> LinkCost:
    """A link given as bandwidth (Gbit/s) and latency (µs)."""
    if not (bandwidth_gbps > 0 and math.isfinite(bandwidth_gbps)):
        raise ModelError(f"bandwidth {bandwidth_gbps!r} Gbit/s is not a positive number")
    if not (latency_us >= 0 and math.isfinite(latency_us)):
        raise ModelError(f"latency {latency_us!r} µs is not a non-negative number")
    return LinkCost(latency_us * 1e-6, 8 / (bandwidth_gbps * 1e9))


def link_from_collective_fit(p: int, alpha: float, beta: float) -> LinkCost:
    """The per-hop link of a published per-P ring all-reduce fit t(n) = α_p + β_p·n (the form
    papers report), so that it can be used at other rank counts."""
    return ring_link(MessageCost(alpha, beta), p)
