"""Why is it slow: straggler attribution per rank and phase, the what-if replay, slow hosts.

Per point (timed iterations only, at most SAMPLE_ITERATIONS of them: timed.py; definitions in
docs/stragglers.md):

- per rank and phase (data, h2d, forward, backward, update, comm = time in the exchange
  after backward, and compute = the five compute phases): the rank's median over iterations,
  the median rank's (median over ranks of those) and the excess;
- per iteration, the rank that set its end (the largest compute: in a synchronous step the
  others wait for it in the exchange) and the phase through which it did (its largest excess
  over that iteration's median rank, by compute); per rank, the share of iterations it was
  the slowest and its median excess then;
- the what-if replay (whatif.py): every rank at the median speed of the other ranks (with 2
  ranks, the other rank's), each rank that was ever the slowest alone at that speed (its
  cost: the share of t_iter the run would save without it), communication hidden;
- per gradient bucket, how much of it backward hid (exposure.py).

Across a sweep: hosts, and ranks within hosts (host, local rank), by how often they held a
point's slowest rank and by how much. Everything works on (ranks, iterations) arrays, with
no Python loop over iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from hpcbench.analysis import metrics, resources
from hpcbench.analysis.stragglers import exposure, whatif
from hpcbench.analysis.stragglers.timed import BLOCK_PHASES, Sample
from hpcbench.store.reader import PointData
from hpcbench.store.schema import COMPUTE_PHASES

PHASES = BLOCK_PHASES  # the compute phases, then comm: time in the exchange after backward, waiting included
ROW_PHASES = (*PHASES, "compute")
HEADLINE_COST_PCT = 5.0
Use = np.ndarray | None  # a point's resources.rank_use, where already computed
CPU_WAIT_GAP = 0.10  # a rank's loop waiting this much more for a CPU than the median rank's: its cores were taken
STEAL_GAP = 5.0  # points (%) more of a rank's node's CPU time lost to the hypervisor than the median rank's
HEAT_RANKS, HEAT_ITERATIONS = 128, 400  # the heat map's largest size (larger points are block-averaged)

STRAGGLER_COLUMNS = [
    "point", "rank", "host", "local_rank", "phase", "phase_s", "median_rank_s", "excess_s", "excess_pct",
    "slowest_share", "slowest_iterations", "median_excess_s", "median_excess_pct", "through", "cost_pct",
    "whatif_t_iter_s", "t_iter_s", "cpu_wait", "cpu_steal",
]  # fmt: skip
WHATIF_COLUMNS = ["point", "scenario", "rank", "host", "t_iter_s", "throughput", "saving_pct"]
SCENARIOS = ["measured", "all ranks at median speed", "communication hidden"]  # then each slow rank (ONE_RANK)
ONE_RANK = "rank at the other ranks' median speed"  # whatif.reference_speed: with 2 ranks, the other rank's
HOST_COLUMNS = ["host", "local_rank", "points", "slowest_points", "median_excess_pct", "evidence"]


Columns = dict[str, np.ndarray]  # a table as equal-length columns: built into a DataFrame once per sweep


@dataclass
class PointStragglers:
    """One point's attribution and replay. Its tables are kept as columns (numpy arrays) and
    made DataFrames on demand: a sweep concatenates the columns of all its points at once."""

    point_id: str
    label: str
    rank_columns: Columns  # one row per rank: rank, host, local_rank, compute_s, excess_pct, share, cost_pct, ...
    row_columns: Columns  # STRAGGLER_COLUMNS
    whatif_columns: Columns  # WHATIF_COLUMNS
    bucket_columns: Columns  # exposure.BUCKET_COLUMNS without `point` (empty: no messages)
    heat: np.ndarray  # compute seconds, (ranks, iterations) block-averaged to at most HEAT_RANKS x HEAT_ITERATIONS
    t_iter_s: float

    @cached_property
    def ranks(self) -> pd.DataFrame:
        return pd.DataFrame(self.rank_columns)

    @cached_property
    def rows(self) -> pd.DataFrame:
        return pd.DataFrame(self.row_columns)[STRAGGLER_COLUMNS]

    @cached_property
    def whatif(self) -> pd.DataFrame:
        return pd.DataFrame(self.whatif_columns)[WHATIF_COLUMNS]

    @cached_property
    def buckets(self) -> pd.DataFrame:
        if not self.bucket_columns:
            return pd.DataFrame(columns=exposure.BUCKET_COLUMNS[1:])
        return pd.DataFrame(self.bucket_columns)[exposure.BUCKET_COLUMNS[1:]]

    @property
    def worst(self) -> int | None:
        """The index of the rank with the largest cost, None if no rank has one."""
        cost = self.rank_columns["cost_pct"]
        finite = np.isfinite(cost)
        return int(np.where(finite, cost, -np.inf).argmax()) if finite.any() else None


@dataclass
class SweepStragglers:
    points: list[PointStragglers] = field(default_factory=list)
    stragglers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STRAGGLER_COLUMNS))
    whatif: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WHATIF_COLUMNS))
    hosts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HOST_COLUMNS))
    buckets: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=exposure.BUCKET_COLUMNS))
    headline: str = ""


def _group_medians(keys: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per key 0..n-1, the median of its values (NaN for a key without values)."""
    order = np.lexsort((values, keys))
    counts = np.bincount(keys, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.full(n, np.nan)
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    s = values[order]
    out[has] = (s[lo] + s[hi]) / 2.0
    return out


def _block_mean(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """`a` averaged over blocks so that it has at most rows x cols cells."""
    fr, fc = -(-a.shape[0] // rows), -(-a.shape[1] // cols)
    r, c = a.shape[0] // fr * fr, a.shape[1] // fc * fc
    return np.asarray(a[:r, :c].reshape(r // fr, fr, c // fc, fc).mean(axis=(1, 3)), dtype=np.float32)


@dataclass
class _Arrays:
    """The timed iterations of a point (at most SAMPLE_ITERATIONS of them, evenly spaced) as
    contiguous per-phase arrays (float32 durations)."""

    block: np.ndarray  # (len(ROW_PHASES), ranks, n): each of PHASES, then compute
    phase: dict[str, np.ndarray]  # views into `block`
    compute: np.ndarray
    duration: np.ndarray  # float64
    timed: np.ndarray
    columns: np.ndarray  # iteration index of each column (the timed ones, or a sample: timed.py)

    @classmethod
    def of(cls, sample: Sample) -> _Arrays:
        arrays = sample.arrays  # read out of the records once, for the exposure and this
        block = arrays.block
        phase = {p: block[k] for k, p in enumerate(PHASES)}
        return cls(block, phase, block[-1], arrays.duration, sample.rows, sample.columns)

    def row_medians(self) -> dict[str, np.ndarray]:
        """Each rank's median over iterations of each of ROW_PHASES (one partition for all)."""
        k, n_ranks, n = self.block.shape
        medians = whatif.row_median(self.block.reshape(k * n_ranks, n)).reshape(k, n_ranks)
        return {p: medians[i] for i, p in enumerate(ROW_PHASES)}


def _per_iteration(a: _Arrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per timed iteration: the slowest rank, its excess over the median rank (s and fraction),
    and the compute phase (index into COMPUTE_PHASES) through which it was slowest."""
    c = a.compute
    n_ranks, n = c.shape
    cols = np.arange(n)
    slowest = np.argmax(c, axis=0)
    low = (n_ranks - 1) // 2  # the median rank (the lower one of an even count)
    mid = np.argpartition(c, low, axis=0)[low] if n_ranks > 1 else slowest
    excess = (c[slowest, cols] - c[mid, cols]).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = excess / c[mid, cols]
    compute_phases = a.block[: len(COMPUTE_PHASES)]
    by_phase = compute_phases[:, slowest, cols] - compute_phases[:, mid, cols]
    return slowest, excess, relative, np.argmax(by_phase, axis=0)


def attribute(p: PointData, measured: exposure.Exposure | None = None, use: Use = None) -> PointStragglers:
    """Attribution and replay of one point (2+ ranks); `measured`, `use`: its exposure and rank_use, else made here."""
    a = _Arrays.of(measured.sample if measured is not None and measured.sample is not None else Sample.of(p.iterations))
    n_ranks, n = a.compute.shape
    hosts = p.hostnames[:n_ranks] + ["?"] * max(0, n_ranks - len(p.hostnames))
    rank_ids = p.ranks["rank"][:n_ranks] if len(p.ranks) >= n_ranks else np.arange(n_ranks)
    local = p.ranks["local_rank"][:n_ranks] if len(p.ranks) >= n_ranks else np.zeros(n_ranks, dtype=int)
    typical = a.row_medians()
    slowest, excess, relative, through = _per_iteration(a)
    count = np.bincount(slowest, minlength=n_ranks)
    median_excess = _group_medians(slowest, excess, n_ranks)
    median_relative = _group_medians(slowest, relative, n_ranks)
    through_of = np.bincount(slowest * len(COMPUTE_PHASES) + through, minlength=n_ranks * len(COMPUTE_PHASES))
    top_phase = np.asarray(COMPUTE_PHASES, dtype=object)[through_of.reshape(n_ranks, -1).argmax(axis=1)]
    top_phase[count == 0] = ""
    replay = whatif.replay(a.compute, a.phase["comm"], a.duration, not whatif.asynchronous(p), typical["compute"])
    t_iter = whatif.median_of(replay.measured)
    without = np.full(n_ranks, t_iter)
    slow = np.flatnonzero((count > 0) & (replay.factor < 1.0))  # ranks that were ever the slowest
    if slow.size:
        times = replay.without_each(slow)
        without[slow] = np.where(np.isnan(times).any(axis=1), np.nan, whatif.row_median(times))  # np.median's
    cost = 100.0 * (1.0 - without / t_iter) if t_iter > 0 else np.full(n_ranks, np.nan)
    med_compute = whatif.median_of(typical["compute"])
    use = (resources.rank_use(p.resources, p.iterations) if use is None else use)[:n_ranks]
    ranks: Columns = {
        "rank": np.asarray(rank_ids, dtype=np.int64), "host": np.asarray(hosts, dtype=object),
        "local_rank": np.asarray(local, dtype=np.int64), "compute_s": typical["compute"],
        "excess_pct": 100.0 * (typical["compute"] / med_compute - 1.0), "slowest_share": count / max(n, 1),
        "slowest_iterations": count, "median_excess_s": median_excess, "median_excess_pct": 100.0 * median_relative,
        "through": top_phase, "cost_pct": cost, "whatif_t_iter_s": without,
        "cpu_wait": use[:, 1], "cpu_steal": 100.0 * use[:, 5],
    }  # fmt: skip
    buckets = (measured or exposure.of(p.iterations, p.comm, union=False)).bucket_columns
    return PointStragglers(p.point_id, p.point.label(), ranks, _rows(p.point_id, ranks, typical, t_iter),
                           _scenarios(p, replay, ranks, t_iter), buckets,
                           _block_mean(a.compute, HEAT_RANKS, HEAT_ITERATIONS), t_iter)  # fmt: skip


def _rows(point_id: str, ranks: Columns, typical: dict[str, np.ndarray], t_iter: float) -> Columns:
    """stragglers.csv's rows of one point: rank x phase."""
    n, k = len(ranks["rank"]), len(ROW_PHASES)
    per_phase = np.stack([typical[phase] for phase in ROW_PHASES])
    values = per_phase.reshape(-1)
    med = np.repeat(np.where(np.isnan(per_phase).any(axis=1), np.nan, whatif.row_median(per_phase)), n)  # np.median's
    with np.errstate(divide="ignore", invalid="ignore"):
        excess_pct = np.where(med > 0, 100.0 * (values - med) / med, np.nan)
    columns: Columns = {
        "point": np.full(n * k, point_id, dtype=object),
        "phase": np.repeat(np.asarray(ROW_PHASES, dtype=object), n),
        "phase_s": values,
        "median_rank_s": med,
        "excess_s": values - med,
        "excess_pct": excess_pct,
        "t_iter_s": np.full(n * k, t_iter),
    }
    for key in ("rank", "host", "local_rank", "slowest_share", "slowest_iterations", "median_excess_s",
                "median_excess_pct", "through", "cost_pct", "whatif_t_iter_s", "cpu_wait", "cpu_steal"):  # fmt: skip
        columns[key] = np.concatenate([ranks[key]] * k)  # np.tile's result, without its overhead
    return columns


def _scenarios(p: PointData, replay: whatif.Replay, ranks: Columns, t_iter: float) -> Columns:
    """whatif.csv's rows of one point: measured, every rank at the median speed of the other
    ranks, communication hidden, then each slow rank alone at the other ranks' median speed
    (costliest first)."""
    without = ranks["whatif_t_iter_s"]
    slow = np.flatnonzero((ranks["slowest_iterations"] > 0) & (without < t_iter))
    slow = slow[np.argsort(-ranks["cost_pct"][slow], kind="stable")]
    t = np.concatenate(([t_iter, whatif.median_of(replay.all_median), whatif.median_of(replay.comm_hidden)],
                        without[slow])).astype(np.float64)  # fmt: skip
    samples = metrics.data_ranks(p.point, p.iterations.shape[0]) * p.point.batch_size  # per data rank and device
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(t > 0, samples / t, np.nan)
        saving = 100.0 * (1.0 - t / t_iter) if t_iter > 0 else np.full(t.size, np.nan)
    return {
        "point": np.full(t.size, p.point_id, dtype=object),
        "scenario": np.asarray(SCENARIOS + [ONE_RANK] * slow.size, dtype=object),
        "rank": np.asarray(["", "", "", *ranks["rank"][slow].tolist()], dtype=object),
        "host": np.asarray(["", "", "", *ranks["host"][slow].tolist()], dtype=object),
        "t_iter_s": t,
        "throughput": throughput,
        "saving_pct": saving,
    }


def hosts_table(points: list[PointStragglers]) -> pd.DataFrame:
    """Hosts (local_rank empty) and ranks within hosts, by how often they held the slowest rank
    of a point (hosts: of points on two or more hosts) and by how much (median over those points
    of its compute excess over the point's median rank, %)."""
    seen: dict[tuple[str, str], list[tuple[str, bool, float]]] = {}
    for ps in points:
        cols = ps.rank_columns
        if len(cols["rank"]) < 2:
            continue
        excess_pct = cols["excess_pct"]
        worst = int(excess_pct.argmax())
        hosts = [str(h) for h in cols["host"]]
        for i, (host, local) in enumerate(zip(hosts, cols["local_rank"].tolist(), strict=True)):
            seen.setdefault((host, str(local)), []).append((ps.point_id, i == worst, float(excess_pct[i])))
        if len(set(hosts)) > 1:
            largest: dict[str, float] = {}  # per host in order of first appearance, its largest excess
            for h, e in zip(hosts, excess_pct.tolist(), strict=True):  # one pass, not one per host
                if h not in largest or e > largest[h]:  # as max() keeps the first of equals
                    largest[h] = e
            for host, excess in largest.items():
                seen.setdefault((host, ""), []).append((ps.point_id, host == hosts[worst], float(excess)))
    rows = []
    for (host, local), evidence in seen.items():
        slowest = [(pid, e) for pid, was, e in evidence if was]
        rows.append({
            "host": host, "local_rank": local, "points": len(evidence), "slowest_points": len(slowest),
            "median_excess_pct": float(np.median([e for _, e in slowest])) if slowest else np.nan,
            "evidence": "; ".join(f"{pid} ({e:+.1f} %)" for pid, e in slowest),
        })  # fmt: skip
    if not rows:
        return pd.DataFrame(columns=HOST_COLUMNS)
    table = pd.DataFrame(rows)
    table["_share"] = table["slowest_points"] / table["points"]
    table = table.sort_values(["local_rank", "_share", "slowest_points", "median_excess_pct"],
                              ascending=[True, False, False, False], kind="stable")  # fmt: skip
    return table[HOST_COLUMNS].reset_index(drop=True)


def headline(points: list[PointStragglers]) -> str:
    """One sentence when some rank costs more than HEADLINE_COST_PCT of its point's t_iter, else ''."""
    worst = []
    for ps in points:
        r = ps.worst
        if r is not None and ps.rank_columns["cost_pct"][r] > HEADLINE_COST_PCT:
            worst.append((float(ps.rank_columns["cost_pct"][r]), ps, r))
    if not worst:
        return ""
    worst.sort(key=lambda w: -w[0])
    cost, ps, r = worst[0]
    col = ps.rank_columns
    more = (
        f"; {len(worst) - 1} more points have a straggler costing over {HEADLINE_COST_PCT:.0f} %"
        if len(worst) > 1
        else ""
    )
    return (
        f"Straggler: rank {int(col['rank'][r])} on host {col['host'][r]} costs {cost:.1f} % of point "
        f"{ps.point_id}'s iteration time ({ps.t_iter_s * 1e3:.2f} ms; {float(col['whatif_t_iter_s'][r]) * 1e3:.2f} "
        f"ms with it at {_reference(len(col['rank']))}), slowest mostly through {col['through'][r] or 'compute'}"
        f"{_cpu_causes(col, r)}{more} (stragglers.csv)."
    )


def _reference(ranks: int) -> str:
    """The what-if's reference speed in words (whatif.reference_speed)."""
    return "the other rank's speed" if ranks == 2 else "the median speed of the other ranks"


def _above_median(values: np.ndarray, r: int, gap: float) -> float | None:
    """The median over ranks of `values` when rank r's is `gap` or more above it, else None."""
    known = values[np.isfinite(values)]
    if not np.isfinite(values[r]) or known.size < 2:
        return None
    typical = float(np.median(known))
    return typical if values[r] - typical >= gap else None


# What a rank suffered beyond the median rank, said when it is `gap` or more above it: its
# loop's run-queue wait (something else held its cores), its node's steal (a noisy neighbour)
_CPU_CAUSES = (
    ("cpu_wait", CPU_WAIT_GAP, ", and its training loop waited {0:.0%} of its runnable time for a CPU (the median "
     "rank's {1:.0%}): something else held its cores"),
    ("cpu_steal", STEAL_GAP, ", and the hypervisor gave {0:.0f} % of its node's CPU time to other virtual machines "
     "(the median rank's node: {1:.0f} %): a noisy neighbour slowed it"),
)  # fmt: skip


def _cpu_causes(col: Columns, r: int) -> str:
    """What rank r lost of its CPU beyond the median rank, in words ('' where nothing stood out)."""
    said = []
    for column, gap, text in _CPU_CAUSES:
        typical = _above_median(col[column], r, gap)
        if typical is not None:
            said.append(text.format(col[column][r], typical))
    return "".join(said)


def _frame(tables: list[Columns], columns: list[str]) -> pd.DataFrame:
    """One DataFrame of the points' tables (each a dict of equal-length columns), concatenated column by column."""
    if not tables:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame({c: np.concatenate([t[c] for t in tables]) for c in columns})


def _buckets(points: list[PointStragglers]) -> pd.DataFrame:
    kept = [d for d in points if d.bucket_columns and len(d.bucket_columns["op"])]
    tables = [{"point": np.full(len(d.bucket_columns["op"]), d.point_id, dtype=object), **d.bucket_columns}
              for d in kept]  # fmt: skip
    return _frame(tables, exposure.BUCKET_COLUMNS)


def of_point(p: PointData, measured: exposure.Exposure | None = None, use: Use = None) -> PointStragglers | None:
    """One point's attribution (None: one rank or no timed iteration); `measured`, `use`: as attribute's."""
    if p.iterations.shape[0] < 2:
        return None
    if measured is None or measured.sample is None:
        measured = exposure.of(p.iterations, p.comm, union=False)
    timed = measured.sample is not None and measured.sample.columns.size  # some timed iteration
    return attribute(p, measured, use) if timed else None


def sweep(done: list[PointStragglers]) -> SweepStragglers:
    """The sweep's tables from its points' attributions (of_point), in the points' order."""
    if not done:
        return SweepStragglers()
    return SweepStragglers(
        done,
        _frame([d.row_columns for d in done], STRAGGLER_COLUMNS),
        _frame([d.whatif_columns for d in done], WHATIF_COLUMNS),
        hosts_table(done),
        _buckets(done),
        headline(done),
    )


def analyse(points: list[PointData], exposures: dict[str, exposure.Exposure] | None = None) -> SweepStragglers:
    """Attribution of every point of two or more ranks, and the sweep's tables; `exposures`
    by point id (measured once for the stats), else measured here."""
    known = exposures or {}
    found = (of_point(p, known.get(p.point_id)) for p in points)
    return sweep([d for d in found if d is not None])
