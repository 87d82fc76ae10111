"""CPU contention: a rank's compute time follows the cores it really has.

k ranks on a host of C cores, each with t threads (intra-op / BLAS), share the cores: when
k·t > C the threads take turns and a rank's compute slows by

    oversubscription(k, t, C) = max(1, k·t / C)

and a rank with more threads is faster by t^φ, φ in [0, 1] the parallel efficiency of its
framework's kernels (0: threads do not help; 1: they scale perfectly). So between two
placements a and b of the same work:

    compute_b = compute_a · oversubscription_b / oversubscription_a · (t_a / t_b)^φ

φ is fitted from two measured placements with different threads and no oversubscription
(`fit_phi`); without such a pair it is taken as 0 and the prediction says so. The placement
of a measured point comes from its point file: ranks per host from the ranks' host names,
threads from OMP_NUM_THREADS as the launcher set it (or the point's `threads`), cores from
the host's CPU count. Ranks on virtual nodes that share one physical host (the test
cluster) are counted per node name, so their contention is not seen.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hpcbench.store.reader import PointData


@dataclass(frozen=True)
class Placement:
    ranks_per_host: int
    threads: int  # per rank
    cores: int  # per host

    @property
    def oversubscription(self) -> float:
        return max(1.0, self.ranks_per_host * self.threads / self.cores) if self.cores > 0 else 1.0

    @property
    def oversubscribed(self) -> bool:
        return self.oversubscription > 1.0


def compute_scale(a: Placement, b: Placement, phi: float) -> float:
    """How much longer the same compute takes in placement b than in placement a."""
    threading: float = (a.threads / b.threads) ** phi
    return b.oversubscription / a.oversubscription * threading


def fit_phi(a: Placement, b: Placement, compute_a: float, compute_b: float) -> float | None:
    """φ from two measured placements of the same work with different threads, clipped to
    [0, 1]; None when they cannot tell (same threads, no time)."""
    if a.threads == b.threads or compute_a <= 0 or compute_b <= 0:
        return None
    threading = compute_b / compute_a / (b.oversubscription / a.oversubscription)
    phi = math.log(threading) / math.log(a.threads / b.threads)
    return min(max(phi, 0.0), 1.0)


def _threads(p: PointData) -> int:
    if p.point.threads is not None:
        return p.point.threads
    environment = p.provenance.get("environment", {})
    value = str(environment.get("OMP_NUM_THREADS", "")) if isinstance(environment, dict) else ""
    return int(value) if value.isdigit() and int(value) > 0 else 1


def placement_of(p: PointData) -> Placement:
    """Where a measured point's ranks ran: the busiest host's rank count, threads, cores."""
    hosts = Counter(p.hostnames)
    per_host = max(hosts.values()) if hosts else 1
    cores = int(p.provenance.get("cpu_count", 0) or 0)
    return Placement(per_host, _threads(p), cores)
