"""CPU contention: a rank's compute time follows the cores it really has.

k ranks on a host of C cores, each with t threads (intra-op / BLAS: what the rank computed
on, the provenance's `compute_threads` where its framework says, else the point's
`threads`), share the cores: when k·t > C the threads take turns and a rank's compute slows by

    oversubscription(k, t, C) = max(1, k·t / C)

and a rank with more threads is faster by t^φ, φ in [0, 1] the parallel efficiency of its
framework's kernels (0: threads do not help; 1: they scale perfectly). So between two
placements a and b of the same work:

    compute_b = compute_a · oversubscription_b / oversubscription_a · (t_a / t_b)^φ

φ is fitted from two measured placements with different threads and no oversubscription
(`fit_phi`); without such a pair it is taken as 0 and the prediction says so.

A host's cores are not always worth their count for compute: virtual CPUs that are sibling
hardware threads of one physical core, a shared memory bus or cache, the harness's and the
communication library's own threads all leave less than C cores to the ranks' kernels.
The model then uses the host's *effective cores* C_eff in place of C (1 <= C_eff <= C):

    oversubscription(k, t, C_eff) = max(1, k·t / C_eff)

C_eff is fitted from two measured placements with the same threads where the smaller one
runs a single thread-load (k·t = 1, so it cannot be slowed by sharing):
C_eff = k_b·t / (compute_b / compute_a), clipped to [1, C] (`fit_effective_cores`); a
slowdown under 5 % is no contention seen, and C stands. Where no such pair was measured,
C_eff = C and the prediction says so, unless the scheduler was asked (below).

The scheduler says it directly where the point file has the run-queue wait of the ranks'
training loops (schema 5, `cpu_wait` in resources.py): a loop that waited a share w of its
runnable time for a CPU ran its compute at 1 − w of the speed it wanted, which is what an
oversubscription of 1 / (1 − w) means, so C_eff = k·t·(1 − w), clipped to [1, C]
(`effective_cores_from_wait`), for a placement of several thread-loads (k·t > 1) where the
loop is what computes (derived.Derived.cpu_wait); a wait under 5 % is no contention seen,
C_eff = C, measured. This tells how fast one rank alone would be from several ranks per
host; it is used where no measured pair gives C_eff.

On CPU the collectives are driven by the ranks' own threads: a ring step ends when the
receiving rank's thread has run. On an oversubscribed host the cores are busy with other
ranks' work when the exchange begins, so each step of its first ring also waits for its
thread to be scheduled: on average half the kernel's scheduler slice (`exchange_wait`, once
per iteration: the messages after it find the ranks in the exchange; once per message where
each all-reduce is a program of its own that the runtime starts from its threads, as JAX's
are: trait `waits_per_message`, `rings_that_wait`), where the backend's threads sleep while
they wait (trait `sleeping_wait`, `ring_sleeps`; MPI's threads poll instead, and keep their
CPU). The traits are the point's (store/traits.py), as its file records them. Linux's default
slice (EEVDF's base slice, CFS's minimum granularity before it) is 0.75 ms · (1 + log2 n),
n the host's CPUs capped at 8: 1.5 ms on 2 CPUs, 3 ms on 8 or more.

A thread that drives the exchange beside the compute and polls while it waits is a thread-load
of its own (trait `background_thread`; its controller is MPI where the launcher starts the
ranks through MPI_Init, trait `launcher_mpi`: `thread_over_mpi`): Horovod's background thread
negotiates with the other ranks' background threads every cycle and runs the all-reduces,
inside MPI calls that spin until the peers arrive. Open MPI spins without giving its CPU away unless it knows the
host is oversubscribed (more ranks than slots, `mpi_oversubscribe`, or `mpi_yield_when_idle`
asked for), in which case it yields to any other runnable thread. A poller spins only while
a peer is late, and the last of p ranks to arrive waits for none: at most p − 1 of the p
pollers spin at a time. So a rank of such a backend counts

    pollers = (p − 1) / p

more thread-loads against the cores where Open MPI does not yield (half a thread each at two
ranks, nearly a whole one at many), and none where it does or where it is alone (no peer to
wait for):

    load = k·(t + pollers),    oversubscription = max(1, load / C_eff)

That is the most they can spin. Where a calibration point's wait was measured (its loop's
where the loop computes, else its threads' by their work), its pollers are what that wait
shows, at most that (derived.Derived.measured_placement). (The all-reduces that the thread
runs spin on every rank while they last; at the bound, they are taken as a small share of
the iteration.)

Measured on a 2-CPU host (three frameworks with Horovod, 1, 2 and 4 ranks): at 2 ranks,
where Open MPI spins, the training loops waited 47–52 % of their runnable time for a CPU on
a machine that other work loaded too, 22–25 % idle (3 thread-loads on 2 CPUs, the bound,
give 1 − 2/3); at 4 ranks, where it yields, 61–67 %, beside 51–54 % for MPI backends
without such a thread; and the compute grew 1.6–2.5 times from 1 to 2 ranks but 0.99–1.21
times from 2 to 4.
"""

from __future__ import annotations

import math

from hpcbench.analysis.placement import Placement
from hpcbench.store.traits import Traits

SLOWDOWN_SEEN = 0.05  # a compute slowdown under this share is noise, not contention
SLICE_BASE_S = 0.75e-3  # Linux's base scheduler slice per unit of its CPU-count factor


def ranks_take_turns(where: Placement) -> bool:
    """Whether the ranks' own threads outnumber the host's CPUs (pollers left out): each rank
    then waits, now and then, for a CPU that another rank holds."""
    return where.cores > 0 and where.ranks_per_host * where.threads > where.cores


def scheduler_slice(cpus: float) -> float:
    """Linux's default scheduler slice on a host of `cpus` CPUs: 0.75 ms · (1 + log2 min(cpus, 8))."""
    return SLICE_BASE_S * (1 + math.floor(math.log2(min(max(cpus, 1.0), 8.0))))


def ring_sleeps(traits: Traits) -> bool:
    """Whether the backend's all-reduce is a ring of threads that sleep while they wait for
    data (trait `sleeping_wait`: gloo's and gRPC's event loops; JAX on CPU runs gloo), so
    that the scheduler must wake them. MPI's progress loop (torch mpi, Chainer, Theano, Caffe,
    CNTK, Horovod's operations) polls instead: a waiting rank keeps its CPU, and no wake-up is
    waited for. A parameter server's push and pull are round trips to a server, not a ring's
    steps: no wait is modelled there, whatever its threads do."""
    return traits.sleeping_wait and not traits.parameter_server


def exchange_wait(host: Placement, traits: Traits, ranks: int) -> float:
    """Seconds an iteration's exchange waits for time-shared threads to be scheduled: half the
    host's slice at each of a ring's 2(p − 1) steps, once per iteration, when the ranks'
    threads outnumber the host's CPUs (not its effective cores: a rank slowed by a shared bus
    still has a CPU to wake on) and the backend's ring sleeps while it waits (`ring_sleeps`);
    else none."""
    if ranks < 2 or not host.oversubscribed or not ring_sleeps(traits):
        return 0.0
    return 2 * (ranks - 1) * scheduler_slice(host.cores) / 2


def rings_that_wait(traits: Traits, messages: int) -> int:
    """How many of an iteration's `messages` all-reduces wait for their threads to be scheduled
    (`exchange_wait` each): every one where each begins on cores the rank's runtime threads
    hold (trait `waits_per_message`: JAX runs each all-reduce as a program of its own, started
    from its runtime's thread pool; measured on 2 CPUs: 1.5 ms per message at 2 ranks, 4.8 ms
    at 4, whatever its size: 2(p − 1) half slices), else the first (gloo's worker thread,
    draining its queue after backward, finds its peers in the exchange after the first ring)."""
    return max(messages, 1) if traits.waits_per_message else 1


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


def fit_effective_cores(a: Placement, b: Placement, compute_a: float, compute_b: float) -> float | None:
    """C_eff from a single thread-load (a: ranks_per_host·threads = 1) and a larger placement b
    of the same threads on the same host; None when the pair cannot tell."""
    load_a, load_b = a.load, b.load
    if a.threads != b.threads or load_a != 1 or load_b <= 1 or a.cores != b.cores or a.cores <= 0:
        return None
    if compute_a <= 0 or compute_b <= 0 or compute_b / compute_a <= 1 + SLOWDOWN_SEEN:
        return None  # no slowdown seen: only a lower bound on C_eff; the CPU count stands
    return min(max(load_b / (compute_b / compute_a), 1.0), float(a.cores))


def effective_cores_from_wait(a: Placement, wait: float) -> float | None:
    """C_eff = k·t·(1 − w) from placement a's measured run-queue wait share w, clipped to
    [1, C]; C itself for a wait under 5 % (measured: no contention seen); None for a single
    thread-load or no wait measured."""
    load = a.load
    if load <= 1 or a.cores <= 0 or not 0 <= wait < 1:
        return None
    if wait < SLOWDOWN_SEEN:
        return float(a.cores)
    return min(max(load * (1 - wait), 1.0), float(a.cores))
