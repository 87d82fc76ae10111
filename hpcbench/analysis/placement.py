"""Where a measured point's ranks ran, as the host saw it: ranks per host, the threads each
computed on, the host's cores, and the threads that polled beside the compute (a background
thread over an MPI that spins). A fact of the measurement that tables, exports and the model
(model/contention.py, which says what sharing the cores costs) all read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hpcbench.store.reader import PointData

YIELD_SETTINGS = ("OMPI_MCA_mpi_yield_when_idle", "OMPI_MCA_mpi_oversubscribe")  # either true: Open MPI yields
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Placement:
    ranks_per_host: int
    threads: int  # per rank
    cores: float  # per host (the CPU count, or the effective cores the model fitted)
    pollers: float = 0  # per rank: threads that poll beside its compute (`pollers`)

    @property
    def load(self) -> float:
        """The threads that want a CPU on the host."""
        return self.ranks_per_host * (self.threads + self.pollers)

    @property
    def oversubscription(self) -> float:
        return max(1.0, self.load / self.cores) if self.cores > 0 else 1.0

    @property
    def oversubscribed(self) -> bool:
        return self.oversubscription > 1.0

    def pollers_seen(self, load: float) -> float:
        """The polling threads per rank that a host of `load` thread-loads shows beside the
        ranks' own threads, at most those counted."""
        return min(max(load / self.ranks_per_host - self.threads, 0.0), self.pollers)

    def describe(self) -> str:
        """What shares the host: "2 rank(s) × 1 thread(s) and 0.5 polling thread(s) each on 2 cores"."""
        polling = f" and {self.pollers:.2g} polling thread(s) each" if self.pollers else ""
        return f"{self.ranks_per_host} rank(s) × {self.threads} thread(s){polling} on {self.cores:g} cores"


def _threads(p: PointData) -> int:
    """The threads each rank computed on: what the framework said it took (the provenance's
    `compute_threads`: JAX takes a thread per CPU whatever `threads` says), else the point's
    `threads`, else OMP_NUM_THREADS, else 1."""
    taken = p.provenance.get("compute_threads")
    if type(taken) is int and taken > 0:
        return taken
    if p.point.threads is not None:
        return p.point.threads
    value = p.environment.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


# What a rank records of its background thread's controller (provenance `horovod_controller`,
# where the TensorFlow adapter can ask Horovod): MPI's, or Gloo's where Horovod was built
# without MPI. A recorded fact about the run, not a backend's name; unrecorded, the launcher
# decides (`launcher_mpi`).
CONTROLLER = "horovod_controller"
CONTROLLER_MPI = "mpi"


def thread_over_mpi(p: PointData) -> bool:
    """Whether a background thread ran the point's collectives with MPI as its controller
    (traits `background_thread` and `launcher_mpi`: Horovod launched by mpirun or srun;
    `horovodrun` starts it with Gloo), unless the rank recorded another controller."""
    traits = p.traits
    if not traits.background_thread or not traits.launcher_mpi:
        return False
    return bool(p.provenance.get(CONTROLLER, CONTROLLER_MPI) == CONTROLLER_MPI)


def mpi_yields(p: PointData, ranks_per_host: int, cpus: float) -> bool:
    """Whether Open MPI's waits give the CPU away on the point's hosts: as its environment set
    it (`YIELD_SETTINGS`, what mpirun sets on an oversubscribed host), or, where it does not
    say, as mpirun decides: more ranks on a host than its CPUs."""
    settings = p.environment
    if any(str(settings.get(key, "")).lower() in TRUE_WORDS for key in YIELD_SETTINGS):
        return True
    if any(key in settings for key in YIELD_SETTINGS):
        return False
    return cpus > 0 and ranks_per_host > cpus


def pollers(p: PointData, ranks_per_host: int, ranks: int) -> float:
    """Threads per rank that poll beside its compute in `p`'s configuration at `ranks` ranks,
    `ranks_per_host` to a host: Horovod's background thread over an Open MPI that spins, as
    many as can spin at once: (ranks − 1) / ranks (the last to arrive waits for none)."""
    cpus = float(p.provenance.get("cpu_count", 0) or 0)
    spins = thread_over_mpi(p) and not mpi_yields(p, ranks_per_host, cpus)
    return (ranks - 1) / ranks if spins and ranks >= 2 else 0.0


def placement_of(p: PointData) -> Placement:
    """Where a measured point's ranks ran: the busiest host's rank count, threads, cores, and
    the threads per rank that polled beside the compute."""
    hosts = Counter(p.hostnames)
    per_host = max(hosts.values()) if hosts else 1
    cores = int(p.provenance.get("cpu_count", 0) or 0)
    return Placement(per_host, _threads(p), cores, pollers(p, per_host, p.iterations.shape[0]))
