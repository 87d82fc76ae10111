"""How far to trust the model on this very sweep: leave one scale out.

For every configuration measured at three or more scales (rank counts), the model is
calibrated without the points of one scale and predicts them; each held-out error is
(predicted − measured) / measured of t_iter. The miss is split by phase so that it explains
itself: `resid_compute_s` (the compute phases grew or shrank otherwise than modelled),
`resid_exchange_s` (the time in the exchange after backward), `resid_other_s` (time in no
phase); the three add up to measured − predicted.

Where a scale was measured more than once (repeats: points that differ only in seed),
`repeat_spread` is how far their t_iter lay apart, (largest − smallest) / mean: run-to-run
variation that no model of the configuration can follow, against which a miss is read.

The report opens with the median and largest |error| per framework × backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import pandas as pd

from hpcbench.analysis import metrics, resources
from hpcbench.analysis.model import predict
from hpcbench.analysis.model.collectives import LinkCost, ModelError
from hpcbench.analysis.model.iteration import IterationPrediction
from hpcbench.analysis.placement import Placement
from hpcbench.store.reader import PointData

MIN_SCALES = 3
HELD_OUT_COLUMNS = [
    "point", "framework", "backend", "model", "ranks", "batch_size", "oversubscribed",
    "measured_t_iter_s", "predicted_t_iter_s", "rel_error",
    "resid_compute_s", "resid_exchange_s", "resid_other_s", "repeat_spread", "note",
]  # fmt: skip
REPEATS_DIFFER = 0.20  # repeats this far apart make a miss of that size run-to-run variation


def _residuals(row: pd.Series, pred: IterationPrediction) -> dict[str, float]:
    compute = sum(float(row[f"{p}_s"]) for p in predict.COMPUTE_PHASES)
    exchange = float(row["comm_s"])
    other = float(row["t_iter_s"]) - compute - exchange
    pred_compute = pred.data + pred.h2d + pred.forward + pred.backward + pred.update
    return {
        "resid_compute_s": compute - pred_compute,
        "resid_exchange_s": exchange - pred.comm_exposed,
        "resid_other_s": other - pred.overhead,
    }


def _note(cal: predict.Calibration, where: Placement, train: Sequence[PointData], derived: predict.Derived) -> str:
    """Why a held-out point may miss: fewer threads per host than every calibration point ran,
    with the host's effective cores unknown (contention.py), is an extrapolation the
    calibration cannot check. `derived`: where the points' placements are kept."""
    if cal.cpu and cal.cores == 0 and where.load < min(derived.placement(p).load for p in train):
        return (
            f"effective cores {cal.cores_source}; compute at {where.ranks_per_host} "
            "rank(s) per host extrapolated from more"
        )
    return ""


CPU_WAIT_SEEN = 0.10  # a run-queue wait share from which the ranks visibly lacked cores


def _wait_note(row: pd.Series, where: Placement) -> str:
    """What the scheduler saw: a held-out point whose training loops waited for a CPU although
    the model counted no more threads than cores shared its cores with threads it did not
    count (a framework's own thread pool, MPI's polling, Horovod's background thread, other
    jobs)."""
    wait = float(row.get("cpu_wait", math.nan))
    if not wait >= CPU_WAIT_SEEN:
        return ""
    cpus = float(row.get("rank_cpus", math.nan))
    ran = f"; each ran on {cpus:.2f} CPUs" if math.isfinite(cpus) else ""
    counted = where.describe()
    waited = f"the training loops waited {wait:.0%} of their runnable time for a CPU"
    loads = _loads_seen(wait, where)
    if where.oversubscribed:
        return f"{waited} ({counted}{ran}){loads}"
    return (
        f"{waited} although {counted} fit: other threads held cores (the ranks' own uncounted ones, other jobs)"
        f"{ran}{loads}"
    )


def _loads_seen(wait: float, where: Placement) -> str:
    """What a loop wait w says of the host's load: C / (1 − w) thread-loads on its C CPUs
    (contention.py), beside those the placement counted; with polling threads counted, the
    share of a thread each spun, as that load leaves it (at most the count)."""
    if not where.cores > 0 or not 0 <= wait < 1:
        return ""
    seen = where.cores / (1 - wait)
    text = f"; a wait of {wait:.0%} is what {seen:.1f} thread-loads on {where.cores:g} CPUs give"
    text += f", {where.load:g} counted"
    if where.pollers > 0:
        text += f": {where.pollers_seen(seen):.2f} polling thread(s) each, not {where.pollers:.2g}"
    return text


DISTURBED = "measured beside other work"  # the start of the note below


def disturbed_points(stats: pd.DataFrame) -> dict[str, list[str]]:
    """Per point of the stats table (indexed by point), `resources.disturbances` of its row."""
    names = [c for c in ("other_cpus", "cpu_steal") if c in stats.columns]
    columns = [stats[c].to_numpy() for c in names]
    return {
        key: resources.disturbances(dict(zip(names, values, strict=True)))
        for key, *values in zip(stats.index, *columns, strict=True)
    }


def _disturbed_note(point: str, train: Sequence[PointData], disturbed: dict[str, list[str]]) -> str:
    """Points of the prediction (the held-out one, its calibration points) during whose timed
    loop other processes than the job's kept cores busy, or a hypervisor stole CPU time
    (resources.py, `other_cpus` and `cpu_steal`); `disturbed`: `disturbed_points` of the stats."""
    named = [("this point", point), *((f"calibration point {p.point_id}", p.point_id) for p in train)]
    found = [f"{what} during {name}" for name, key in named for what in disturbed.get(key, ())]
    return f"{DISTURBED}: " + ", ".join(found) if found else ""


def repeat_spread(repeats: Sequence[PointData], stats: pd.DataFrame) -> float:
    """(largest − smallest) / mean of the repeats' t_iter; NaN for fewer than two."""
    measured = stats["t_iter_s"]
    times = [float(measured[p.point_id]) for p in repeats if p.point_id in measured.index]
    mean = sum(times) / len(times) if times else 0.0
    return (max(times) - min(times)) / mean if len(times) >= 2 and mean > 0 else math.nan


def _spread_note(spread: float, repeats: int) -> str:
    if not spread >= REPEATS_DIFFER:
        return ""
    return f"its {repeats} repeats at this scale differ by {spread:.0%} of their mean (run-to-run variation)"


def _notes(
    cal: predict.Calibration, where: Placement, train: Sequence[PointData], row: pd.Series,
    disturbed: dict[str, list[str]], spread: str, derived: predict.Derived,
) -> str:  # fmt: skip
    notes = (
        _note(cal, where, train, derived),
        _wait_note(row, where),
        _disturbed_note(str(row.name), train, disturbed),
        spread,
    )
    return "; ".join(n for n in notes if n)


def _held_out_group(
    group: Sequence[PointData],
    stats: pd.DataFrame,
    link: LinkCost | None,
    derived: predict.Derived,
    disturbed: dict[str, list[str]],
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for scale in sorted({p.iterations.shape[0] for p in group}):
        train = [p for p in group if p.iterations.shape[0] != scale]
        for p in (p for p in group if p.iterations.shape[0] == scale):
            row = cast(pd.Series, stats.loc[p.point_id])
            repeats = [q for q in group if q.iterations.shape[0] == scale and q.point.batch_size == p.point.batch_size]
            spread = repeat_spread(repeats, stats)
            varies = _spread_note(spread, len(repeats))
            out: dict[str, object] = {
                "point": p.point_id, "framework": p.point.framework, "backend": p.point.backend,
                "model": p.point.model, "ranks": scale, "batch_size": p.point.batch_size, "repeat_spread": spread,
            }  # fmt: skip
            where = derived.placement(p)
            out["oversubscribed"] = where.oversubscribed
            try:
                cal = predict.calibrate(train, stats, link, derived)
                pred = predict.predict_point(cal, scale, p.point.batch_size, overlap=True, placement=where)
            except ModelError as exc:
                rows.append({**out, "note": "; ".join(filter(None, (f"no prediction: {exc}", varies)))})
                continue
            measured = float(row["t_iter_s"])
            error = (pred.t_iter - measured) / measured if measured > 0 else math.nan
            note = _notes(cal, where, train, row, disturbed, varies, derived)
            rows.append({**out, "measured_t_iter_s": measured, "predicted_t_iter_s": pred.t_iter, "rel_error": error,
                         **_residuals(row, pred), "note": note})  # fmt: skip
    return rows


def held_out(points: Sequence[PointData], stats: pd.DataFrame, link: LinkCost | None = None) -> pd.DataFrame:
    """Every point of every configuration with >= 3 scales, predicted without its scale."""
    groups: dict[str, list[PointData]] = {}
    for p in points:
        groups.setdefault(metrics.scaling_group(p.point), []).append(p)
    rows: list[dict[str, object]] = []
    derived = predict.Derived(stats)  # each configuration is calibrated once per scale
    disturbed = disturbed_points(stats)
    for group in groups.values():
        if len({p.iterations.shape[0] for p in group}) >= MIN_SCALES:
            rows += _held_out_group(group, stats, link, derived, disturbed)
    return pd.DataFrame(rows, columns=HELD_OUT_COLUMNS)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per framework × backend: points, median and largest |held-out error|."""
    valid = table.dropna(subset=["rel_error"])
    if valid.empty:
        return pd.DataFrame(columns=["framework", "backend", "points", "median_abs_error", "max_abs_error"])
    valid = valid.assign(abs_error=valid["rel_error"].abs())
    grouped = valid.groupby(["framework", "backend"], sort=True)["abs_error"]
    out = grouped.agg(points="size", median_abs_error="median", max_abs_error="max").reset_index()
    return out


def headline(table: pd.DataFrame) -> str:
    """The report's first line about the model."""
    s = summary(table)
    if s.empty:
        return (
            "Model held-out error: not measured (no configuration at 3 or more scales; leave-one-scale-out needs them)."
        )
    parts = [
        f"{r.framework}/{r.backend} median {r.median_abs_error:.0%}, max {r.max_abs_error:.0%} ({r.points} points)"
        for r in s.itertuples()
    ]
    oversub = int(table["oversubscribed"].fillna(False).astype(bool).sum())
    tail = f"; oversubscribed (more threads than cores) held-out points: {oversub}" if oversub else ""
    unmeasured = int(table["note"].fillna("").str.startswith("effective cores not measured").sum())
    if unmeasured:
        tail += f"; held-out points whose compute was extrapolated without the host's effective cores: {unmeasured}"
    disturbed = int(table["note"].fillna("").str.contains(DISTURBED).sum())
    if disturbed:
        tail += (
            f"; held-out points predicted from or measured beside other work (other processes' CPUs, "
            f"a hypervisor's steal): {disturbed}"
        )
    varied = int((table["repeat_spread"] >= REPEATS_DIFFER).sum())
    if varied:
        tail += (
            f"; held-out points whose repeats at their scale differ by {REPEATS_DIFFER:.0%} or more "
            f"(run-to-run variation no model follows): {varied}"
        )
    return "Model held-out error (leave one scale out): " + "; ".join(parts) + tail + "."
