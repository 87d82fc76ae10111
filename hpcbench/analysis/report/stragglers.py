"""The report's "Why is it slow" part: its CSV tables (stragglers.csv, hosts.csv, whatif.csv,
buckets.csv), its figures (compute time per rank and iteration as a heat map, each rank's
cost, hosts by how often they were the slowest) and its table sections. The numbers come
from stragglers.py; report.py only calls in here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go  # type: ignore[import-untyped]
from plotly.subplots import make_subplots  # type: ignore[import-untyped]

from hpcbench.analysis.metric_table import Format, number, percent
from hpcbench.analysis.report import figures as figures  # the sweep's figures come first on the page
from hpcbench.analysis.report.plot import HOVER, PANEL_HEIGHT, Plot, bars_height, color, figure, finish, hover_data
from hpcbench.analysis.stragglers.find import SweepStragglers
from hpcbench.sweepdir.atomic import write_text_atomic

if TYPE_CHECKING:
    from hpcbench.analysis.pipeline import Analysis

CSV = {"stragglers": "stragglers", "hosts": "hosts", "whatif": "whatif", "buckets": "buckets"}
HEAT_POINTS = 4  # heat maps drawn: the points with the costliest stragglers
HEAT_SHOWN = (64, 160)  # a drawn heat map's most cells (ranks, iterations): larger ones are block-averaged


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


def _blocks(heat: np.ndarray, most: tuple[int, int]) -> tuple[np.ndarray, int, int]:
    """`heat` block-averaged to at most `most` cells a side; (the blocks, ranks per block, iterations per block)."""
    rows, cols = (max(1, -(-n // m)) for n, m in zip(heat.shape, most, strict=True))
    r, c = heat.shape[0] // rows * rows, heat.shape[1] // cols * cols
    if (rows, cols) == (1, 1):
        return heat, 1, 1
    trimmed = heat[:r, :c].reshape(r // rows, rows, c // cols, cols)
    return trimmed.mean(axis=(1, 3)), rows, cols


@figure("Compute time per rank and iteration")
def heat_map(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Compute time per rank and iteration of the points with the costliest stragglers."""
    slow = analysis.slow
    chosen = _costliest(slow, HEAT_POINTS)
    if not chosen:
        return None
    titles = [f"{slow.points[k].point_id}: {slow.points[k].label}" for k in chosen]
    fig = make_subplots(rows=len(chosen), cols=1, subplot_titles=titles, vertical_spacing=0.3 / len(chosen))
    tidy = []
    for row, k in enumerate(chosen, start=1):
        p = slow.points[k]
        heat, per_rank, per_iter = _blocks(p.heat * 1e3, HEAT_SHOWN)
        custom = np.full((*heat.shape, 2), "", dtype=object)
        custom[..., 0], custom[..., 1] = p.label, p.point_id
        fig.add_trace(
            go.Heatmap(
                z=heat.astype(np.float32),
                coloraxis="coloraxis",
                customdata=custom,
                hovertemplate=HOVER + "rank (block) %{y}, iteration (block) %{x}: %{z:.3g} ms<extra></extra>",
            ),
            row=row,
            col=1,
        )
        blocked = len(p.ranks) > heat.shape[0] or per_rank > 1
        fig.update_yaxes(
            title_text="rank (blocks)" if blocked else "rank", autorange="reversed", dtick=1, row=row, col=1
        )
        fig.update_xaxes(title_text="timed iteration (blocks)", row=row, col=1)
        r, c = np.indices(heat.shape)
        tidy.append(
            pd.DataFrame(
                {
                    "point": p.point_id,
                    "rank_block": r.ravel(),
                    "iteration_block": c.ravel(),
                    "ranks_per_block": per_rank,
                    "iterations_per_block": per_iter,
                    "compute_ms": heat.ravel(),
                }
            )
        )
    fig.update_layout(coloraxis={"colorscale": "Viridis", "colorbar": {"title": {"text": "compute (ms)"}}})
    return Plot(
        finish(fig, "Compute time per rank and iteration", 80 + PANEL_HEIGHT * len(chosen)),
        pd.concat(tidy, ignore_index=True),
    )


@figure("Cost of each rank")
def cost_per_rank(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Each rank's cost (share of t_iter saved with it at the other ranks' median speed), costliest points."""
    slow = analysis.slow
    chosen = _costliest(slow, HEAT_POINTS)
    if not chosen:
        return None
    fig = go.Figure()
    tidy = []
    for j, k in enumerate(chosen):
        p = slow.points[k]
        ranks = p.ranks
        custom = hover_data([p.label] * len(ranks), [p.point_id] * len(ranks))
        fig.add_trace(
            go.Bar(
                x=ranks["rank"],
                y=ranks["cost_pct"],
                name=p.point_id,
                marker={"color": color(j)},
                customdata=custom,
                hovertemplate=HOVER + "rank %{x}: cost %{y:.1f} %<extra></extra>",
            )
        )
        tidy.append(pd.DataFrame({"point": p.point_id, "rank": ranks["rank"], "cost_pct": ranks["cost_pct"]}))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="rank")
    fig.update_yaxes(title_text="cost: t_iter saved at the others' median speed (%)")
    return Plot(finish(fig, "Cost of each rank", 420), pd.concat(tidy, ignore_index=True))


@figure("Slow hosts across the sweep")
def host_bars(analysis: Analysis, stats: pd.DataFrame) -> Plot | None:
    """Hosts (or, on one host, ranks within it) by the share of points in which they were the slowest."""
    hosts = analysis.slow.hosts
    if hosts.empty:
        return None
    whole = hosts[hosts["local_rank"] == ""]
    data = (whole if not whole.empty else hosts).head(30)
    pairs = zip(data["host"], data["local_rank"], strict=True)
    labels = [h if lr == "" else f"{h} / local rank {lr}" for h, lr in pairs]
    evidence = [str(e) for e in data["evidence"]] if "evidence" in data else [""] * len(data)
    custom = hover_data(labels, evidence)
    fig = go.Figure()
    slowest = data["slowest_points"].to_numpy()
    for name, x, shade in (
        ("slowest", slowest, "#d62728"),
        ("not slowest", data["points"].to_numpy() - slowest, "#7f7f7f"),
    ):
        fig.add_trace(
            go.Bar(
                y=labels,
                x=x,
                orientation="h",
                name=name,
                marker={"color": shade},
                customdata=custom,
                hovertemplate="%{customdata[0]}<br>slowest in: %{customdata[1]}<br>"
                f"{name}: %{{x}} points<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="points")
    title = "Hosts by how often they held the slowest rank" if not whole.empty else "Ranks by how often slowest"
    return Plot(finish(fig, title, bars_height(len(labels)), below=True), data.assign(label=labels))


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
