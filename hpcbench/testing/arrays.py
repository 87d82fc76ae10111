"""Arrays with known contents for the analysis tests (plain numpy, no code under test)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hpcbench.spec import Point
from hpcbench.store.schema import COMM_DTYPE, EVAL_DTYPE, ITERATION_DTYPE, RESOURCE_DTYPE
from hpcbench.testing.fabricate import write_point_file


def iterations(
    n_ranks: int,
    n_iters: int,
    *,
    warmup: int = 0,
    data: float = 0.0,
    h2d: float = 0.0,
    forward: float = 0.0,
    backward: float = 0.0,
    comm: float = 0.0,
    update: float = 0.0,
    comm_total: float = 0.0,
    extra: float = 0.0,
    batch: int = 8,
    period: float = 1.0,
) -> np.ndarray:
    """Every rank and iteration with the same phases; t_end - t_start = their sum + extra."""
    a = np.zeros((n_ranks, n_iters), dtype=ITERATION_DTYPE)
    start = np.arange(n_iters) * period
    duration = data + h2d + forward + backward + comm + update + extra
    for r in range(n_ranks):
        a["t_start"][r] = start
        a["t_end"][r] = start + duration
    a["data"], a["h2d"], a["forward"], a["backward"] = data, h2d, forward, backward
    a["comm"], a["update"], a["comm_total"] = comm, update, comm_total
    a["samples"] = batch
    a["warmup"][:, :warmup] = 1
    return a


def comm_rows(
    rows: Sequence[tuple[int, int, int, float, float]], op: bytes = b"allreduce", axis: bytes = b"dp"
) -> np.ndarray:
    """(rank, iteration, bytes, t_start, t_end) -> COMM_DTYPE rows (seq names in order)."""
    out = np.zeros(len(rows), dtype=COMM_DTYPE)
    for i, (rank, it, nbytes, t0, t1) in enumerate(rows):
        out[i] = (rank, it, op, str(i).encode(), axis, b"float32", nbytes, t0, t1)
    return out


def _no_sources(n: int) -> np.ndarray:
    """n RESOURCE_DTYPE rows in which every source is absent (NaN, or -1 for counters)."""
    out = np.zeros(n, dtype=RESOURCE_DTYPE)
    for name in RESOURCE_DTYPE.names or ():
        if name not in ("rank", "t"):
            out[name] = np.nan if RESOURCE_DTYPE[name].kind == "f" else -1
    return out


def sched_rows(
    ranks: int, t_open: float, t_close: float, wait: float, cpus: float = 1.0, runnable: float = 1.0,
    node_busy: float = 0.5, children: float = 0.0, work_wait: float | None = None,
) -> np.ndarray:  # fmt: skip
    """Two samples per rank around its timed window (t_open, t_close) whose schedstat counters
    say: the process ran on `cpus` CPUs, its main thread was runnable a share `runnable` of
    the window and waited a share `wait` of that for a CPU, its descendant processes ran on
    `children` CPUs; the node's CPU time was busy a share `node_busy` (user time), none stolen;
    with `work_wait`, the closing sample's (its threads' wait weighted by their work)."""
    out = _no_sources(2 * ranks)
    span = t_close - t_open
    for r in range(ranks):
        for k, (t, scale) in enumerate(((t_open, 0.0), (t_close, 1.0))):
            row = out[2 * r + k]
            busy = scale * span * runnable
            row["rank"], row["t"], row["rss_bytes"] = r, t, 2**26
            row["cpu_user"], row["cpu_system"], row["cpu_iowait"], row["cpu_steal"] = 100 * node_busy, 0.0, 0.0, 0.0
            row["sched_run_ns"], row["sched_wait_ns"] = int(1e9 * scale * span * cpus), 0
            row["main_run_ns"], row["main_wait_ns"] = int(1e9 * busy * (1 - wait)), int(1e9 * busy * wait)
            row["child_run_ns"] = int(1e9 * scale * span * children)
            if work_wait is not None and k == 1:
                row["work_wait"] = work_wait
    return out


def without(rows: np.ndarray, *names: str) -> np.ndarray:
    """`rows` as a file of an older schema has them: without the columns `names`."""
    kept = [n for n in rows.dtype.names or () if n not in names]
    return np.asarray(rows[kept].astype(np.dtype([(n, rows.dtype[n]) for n in kept])))


def resource_rows(rows: Sequence[tuple[int, float, float, float, int]]) -> np.ndarray:
    """(rank, cpu_user, cpu_system, cpu_iowait, rss_bytes) -> RESOURCE_DTYPE rows without a GPU or schedstat."""
    out = _no_sources(len(rows))
    for i, (rank, user, system, iowait, rss) in enumerate(rows):
        row = out[i]
        row["rank"], row["t"], row["cpu_user"], row["cpu_system"], row["cpu_iowait"], row["rss_bytes"] = (
            rank, float(i), user, system, iowait, rss
        )  # fmt: skip
    return out


def eval_rows(rows: Sequence[tuple[int, int, float, float, int, int]]) -> np.ndarray:
    """(rank, epoch, train_time_s, test_time_s, correct, total) -> EVAL_DTYPE rows."""
    out = np.zeros(len(rows), dtype=EVAL_DTYPE)
    for i, (rank, epoch, train, test, correct, total) in enumerate(rows):
        out[i]["rank"], out[i]["epoch"], out[i]["iteration"] = rank, epoch, 10 * epoch
        out[i]["train_time_s"], out[i]["test_time_s"] = train, test
        out[i]["correct"], out[i]["total"], out[i]["loss"] = correct, total, 0.5
    return out


MIB = 2**20
BATCH = 8

# ------------------------------------------------------------------------------------
# A configuration that follows the model exactly: two layers, ring all-reduce over a link.
ALPHA, BETA = 2e-4, 1e-8  # link α (s), β (s/byte)
TB = (0.004, 0.006)  # backward of layer 1, layer 2
BYTES = (4e5, 1e6)  # gradient bytes of layer 1, layer 2
DATA, FORWARD, UPDATE = 0.001, 0.01, 0.002


def hand_schedule(
    n: int, oversub: float = 1.0, wait: float = 0.0, steps: float | None = None, overlap: bool = True,
    rings: int = 1,
) -> tuple[float, float, tuple[float, float], float]:  # fmt: skip
    """(exposed comm, total comm, (tc1, tc2), the iteration's scheduling wait) at n ranks,
    worked out by hand for two layers; `oversub` > 1: the ranks time-share their cores
    (backward and every hop that much slower, and the exchange waits `wait` at each of a
    ring's 2(n − 1) steps, in `rings` of the two messages per iteration (1: the first; 2:
    each, as JAX's), fully exposed); `steps`: an all-reduce of that
    many α steps in place of the ring's 2(n − 1), with the ring's bytes; without `overlap`
    both messages are served once backward is over (an exchange through MPI_Allreduce)."""
    if n == 1:
        return 0.0, 0.0, (0.0, 0.0), 0.0
    alpha, beta = ALPHA * oversub, BETA * oversub
    tb = (TB[0] * oversub, TB[1] * oversub)
    a = (2 * (n - 1) if steps is None else steps) * alpha
    b = 2 * (n - 1) / n * beta  # ring all-reduce: tc(M) = a + b·M
    tc1, tc2 = a + b * BYTES[0], a + b * BYTES[1]
    tau_c1 = max(tb[1] + tc2, tb[1] + tb[0]) if overlap else sum(tb) + tc2  # τc[2] = τb[2] + tb[2] = tb[2]
    waited = rings * 2 * (n - 1) * wait if oversub > 1 else 0.0
    exposed = tau_c1 + tc1 - (tb[1] + tb[0]) + waited
    return exposed, tc1 + tc2 + waited, (tc1, tc2), waited


# The expected largest of n standard normal draws (tables of normal order statistics).
EXPECTED_MAX = {1: 0.0, 2: 0.5641896, 4: 1.0293754, 8: 1.4236003}


def model_point(
    directory: Path, n: int, cpus: int = 0, wait: float = 0.0, backend: str = "gloo",
    steps: float | None = None, mpi: str | None = None, last_rank: float = 0.0,
    pollers: float = 0.0, environment: dict[str, str] | None = None, last_rank_in_turns: bool = False,
    loop_wait: float | None = None, alone: float = 0.0, work_wait: float | None = None,
    loop_runnable: float | None = None,
) -> tuple[Point, float]:  # fmt: skip
    """A point that follows the model; with `cpus`, one single-thread rank per CPU at most
    before they time-share (compute and hops slowed by n / cpus, each hop `wait` longer);
    `steps`: its all-reduce takes that many α steps (hand_schedule); `mpi`: the MPI library
    its provenance names; `last_rank`: its ranks wait that long for the last of them at 2
    ranks, growing as the expected largest of n normal draws (EXPECTED_MAX), in the exchange
    phase after backward (with `last_rank_in_turns`, only where the ranks outnumber the CPUs);
    `pollers`: threads per rank that took a CPU's share beside the compute (n·(1 + pollers)
    thread-loads); `environment`: the ranks' environment its provenance names; `loop_wait`:
    the share of their runnable time the ranks' training loops (which compute) waited for a
    CPU, in the ranks' schedstat samples; `work_wait`: their threads' wait by their work
    there; `loop_runnable`: the loop's runnable share of an iteration (default: the compute's,
    as a loop that computes; less for one that hands the compute to its framework's threads);
    `alone`: the exchange phase of one rank, whose all-reduce over itself sends no message
    (hooks, copies). An MPI backend's ("mpi", "naive") messages are handed over during
    backward but served once it is over, their ends seen in the wait after it (`comm_end`
    "wait"), as torch `mpi`'s non-blocking all-reduces are."""
    oversub = max(1.0, n * (1 + pollers) / cpus) if cpus else 1.0
    overlap = backend not in ("mpi", "naive")
    rings = 2 if backend in ("pmean", "pmean_fused") else 1  # JAX: every message's ring waits
    exposed, total, (tc1, tc2), waited = hand_schedule(n, oversub, wait, steps, overlap, rings)
    if not last_rank_in_turns or n > cpus:
        exposed += last_rank * EXPECTED_MAX[n] / EXPECTED_MAX[2]
    exposed += alone if n == 1 else 0.0
    tb = (TB[0] * oversub, TB[1] * oversub)
    data, forward, update = DATA * oversub, FORWARD * oversub, UPDATE * oversub
    it = iterations(n, 12, warmup=2, data=data, forward=forward, backward=sum(tb), comm=exposed, update=update,
                    comm_total=total, batch=BATCH)  # fmt: skip
    rows = []
    if n > 1:
        for r in range(n):
            for i in range(12):
                # each message's service time is its cost and half the iteration's wait (with
                # rings = 2, its own ring's)
                start = it["t_start"][r, i] + data + forward
                served = start + (tb[1] if overlap else sum(tb))  # the first message's service begins
                first_end = served + tc2 + waited / 2
                rows.append((r, i, int(BYTES[1]), start + tb[1], first_end))  # layer 2 first
                end = max(first_end, start + tb[1] + tb[0]) + tc1 + waited / 2
                rows.append((r, i, int(BYTES[0]), start + tb[1] + tb[0], end))
    point = Point(framework="torch", backend=backend, model="mlp", ranks_per_node=n, batch_size=BATCH,
                  threads=1 if cpus else None)  # fmt: skip
    hosts = ["h"] * n if cpus else None
    provenance: dict[str, object] = {"cpu_count": cpus} if cpus else {}
    provenance.update({"mpi": mpi} if mpi else {})
    provenance.update({"environment": environment} if environment is not None else {})
    provenance.update({} if overlap else {"comm_end": "wait"})
    comm = comm_rows(rows) if rows else None
    compute = data + forward + sum(tb) + update
    runnable = compute / (compute + exposed) if loop_runnable is None else loop_runnable
    sampled = loop_wait is not None or work_wait is not None
    samples = (
        sched_rows(n, 1.5, 12.0, wait=loop_wait or 0.0, runnable=runnable, work_wait=work_wait) if sampled else None
    )
    write_point_file(directory / f"{point.id}.h5", point, it, comm=comm, resources=samples, hostnames=hosts,
                     provenance=provenance)  # fmt: skip
    return point, compute + exposed
