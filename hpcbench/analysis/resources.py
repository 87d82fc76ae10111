"""CPU, memory and GPU use of a point, in the columns of seed 002's tables.

CPU percentages are of the whole node as sysstat reports them (every rank's sampler sees
its node; the mean is over all samples of all ranks). Memory is per rank: `mem_avg_mib`
is the mean over ranks of each rank's mean RSS, `mem_max_mib` the largest RSS any rank
reached (MiB = 2^20 bytes). Absent sources (NaN, or -1 for counters) are left out; a
column with no sample at all is NaN.

CPU use of the ranks themselves, over the timed window (from the sample taken when warm-up
ended to the one taken when the timed loop ended, per rank; schema 5): `rank_cpus` is the
mean over ranks of the CPUs a rank's threads ran on (Δ`sched_run_ns` / Δt), and `cpu_wait`
the share of the runnable time of a rank's main thread (its training loop) that it waited
for a CPU (Δ`main_wait_ns` / (Δ`main_run_ns` + Δ`main_wait_ns`)): its compute ran at
1 − `cpu_wait` of the speed it would have had with a core to itself. The main thread, not
all threads: a communication thread that wakes while the loop computes would count waits
that did not slow the compute. `loop_runnable` is the share of the window that the main
thread was runnable (running or waiting to run): beside the compute phases' share of
t_iter it says whether the loop is what computes (about equal), polls in the exchange
(more) or waits for a framework's own threads or processes (less). NaN without such
samples (older files, no schedstat).

`work_wait` is the run-queue wait share of a rank's threads over the same window, each
thread weighted by its time on a CPU (schema 7; the window's closing sample reads it since the
opening one), mean over ranks: the wait of the threads that did the work, whichever they
were. Where the loop computes it is about `cpu_wait`; where a framework computes on its own
threads it is theirs. A thread that only wakes to hand data on (gloo's, gRPC's) counts by
the little it runs, however long it waited to. NaN in older files.

`helper_cpus` is what the ranks' own descendant processes ran on over the same window (a
parameter-server backend's servers, a framework's compute process; schema 6): per host, the
sum over its ranks of Δ`child_run_ns` / Δt, mean over hosts. It is part of what was measured.

`other_cpus` is what the ranks' hosts spent on anything else over the same window: per host,
its busy CPUs (user + system time of the node, from the samples that tile the window,
weighted by their intervals, times its CPU count) less the CPUs its ranks and their
descendants ran on, clipped at 0 (the node's and the threads' clocks differ by a few
hundredths), mean over hosts. Another job or a daemon: a point measured beside them shared
its cores with them. In files before schema 6 the descendants are not known and count here.
NaN without the CPU count or the samples.

`cpu_steal` is the node's CPU time that a hypervisor gave to something else while its
virtual CPUs wanted to run (percent, as sysstat's %steal, mean over samples): every thread
on the node, the ranks' included, ran that much slower without any process showing it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from hpcbench.store.reader import PointData
from hpcbench.store.schema import CHILD_RUN, WORK_WAIT

MIB = float(2**20)

RESOURCE_COLUMNS = [
    "cpu_user", "cpu_system", "cpu_iowait", "cpu_total", "mem_avg_mib", "mem_max_mib",
    "gpu_util", "gpu_mem_max_mib", "gpu_power_w", "rank_cpus", "cpu_wait", "loop_runnable", "work_wait",
    "helper_cpus", "other_cpus", "cpu_steal",
]  # fmt: skip
OTHER_CPUS_SEEN = 0.25  # other processes' CPUs from which a point visibly shared its host
STEAL_SEEN = 5.0  # percent of the node's CPU time stolen from which a point was visibly slowed
WINDOW_SLACK_S = 1e-3  # a window sample is read just after the iteration that closes it


def _mean(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def rank_window(samples: np.ndarray, iterations: np.ndarray) -> tuple[np.void, np.void] | None:
    """A rank's samples (sorted by time) that open and close its timed window, or None. Since
    schema 6 those the rank took itself (they alone read its descendants: `child_run_ns` ≥ 0),
    where it has such samples: a periodic one may fall between a window's edge and the loop's."""
    rows = iterations.reshape(-1)
    timed = np.flatnonzero(rows["warmup"] == 0)
    if timed.size == 0:
        return None
    ordered = samples[np.argsort(samples["t"], kind="stable")]
    return _window(ordered, float(rows["t_start"][timed[0]]), float(rows["t_end"][timed[-1]]))


def _window(samples: np.ndarray, start: float, end: float) -> tuple[np.void, np.void] | None:
    """`rank_window` of samples sorted by time (stably: of equal times the first is taken),
    for a timed window from `start` to `end`."""
    if (samples[CHILD_RUN] >= 0).any():
        samples = samples[samples[CHILD_RUN] >= 0]
    t = samples["t"]
    if t.size == 0:
        return None
    last = int(np.searchsorted(t, start + WINDOW_SLACK_S, side="right")) - 1  # the latest at or before
    first = int(np.searchsorted(t, end - WINDOW_SLACK_S, side="left"))  # the earliest at or after
    if last < 0 or not t[last] <= start + WINDOW_SLACK_S or first >= t.size or not t[first] >= end - WINDOW_SLACK_S:
        return None
    return samples[int(np.searchsorted(t, t[last], side="left"))], samples[first]


def _timed_edges(iterations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank (rows of `iterations`): whether it has a timed iteration, the first one's start
    and the last one's end (as `rank_window` takes them)."""
    timed = iterations["warmup"] == 0
    has = timed.any(axis=1)
    if iterations.shape[1] == 0:
        return has, np.zeros(len(has)), np.zeros(len(has))
    rows = np.arange(iterations.shape[0])
    first = np.argmax(timed, axis=1)
    last = iterations.shape[1] - 1 - np.argmax(timed[:, ::-1], axis=1)
    return has, iterations["t_start"][rows, first].astype(float), iterations["t_end"][rows, last].astype(float)


def _rank_use(a: np.void, b: np.void) -> tuple[float, float, float]:
    """(CPUs the process ran on, its main thread's wait share, the share of the time that
    thread was runnable) between two samples; NaN where a counter is absent or went back
    (threads ended)."""
    nan = float("nan")
    span = float(b["t"] - a["t"])
    if span <= 0:
        return nan, nan, nan
    run = int(b["sched_run_ns"]) - int(a["sched_run_ns"])
    cpus = run / 1e9 / span if min(a["sched_run_ns"], b["sched_run_ns"]) >= 0 and run > 0 else nan
    main_run = int(b["main_run_ns"]) - int(a["main_run_ns"])
    main_wait = int(b["main_wait_ns"]) - int(a["main_wait_ns"])
    if min(a["main_run_ns"], a["main_wait_ns"]) < 0 or main_run <= 0 or main_wait < 0:
        return cpus, nan, nan
    return cpus, main_wait / (main_run + main_wait), (main_run + main_wait) / 1e9 / span


def _node_share(samples: np.ndarray, a: np.void, b: np.void, *states: str) -> float:
    """The share of its node's CPU time spent in `states` (cpu_user, ...) between samples a and
    b of one rank (its samples sorted by time): the samples after a up to b each cover the time
    since the one before."""
    t = samples["t"]
    inside = samples[int(np.searchsorted(t, a["t"], side="right")) : int(np.searchsorted(t, b["t"], side="right"))]
    if inside.size == 0:
        return float("nan")
    spans = np.diff(np.concatenate(([float(a["t"])], inside["t"].astype(float))))
    share = sum((inside[state].astype(float) for state in states), np.zeros(inside.size)) / 100.0
    ok = np.isfinite(share) & (spans > 0)
    return float(np.average(share[ok], weights=spans[ok])) if ok.any() else float("nan")


def _child_cpus(a: np.void, b: np.void) -> float:
    """CPUs the process's descendants ran on between two samples (NaN where a sample did not
    read them, -1: before schema 6, or without schedstat; NaN where the sum went back: a
    descendant ended)."""
    run = int(b[CHILD_RUN]) - int(a[CHILD_RUN])
    span = float(b["t"] - a["t"])
    ok = min(a[CHILD_RUN], b[CHILD_RUN]) >= 0 and run >= 0 and span > 0
    return run / 1e9 / span if ok else float("nan")


def _work_wait(a: np.void, b: np.void) -> float:
    """The window's run-queue wait share of the threads that did the work: what its closing
    sample read since its opening one (schema 7; NaN before, or not measured)."""
    return float(b[WORK_WAIT])


def _by_rank(resources: np.ndarray) -> np.ndarray:
    """The samples by rank, then time (stably); as they are where a writer kept that order."""
    rank, t = resources["rank"], resources["t"]
    step, later = np.diff(rank), np.diff(t)
    if (step >= 0).all() and ((later >= 0) | (step > 0)).all():  # NaN times: not in order
        return resources
    ordered: np.ndarray = resources[np.lexsort((t, rank))]
    return ordered


def rank_use(resources: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """Per rank (rows of `iterations`): [CPUs its process ran on, its loop's wait share, the
    share of the window its loop was runnable, the busy share of its node's CPU time over the
    window, CPUs its descendant processes ran on, the stolen share of its node's CPU time over
    the window, its threads' wait share weighted by their work, 1 where both samples of the
    window read its descendants (else 0: before schema 6, no schedstat)], NaN where not measured."""
    out = np.full((iterations.shape[0], 8), np.nan)
    if len(resources):
        by_rank = _by_rank(resources)  # one sort, then a slice per rank
        edges = np.searchsorted(by_rank["rank"], np.arange(iterations.shape[0] + 1))
        has, starts, ends = _timed_edges(iterations)
        for r in np.flatnonzero(has):
            samples = by_rank[edges[r] : edges[r + 1]]
            window = _window(samples, starts[r], ends[r])
            if window is not None:
                out[r, :3] = _rank_use(*window)
                out[r, 3] = _node_share(samples, *window, "cpu_user", "cpu_system")
                out[r, 4] = _child_cpus(*window)
                out[r, 5] = _node_share(samples, *window, "cpu_steal")
                out[r, 6] = _work_wait(*window)
                out[r, 7] = float(min(window[0][CHILD_RUN], window[1][CHILD_RUN]) >= 0)
    return out


def _per_host(use: np.ndarray, hosts: Sequence[str], cores: int) -> tuple[float, float]:
    """(helper CPUs, other CPUs): means over hosts of their ranks' descendants' CPUs, and of
    their busy CPUs less their ranks' and descendants' (NaN for a host where a rank measured
    neither). Descendants that a rank's window did not read (files before schema 6) leave its
    host's helpers unknown and count among its other processes."""
    nan = float("nan")
    if len(hosts) < use.shape[0]:
        return nan, nan
    names = np.asarray(hosts[: use.shape[0]], dtype=object)
    helper, other = [], []
    for mine in (names == host for host in dict.fromkeys(names)):
        helper.append(float(use[mine, 4].sum()))
        children = float(np.where(use[mine, 7] > 0, use[mine, 4], 0.0).sum())  # those read
        other.append(max(float(use[mine, 3].mean()) * cores - float(use[mine, 0].sum()) - children, 0.0))
    return _mean(np.asarray(helper)), _mean(np.asarray(other)) if cores > 0 else nan


def sched_row(
    resources: np.ndarray,
    iterations: np.ndarray,
    hosts: Sequence[str] = (),
    cores: int = 0,
    use: np.ndarray | None = None,
) -> dict[str, float]:
    """`rank_cpus`, `cpu_wait` and `loop_runnable` of a point, means over the ranks that
    measured them; given each rank's host, `helper_cpus`, and `other_cpus` given also the
    hosts' CPU count. `use`: `rank_use` of these arrays, where already computed."""
    use = rank_use(resources, iterations) if use is None else use
    helper, other = _per_host(use, hosts, cores)
    return {
        "rank_cpus": _mean(use[:, 0]), "cpu_wait": _mean(use[:, 1]), "loop_runnable": _mean(use[:, 2]),
        "work_wait": _mean(use[:, 6]), "helper_cpus": helper, "other_cpus": other,
    }  # fmt: skip


def resource_row(
    resources: np.ndarray,
    iterations: np.ndarray | None = None,
    hosts: Sequence[str] = (),
    cores: int = 0,
    use: np.ndarray | None = None,
) -> dict[str, float]:
    """Per-point resource columns from the `resources` table rows of all ranks (and, given the
    point's iterations, its ranks' CPU use over the timed window; given each rank's host and
    the hosts' CPU count, what else their hosts ran). `use`: `rank_use` of the arrays, where
    already computed."""
    row = dict.fromkeys(RESOURCE_COLUMNS, float("nan"))
    if len(resources) == 0:
        return row
    if iterations is not None:
        row.update(sched_row(resources, iterations, hosts, cores, use))
    user = resources["cpu_user"].astype(float)
    system = resources["cpu_system"].astype(float)
    iowait = resources["cpu_iowait"].astype(float)
    row["cpu_user"], row["cpu_system"], row["cpu_iowait"] = _mean(user), _mean(system), _mean(iowait)
    row["cpu_total"] = row["cpu_user"] + row["cpu_system"] + row["cpu_iowait"]
    row["cpu_steal"] = _mean(resources["cpu_steal"].astype(float))  # NaN before schema 6
    rss = resources["rss_bytes"]
    ok = rss >= 0
    if ok.any():
        ranks = resources["rank"][ok]
        sums = np.bincount(ranks, weights=rss[ok].astype(float))
        counts = np.bincount(ranks)
        present = counts > 0
        row["mem_avg_mib"] = float((sums[present] / counts[present]).mean() / MIB)
        row["mem_max_mib"] = float(rss[ok].max() / MIB)
    row["gpu_util"] = _mean(resources["gpu_util"].astype(float))
    gpu_mem = resources["gpu_mem_bytes"]
    if (gpu_mem >= 0).any():
        row["gpu_mem_max_mib"] = float(gpu_mem[gpu_mem >= 0].max() / MIB)
    row["gpu_power_w"] = _mean(resources["gpu_power_w"].astype(float))
    return row


def of_point(p: PointData, use: np.ndarray | None = None) -> dict[str, float]:
    """A point file's resource columns, `other_cpus` included; `use`: its `rank_use`, where already computed."""
    cores = int(p.provenance.get("cpu_count", 0) or 0)
    return resource_row(p.resources, p.iterations, p.hostnames, cores, use)


class Row(Protocol):
    """A point's columns by name: a dict of `resource_row`, or a row of a stats table."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


def _seen(row: Row) -> tuple[float | None, float | None]:
    """(other processes' CPUs, the hypervisor's steal %) of a point where each reached
    OTHER_CPUS_SEEN or STEAL_SEEN, else None."""
    other = float(row.get("other_cpus", math.nan))
    steal = float(row.get("cpu_steal", math.nan))
    return (other if other >= OTHER_CPUS_SEEN else None), (steal if steal >= STEAL_SEEN else None)


def disturbances(row: Row) -> list[str]:
    """What besides the job slowed a point (a row of `resource_row`'s columns), in short phrases:
    other processes' CPUs from OTHER_CPUS_SEEN, the hypervisor's steal from STEAL_SEEN %."""
    other, steal = _seen(row)
    found = [f"other processes {other:.2f} CPUs"] if other is not None else []
    return found + ([f"hypervisor steal {steal:.0f} %"] if steal is not None else [])


def host_notes(point: str, row: Row) -> list[str]:
    """Notes on a point during which other processes kept OTHER_CPUS_SEEN CPUs or more busy, or
    the hypervisor stole STEAL_SEEN % or more of its node's CPU time."""
    notes = []
    other, steal = _seen(row)
    if other is not None:
        if math.isfinite(float(row.get("helper_cpus", math.nan))):  # the job's own processes are apart
            who = "other jobs or daemons (the ranks' own servers and compute processes are counted apart)"
        else:  # a file before schema 6
            who = (
                "other jobs or daemons, or the job's own (a parameter server's servers, a framework's compute "
                "process: part of what was measured)"
            )
        notes.append(
            f"point {point}: other processes than the ranks kept {other:.2f} CPUs busy during its timed loop: {who}; "
            "where they were not the job's, its ranks shared the host: rerun on an idle one"
        )
    if steal is not None:
        notes.append(
            f"point {point}: the hypervisor gave {steal:.0f} % of the node's CPU time to other virtual machines "
            "(steal): every thread on it ran that much slower, unseen by its processes; rerun on a quiet or "
            "dedicated node"
        )
    return notes
