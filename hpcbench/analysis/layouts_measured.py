"""The parallel layouts a sweep measured, beside what the layout model (model/layouts.py)
predicts for each, calibrated on the group's data-parallel point alone.

A group is the points that differ only in their `parallel` layout (same model, seq_len,
batch, ranks, nodes, framework, backend, seed, ...). Its data-parallel point (all of fsdp,
tp and pp 1) calibrates the model, and nothing else does, so every other layout is held out:

- compute: the point's forward + backward per iteration (one device, `batch_size` samples),
  the layout model's measured one-rank time (`Machine.single_rank_s`), split over tp × pp;
- link: α, β fitted on the point's own all-reduce messages as the model fits a sweep's link
  (calibrate.fit_link_from_points: a ring over the point's ranks), on both levels; or the
  link `hpcbench report --commbench` fits on commbench files;
- rest: what the layout model does not model (data, host-to-device, the optimizer's update,
  time in no phase) = t_iter − forward − backward − exchange phase, carried as measured.

predicted t_iter = the layout model's t_iter + rest. The data-parallel row is the
calibration row: its error checks only the modelled exchange against its measured one.
Layouts are ranked by samples/s (the most first; they train different global batches,
batch_size × dp × fsdp, so t_iter alone does not rank them). A layout whose point ran out of
memory (point file status `out_of_memory`, manifest state "out of memory") is listed as such, with
its predicted memory, and is not ranked. docs/analysis.md, "Parallel layouts".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcbench.analysis.model import layouts as lm
from hpcbench.analysis.model.calibrate import fit_link_from_points
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.model.derived import Derived
from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.reader import PointData

MEASURED, OOM_SHOWN = "measured", "out of memory"
COLUMNS = ["group", "config", "point", "layout", "status", "calibration", "ranks", "dp", "fsdp", "tp", "pp",
           "measured_t_iter_s", "measured_samples_per_s", "measured_tokens_per_s", "measured_peak_device_gib",
           "predicted_t_iter_s", "predicted_samples_per_s", "predicted_tokens_per_s", "predicted_memory_gib",
           "predicted_exposed_s", "predicted_bubble_s", "rel_error", "measured_rank", "predicted_rank",
           "cal_point", "cal_compute_s", "cal_rest_s", "cal_alpha_s", "cal_beta_s_per_byte", "note"]  # fmt: skip
_CALIBRATION = ("cal_point", "cal_compute_s", "cal_rest_s", "cal_alpha_s", "cal_beta_s_per_byte")


@dataclass(frozen=True)
class Measured:
    """One point of a group as measured (NaN where not recorded)."""

    point_id: str
    point: Point
    t_iter_s: float
    samples_per_s: float
    tokens_per_s: float = math.nan
    peak_device_gib: float = math.nan


@dataclass(frozen=True)
class Calibration:
    """What a group's data-parallel point gives the layout model."""

    point: str  # its id
    compute_s: float  # forward + backward of batch_size samples on one device
    rest_s: float  # data, host-to-device, update and time in no phase, carried as measured
    link: LinkCost  # per hop, fitted on its messages


def group_key(point: Point) -> str:
    """What a group shares: the point with its layout left out."""
    return replace(point, parallel=()).id


def data_parallel(point: Point) -> bool:
    return point.layout.plain


def calibrate(p: PointData, row: dict[str, Any], link: LinkCost | None = None) -> Calibration:
    """The calibration `p` (a data-parallel point) and its stats row give, with `link` (from
    commbench files) instead of its messages' where given; HpcbenchError where its messages
    cannot be fitted (fewer than 2 ranks, none recorded)."""
    forward, backward, comm, t_iter = (float(row[k]) for k in ("forward_s", "backward_s", "comm_s", "t_iter_s"))
    if link is None:
        link, _ = fit_link_from_points([p], Derived(), cpu=False)
    rest = max(t_iter - forward - backward - comm, 0.0)
    return Calibration(p.point_id, forward + backward, rest, link)


def prediction(point: Point, cal: Calibration) -> tuple[lm.LayoutPrediction, float]:
    """The layout model's prediction of `point` (its t_iter without the calibration's rest)
    and the predicted t_iter with it; HpcbenchError where the model cannot take the point."""
    if point.devices_per_rank != 1:
        raise HpcbenchError("a rank driving several devices: the layout model takes one device per rank")
    if point.optimizer not in lm.OPTIMIZER_BYTES:
        raise HpcbenchError(f"optimizer {point.optimizer!r}: the layout model knows {', '.join(lm.OPTIMIZER_BYTES)}")
    job = lm.Job(lm.transformer(point.model, point.seq_len), point.batch_size, point.precision or "fp32",
                 point.optimizer)  # fmt: skip
    machine = lm.Machine(point.ranks_per_node, cal.link, cal.link, math.inf, single_rank_s=cal.compute_s)
    pred = lm.predict(job, machine, point.layout)
    return pred, pred.t_iter_s + cal.rest_s


def _row(m: Measured | None, point: Point, point_id: str, cal: Calibration | None, why: str) -> dict[str, Any]:
    layout = point.layout
    out: dict[str, Any] = dict.fromkeys(COLUMNS, math.nan)
    out.update(group=group_key(point), config=replace(point, parallel=()).label(), point=point_id,
               layout=layout.label(), status=MEASURED if m is not None else OOM_SHOWN,
               calibration=cal is not None and cal.point == point_id, ranks=layout.ranks, dp=layout.dp,
               fsdp=layout.fsdp, tp=layout.tp, pp=layout.pp, note=why)  # fmt: skip
    if m is not None:
        out.update(measured_t_iter_s=m.t_iter_s, measured_samples_per_s=m.samples_per_s,
                   measured_tokens_per_s=m.tokens_per_s, measured_peak_device_gib=m.peak_device_gib)  # fmt: skip
    if cal is None:
        return out
    out.update(cal_point=cal.point, cal_compute_s=cal.compute_s, cal_rest_s=cal.rest_s, cal_alpha_s=cal.link.alpha,
               cal_beta_s_per_byte=cal.link.beta)  # fmt: skip
    try:
        pred, t_iter = prediction(point, cal)
    except HpcbenchError as exc:
        out["note"] = f"no prediction: {exc}"
        return out
    samples = point.batch_size * layout.data_ranks / t_iter
    out.update(predicted_t_iter_s=t_iter, predicted_samples_per_s=samples,
               predicted_tokens_per_s=samples * pred.tokens_per_s / pred.samples_per_s,
               predicted_memory_gib=pred.memory.total / lm.GIB, predicted_bubble_s=pred.bubble_s,
               predicted_exposed_s=pred.tp_comm_s + pred.pp_comm_s + pred.shard_exposed_s)  # fmt: skip
    if m is not None and m.t_iter_s > 0:
        out["rel_error"] = (t_iter - m.t_iter_s) / m.t_iter_s
    return out


def group_rows(
    measured: Sequence[Measured], cal: Calibration | None, why: str = "", out_of_memory: Sequence[Point] = ()
) -> pd.DataFrame:
    """One group's rows: each measured point, then each point out of memory, predicted from
    `cal` (None: no prediction, `why` says why), ranked by samples/s."""
    rows = [_row(m, m.point, m.point_id, cal, why) for m in measured]
    rows += [_row(None, p, p.id, cal, why) for p in out_of_memory]
    return rank(pd.DataFrame(rows, columns=COLUMNS))


def rank(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each group's measured and predicted ranks by samples/s (1: the most), over
    the rows that have both a measurement and a prediction (every measured row, where the
    group has no prediction); equal rates keep the rows' order (ranks stay a permutation)."""
    table = table.copy()
    for _, part in table.groupby("group", sort=False):
        measured = part[np.isfinite(part["measured_samples_per_s"].astype(float))]
        both = measured[np.isfinite(measured["predicted_samples_per_s"].astype(float))]
        ranked = both if not both.empty else measured
        table.loc[ranked.index, "measured_rank"] = _ranks(ranked["measured_samples_per_s"])
        if not both.empty:
            table.loc[both.index, "predicted_rank"] = _ranks(both["predicted_samples_per_s"])
    return table


def _ranks(rates: pd.Series) -> np.ndarray:
    order = np.argsort(-rates.to_numpy(dtype=float), kind="stable")
    out = np.empty(len(order), dtype=float)
    out[order] = np.arange(1, len(order) + 1)
    return out


# ------------------------------------------------------------------------------------------
# A sweep's groups


def measured_of(point_id: str, point: Point, row: dict[str, Any]) -> Measured:
    def value(key: str) -> float:
        found = row.get(key, math.nan)
        return float(found) if found is not None else math.nan

    return Measured(point_id, point, value("t_iter_s"), value("throughput"), value("tokens_per_s"),
                    value("peak_device_gib"))  # fmt: skip


def table(
    points: Sequence[tuple[str, Point]],
    stats: pd.DataFrame,
    read: Callable[[int], PointData | None],
    link: LinkCost | None = None,
) -> pd.DataFrame:
    """Every group of `points` (id, fields; in the sweep's order) in which some point runs a
    layout other than plain data parallelism: its rows (group_rows), calibrated on its first
    data-parallel point, read by `read(index into points)` (the link `link`, where given). The
    points out of memory are with_out_of_memory's to add."""
    rows: dict[str, dict[str, Any]] = {}
    if not stats.empty:
        rows = {str(k): {str(c): v for c, v in r.items()} for k, r in stats.set_index("point").to_dict("index").items()}
    groups: dict[str, list[int]] = {}
    for i, (point_id, point) in enumerate(points):
        if point_id in rows:
            groups.setdefault(group_key(point), []).append(i)
    frames = []
    for members in groups.values():
        if all(data_parallel(points[i][1]) for i in members):
            continue
        measured = [measured_of(points[i][0], points[i][1], rows[points[i][0]]) for i in members]
        cal, why = _calibration([i for i in members if data_parallel(points[i][1])], points, rows, read, link)
        frames.append(group_rows(measured, cal, why))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def _calibration(
    plain: list[int],
    points: Sequence[tuple[str, Point]],
    rows: dict[str, dict[str, Any]],
    read: Callable[[int], PointData | None],
    link: LinkCost | None,
) -> tuple[Calibration | None, str]:
    if not plain:
        return None, "no data-parallel point in this group: nothing to calibrate on, no prediction"
    i = plain[0]
    data = read(i)
    if data is None:
        return None, f"the data-parallel point {points[i][0]} could not be read: no prediction"
    try:
        return calibrate(data, rows[points[i][0]], link), ""
    except (HpcbenchError, KeyError, ValueError) as exc:
        return None, f"the data-parallel point {points[i][0]} cannot calibrate the model ({exc}): no prediction"


def out_of_memory_points(directory: Path, known: Sequence[str]) -> list[Point]:
    """The sweep's points that ran out of memory (the manifest's state "out of memory", or
    status `out_of_memory` in their point file), other than `known` (the complete points)."""
    from hpcbench.store.status import result_status
    from hpcbench.sweepdir.manifest import OUT_OF_MEMORY, Manifest

    try:
        manifest = Manifest.load(directory)
    except HpcbenchError:
        return []
    found = []
    for entry in manifest.entries.values():
        if entry.id in known:
            continue
        lost = entry.state == OUT_OF_MEMORY or result_status(directory / entry.result) == schema.STATUS_OOM
        if not lost:
            continue
        try:
            found.append(Point.from_dict(entry.point))
        except (HpcbenchError, TypeError, ValueError):
            continue
    return found


def with_out_of_memory(layouts: pd.DataFrame, lost: Sequence[Point]) -> pd.DataFrame:
    """`layouts` (table's, without the points out of memory: the cached form) with the rows of
    the `lost` points added, each predicted from its group's calibration columns."""
    if not lost:
        return layouts
    frames = [layouts] if not layouts.empty else []
    for point in lost:
        if not layouts.empty and point.id in set(layouts["point"]):
            continue
        key = group_key(point)
        mine = layouts[layouts["group"] == key] if not layouts.empty else layouts
        cal = _calibration_of(mine)
        why = "" if cal is not None else "no data-parallel point in this group: nothing to calibrate on, no prediction"
        frames.append(pd.DataFrame([_row(None, point, point.id, cal, why)], columns=COLUMNS))
    return rank(pd.concat(frames, ignore_index=True))


def _calibration_of(rows: pd.DataFrame) -> Calibration | None:
    known = rows.dropna(subset=list(_CALIBRATION)) if not rows.empty else rows
    if known.empty:
        return None
    r = known.iloc[0]
    return Calibration(str(r["cal_point"]), float(r["cal_compute_s"]), float(r["cal_rest_s"]),
                       LinkCost(float(r["cal_alpha_s"]), float(r["cal_beta_s_per_byte"])))  # fmt: skip


# ------------------------------------------------------------------------------------------
# What a reader needs first


def headlines(layouts: pd.DataFrame) -> list[str]:
    """Per group with predictions: whether the predicted ranking is the measured one, and the
    worst error of a held-out layout."""
    out = []
    for _, part in layouts.groupby("group", sort=False):
        ranked = part.dropna(subset=["measured_rank", "predicted_rank"])
        if ranked.empty:
            continue
        same = bool((ranked["measured_rank"] == ranked["predicted_rank"]).all())
        held = ranked[~ranked["calibration"].astype(bool)]
        worst = held.loc[held["rel_error"].abs().idxmax()] if not held.empty else None
        error = f"; worst held-out error {worst['rel_error']:+.1%} ({worst['layout']})" if worst is not None else ""
        order = " > ".join(ranked.sort_values("measured_rank")["layout"])
        predicted = " > ".join(ranked.sort_values("predicted_rank")["layout"])
        ranking = f"yes ({order})" if same else f"no (measured {order}; predicted {predicted})"
        lost = int((part["status"] == OOM_SHOWN).sum())
        oom = f"; {lost} out of memory" if lost else ""
        out.append(f"Layouts of {part['config'].iloc[0]}: predicted ranking by samples/s equals measured: {ranking}"
                   f"{error}{oom} (calibrated on the data-parallel point {ranked['cal_point'].iloc[0]})")  # fmt: skip
    return out
