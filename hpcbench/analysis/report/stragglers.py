"""The report's "Why is it slow" part: its CSV tables (stragglers.csv, hosts.csv, whatif.csv,
buckets.csv), its figures (compute time per rank and iteration as a heat map, each rank's
cost, hosts by how often they were the slowest) and its table sections. The numbers come
from stragglers.py; report.py only calls in here."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from hpcbench.analysis.metric_table import Format, number, percent
from hpcbench.analysis.report.figures import DPI, SIZE, FigureMaker
from hpcbench.analysis.stragglers.find import SweepStragglers
from hpcbench.sweepdir.atomic import write_text_atomic

CSV = {"stragglers": "stragglers", "hosts": "hosts", "whatif": "whatif", "buckets": "buckets"}
HEAT_POINTS = 4  # heat maps drawn: the points with the costliest stragglers


def _pct_points(v: object) -> str:
    return "" if not isinstance(v, int | float) or not np.isfinite(v) else f"{v:+.1f} %"


def write_tables(slow: SweepStragglers, directory: Path) -> list[Path]:
    """stragglers.csv, hosts.csv, whatif.csv and buckets.csv in `directory`; returns the paths."""
    paths = []
    for name, attr in CSV.items():
        path = directory / f"{name}.csv"
        write_text_atomic(path, getattr(slow, attr).to_csv(index=False))
        paths.append(path)
    return paths


def _costliest(slow: SweepStragglers, n: int) -> list[int]:
    costs = [0.0 if p.worst is None else float(p.rank_columns["cost_pct"][p.worst]) for p in slow.points]
    return [int(i) for i in np.argsort(costs)[::-1][:n]]


def heat_map(slow: SweepStragglers) -> Figure | None:
    """Compute time per rank and iteration of the points with the costliest stragglers."""
    chosen = _costliest(slow, HEAT_POINTS)
    if not chosen:
        return None
    fig, axes = plt.subplots(len(chosen), 1, figsize=(SIZE[0], 2.6 * len(chosen)), dpi=DPI, squeeze=False)
    for ax, k in zip(axes[:, 0], chosen, strict=True):
        p = slow.points[k]
        image = ax.imshow(p.heat * 1e3, aspect="auto", interpolation="nearest", cmap="viridis")
        fig.colorbar(image, ax=ax, label="compute (ms)")
        ax.set_title(f"{p.point_id}: {p.label}", fontsize="small")
        ax.set_ylabel("rank (blocks)" if len(p.ranks) > p.heat.shape[0] else "rank")
        ax.set_xlabel("timed iteration (blocks)")
    fig.tight_layout()
    return fig


def cost_per_rank(slow: SweepStragglers) -> Figure | None:
    """Each rank's cost (share of t_iter saved with it at the other ranks' median speed), costliest points."""
    chosen = _costliest(slow, HEAT_POINTS)
    if not chosen:
        return None
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    width = 0.8 / len(chosen)
    for j, k in enumerate(chosen):
        ranks = slow.points[k].ranks
        ax.bar(ranks["rank"] + j * width, ranks["cost_pct"], width=width, label=slow.points[k].point_id)
    ax.set_xlabel("rank")
    ax.set_ylabel("cost: t_iter saved at the others' median speed (%)")
    ax.set_title("Cost of each rank")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def host_bars(slow: SweepStragglers) -> Figure | None:
    """Hosts (or, on one host, ranks within it) by the share of points in which they were the slowest."""
    hosts = slow.hosts
    if hosts.empty:
        return None
    whole = hosts[hosts["local_rank"] == ""]
    data = whole if not whole.empty else hosts
    data = data.head(30)
    pairs = zip(data["host"], data["local_rank"], strict=True)
    labels = [h if lr == "" else f"{h} / local rank {lr}" for h, lr in pairs]
    fig, ax = plt.subplots(figsize=(SIZE[0], max(2.5, 0.9 + 0.35 * len(labels))), dpi=DPI)
    ax.barh(labels, data["slowest_points"], color="tab:red", label="slowest")
    ax.barh(labels, data["points"] - data["slowest_points"], left=data["slowest_points"], color="tab:gray",
            label="not slowest")  # fmt: skip
    ax.set_xlabel("points")
    ax.set_title("Hosts by how often they held the slowest rank" if not whole.empty else "Ranks by how often slowest")
    ax.invert_yaxis()
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def figure_list(slow: SweepStragglers) -> list[tuple[str, FigureMaker]]:
    return [
        ("Compute time per rank and iteration", lambda: heat_map(slow)),
        ("Cost of each rank", lambda: cost_per_rank(slow)),
        ("Slow hosts across the sweep", lambda: host_bars(slow)),
    ]


_ms: Format = number(2, 1e3)
Spec = list[tuple[str, str, Format]]
# (key, title, format) of the report's straggler sections
RANKS: Spec = [("point", "point", str), ("rank", "rank", str), ("host", "host", str),
         ("phase_s", "compute (ms)", _ms), ("excess_pct", "excess", _pct_points),
         ("slowest_share", "slowest in", percent), ("median_excess_pct", "by (median)", _pct_points),
         ("through", "through", str), ("cost_pct", "cost", _pct_points),
         ("whatif_t_iter_s", "t_iter without it (ms)", _ms), ("t_iter_s", "t_iter (ms)", _ms)]  # fmt: skip
WHATIF: Spec = [("point", "point", str), ("scenario", "scenario", str), ("rank", "rank", str), ("host", "host", str),
          ("t_iter_s", "t_iter (ms)", _ms), ("throughput", "samples/s", number(1)),
          ("saving_pct", "saving", _pct_points)]  # fmt: skip
HOSTS: Spec = [("host", "host", str), ("local_rank", "local rank", str), ("points", "points", str),
         ("slowest_points", "slowest in", str), ("median_excess_pct", "by (median)", _pct_points),
         ("evidence", "points where slowest", str)]  # fmt: skip
BUCKETS: Spec = [("point", "point", str), ("op", "op", str), ("bucket", "bucket", str), ("messages", "messages", str),
           ("bytes", "bytes", number(0)), ("mean_s", "mean (ms)", _ms), ("hidden_share", "hidden", percent),
           ("exposed_mean_s", "exposed (ms)", _ms), ("exposed_share", "exposed share", percent)]  # fmt: skip


def sections(slow: SweepStragglers) -> list[tuple[str, Spec, pd.DataFrame, str]]:
    """(title, columns, table, about) of each straggler section."""
    worst = slow.stragglers
    if not worst.empty:
        worst = worst[(worst["phase"] == "compute") & (worst["slowest_iterations"] > 0)]
        worst = worst.sort_values(["cost_pct", "slowest_share"], ascending=False).head(40)
    return [
        ("Stragglers: ranks that set the iteration's end", RANKS, worst,
         "Per point, ranks that were ever the slowest: compute (data + h2d + forward + backward + update, median "
         "over iterations), excess over the median rank, share of iterations it was the slowest and its median "
         "excess then, the phase it was slowest through, and its cost: the share of t_iter the run saves with it at "
         "the median speed of the other ranks (what-if replay). Every rank and phase: stragglers.csv."),
        ("What if: the run re-timed", WHATIF, slow.whatif,
         "Replayed from the recorded phases: every rank at the median rank's speed, one rank at the median speed of "
         "the other ranks (with 2 ranks, the other rank's), communication hidden (docs/stragglers.md)."),
        ("Slow hosts across the sweep", HOSTS, slow.hosts,
         "Hosts (of points on two or more hosts) and ranks within hosts (host, local rank), by the number of points "
         "in which they held the slowest rank and their median excess then."),
        ("Communication per bucket: hidden or exposed", BUCKETS, slow.buckets.head(60),
         "From each message's hand-over and end against its rank's end of backward: hidden = share of messages "
         "ended before backward did; exposed = mean time in flight after backward ended."),
    ]  # fmt: skip
