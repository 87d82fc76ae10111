"""What a point's collectives moved and how fast, per kind and mesh axis: the `/comm` rows of
its timed iterations grouped by (op, axis), with nccl-tests' bandwidths.

Per point × op × axis, over the timed iterations (warm-up excluded, stragglers/timed.py):

- `messages_per_iter`: messages per iteration per rank (all the point's ranks);
- `bytes_per_iter`: bytes per iteration per rank (`bytes` as nccl-tests sizes a collective:
  an all-reduce's or broadcast's whole buffer, an all-gather's gathered output, a
  reduce-scatter's input, a send's or receive's tensor);
- `time_per_message_s`: the mean of t_end − t_start (from the hand-over to the completion
  seen: a message that waited for its peers counts its wait);
- `algbw` = Σ bytes / Σ time, bytes per second; `busbw` = algbw × nccl-tests' bus factor
  for the op over the group's n ranks: all-reduce 2(n − 1)/n; all-gather, reduce-scatter and
  all-to-all (n − 1)/n; broadcast, reduce, send and receive 1 (blank for other ops: a
  parameter server's push and pull);
- `group_size`: n, the degree of the axis in the point's layout (`Point.layout`);
- `level`: `intra` where every group of the axis lies on one node (its ranks share
  rank // ranks_per_node), `inter` where every group spans nodes, `mixed` otherwise.

docs/metrics-and-model.md, "Collectives per mesh axis".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from hpcbench.analysis.stragglers.timed import timed_columns
from hpcbench.spec.parallel import Layout
from hpcbench.store.commfile import BUS_FACTOR  # nccl-tests' factors, one table for commbench and the trace
from hpcbench.store.reader import PointData

COLUMNS = ["point", "layout", "op", "axis", "group_size", "level", "messages_per_iter", "bytes_per_iter",
           "bytes_per_message", "time_per_message_s", "time_per_iter_s", "algbw", "busbw"]  # fmt: skip


def has_layouts(points: Sequence[PointData]) -> bool:
    """Whether some point of the sweep runs a `parallel` layout."""
    return any(p.point.parallel for p in points)


def level(layout: Layout, axis: str, ranks_per_node: int) -> str:
    """`intra`, `inter` or `mixed`: where the groups of `axis` lie (one node each, or not)."""
    if layout.degree(axis) == 1:
        return "intra"
    on_one = {len({r // ranks_per_node for r in group}) == 1 for group in layout.groups(axis)}
    return "mixed" if len(on_one) > 1 else ("intra" if on_one.pop() else "inter")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus factor of `op` over n ranks; NaN for an op it does not define."""
    factor = BUS_FACTOR.get(op)
    return factor(n) if factor is not None and n >= 1 else float("nan")


def of_point(p: PointData) -> pd.DataFrame:
    """One row per op × axis of the point's messages in its timed iterations (COLUMNS)."""
    comm = p.comm
    columns = timed_columns(p.iterations)
    if not len(comm) or not columns.size:
        return pd.DataFrame(columns=COLUMNS)
    timed = np.zeros(p.iterations.shape[1], dtype=bool)
    timed[columns] = True
    it = comm["iteration"]
    rows = comm[(it >= 0) & (it < timed.size)]
    rows = rows[timed[rows["iteration"]]]
    if not len(rows):
        return pd.DataFrame(columns=COLUMNS)
    layout = p.point.layout
    ranks = p.iterations.shape[0]
    per_node = max(1, p.point.ranks_per_node)
    cells = ranks * int(columns.size)  # rank × timed iteration
    keys = np.char.add(np.char.add(rows["op"], b"/"), rows["axis"])  # S arrays drop trailing NULs: "/" joins
    out = []
    for key in np.unique(keys):
        sel = rows[keys == key]
        op, axis = (part.decode() for part in bytes(key).rsplit(b"/", 1))
        n = layout.degree(axis) if axis in ("dp", "fsdp", "tp", "pp") else ranks
        nbytes = float(sel["bytes"].sum())
        seconds = float((sel["t_end"] - sel["t_start"]).sum())
        algbw = nbytes / seconds if seconds > 0 else float("nan")
        out.append({
            "point": p.point_id, "layout": layout.label(), "op": op, "axis": axis, "group_size": n,
            "level": level(layout, axis, per_node) if axis in ("dp", "fsdp", "tp", "pp") else "",
            "messages_per_iter": len(sel) / cells, "bytes_per_iter": nbytes / cells,
            "bytes_per_message": nbytes / len(sel), "time_per_message_s": seconds / len(sel),
            "time_per_iter_s": seconds / cells, "algbw": algbw, "busbw": algbw * bus_factor(op, n),
        })  # fmt: skip
    return pd.DataFrame(out, columns=COLUMNS)


def table(points: Sequence[PointData]) -> pd.DataFrame:
    """Every point's rows (of_point), one after another; empty where no point sent a message."""
    frames = [f for f in (of_point(p) for p in points) if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
