"""Prediction beside measurement: fit the model on a configuration's smallest runs, predict the rest.

A configuration is the points that differ only in scale (nodes, ranks per node, batch
size) and seed. Its calibration:

- phases (data, h2d, forward, backward, update) and the time in no phase ("overhead":
  t_iter minus all measured phases) from the point with the fewest ranks, the mean over its
  repeats (points that differ from it only in seed); compute phases scale linearly with the
  per-rank batch when a point's batch differs;
- layers (gradient buckets: bytes and backward time) from the smallest point that recorded
  messages, their backward times scaled to add up to the calibration point's backward;
- the link's α and β: from a commbench file when one is given, else from the messages of
  the points with the smallest rank count >= 2 (tc(M) = α_p + β_p·M fitted, then turned
  into the link cost of a ring all-reduce of p ranks, which gives tc at any other N; where
  the gradients went through MPI_Allreduce, each message costed by the algorithm the MPI
  library chose for its size and rank count, mpi_rules.py); for a
  parameter-server backend from every push and pull of the smallest points with messages,
  one worker included, as servers.py turns them into a step's cost at any other N.

- CPU contention (contention.py): compute follows the cores each rank really has, from the
  placement recorded in the point file (ranks per host, threads, cores); the thread exponent
  φ from two calibration points with different threads; on CPU the collectives' per-hop
  costs grow with oversubscription too, and where the backend's threads sleep while they wait
  (trait `sleeping_wait`) the exchange's first ring waits half a scheduler slice per step for its threads (a
  CPU-driven ring waits for peers to be scheduled), so the link is fitted per unit of
  oversubscription, that wait taken out.
- whether the backend's messages progress beside backward: not where its gradients go
  through MPI_Allreduce (trait `mpi_exchange`): a blocking call after backward, or a non-blocking
  one that MPI progresses only inside MPI calls (no progress thread: measured,
  benchmarks/mpi_progress.py), so that its service begins with the wait after backward;
- the exchange a single rank still runs (its backend's all-reduce over one rank: the wait
  for its hooks, its buckets' copies): the exchange phase of a one-rank calibration point,
  predicted at one rank only (from two ranks on, the messages the link was fitted on
  carry it); where no rank ran alone, one rank of a backend whose collectives a background
  thread runs (trait `background_thread`: Horovod's) waits half its cycle for it (`cycle_wait`);
- the wait for the last rank (skew.py): the exchange phase of the smallest points of two or
  more ranks beyond the exposed exchange modelled for them, carried to N ranks as the
  expected largest of N normal draws grows.

Every point is then predicted with and without wait-free back-propagation and compared with
its measured t_iter; calibration points are marked (their error is in-sample). How well the
model predicts scales it was not fitted on is validate.py's (leave one scale out).

What depends on the backend and launcher is read from their traits as the point file records
them (`PointData.traits`, store/traits.py), never from their names. The modules: derived.py
(what is derived from each measured point once), calibrate.py (the fit), calibrated.py (the
calibration and its prediction at any scale); this one predicts every point beside its
measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from hpcbench.analysis import metrics
from hpcbench.analysis.model.calibrate import calibrate, cycle_wait, fit_link_from_points
from hpcbench.analysis.model.calibrated import Calibration, predict_point
from hpcbench.analysis.model.collectives import LinkCost, ModelError
from hpcbench.analysis.model.contention import compute_scale
from hpcbench.analysis.model.derived import COMPUTE_PHASES, Derived
from hpcbench.store.reader import PointData

# the calibration's parts, as the analysis and its tests know them from here
__all__ = [
    "COMPUTE_PHASES", "PREDICTION_COLUMNS", "Calibration", "Derived", "calibrate", "cycle_wait",
    "fit_link_from_points", "predict_point", "predictions",
]  # fmt: skip

PREDICTION_COLUMNS = [
    "point", "framework", "backend", "model", "ranks", "batch_size", "seed", "calibration",
    "measured_t_iter_s", "predicted_t_iter_s", "rel_error", "predicted_no_overlap_s", "rel_error_no_overlap",
    "measured_throughput", "predicted_throughput", "measured_efficiency", "predicted_efficiency",
    "pred_comm_total_s", "pred_comm_exposed_s", "pred_sync_wait_s", "alpha_s", "beta_s_per_byte", "comm_source",
    "oversubscribed", "compute_scale", "note",
]  # fmt: skip


def _rel(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured and math.isfinite(measured) else float("nan")


def predictions(points: Sequence[PointData], stats: pd.DataFrame, link: LinkCost | None = None) -> pd.DataFrame:
    """Predicted beside measured for every point; `stats` is indexed by point id."""
    groups: dict[str, list[PointData]] = {}
    for p in points:
        groups.setdefault(metrics.scaling_group(p.point), []).append(p)
    rows: list[dict[str, object]] = []
    derived = Derived(stats)
    for group in groups.values():
        try:
            cal = calibrate(group, stats, link, derived)
        except ModelError as exc:
            rows += [{"point": p.point_id, "note": f"no prediction: {exc}"} for p in group]
            continue
        for p in group:
            row = stats.loc[p.point_id]
            n, b = int(row["ranks"]), int(row["batch_size"])
            calibrated = p.point_id in cal.calibration_points
            where = derived.measured_placement(p) if calibrated else derived.placement(p)
            wfbp = predict_point(cal, n, b, overlap=True, placement=where)
            serial = predict_point(cal, n, b, overlap=False, placement=where)
            single = predict_point(cal, 1, b, overlap=True)
            measured = float(row["t_iter_s"])
            rows.append(
                {
                    "point": p.point_id,
                    "framework": p.point.framework,
                    "backend": p.point.backend,
                    "model": p.point.model,
                    "ranks": n,
                    "batch_size": b,
                    "seed": p.point.seed,
                    "calibration": calibrated,
                    "measured_t_iter_s": measured,
                    "predicted_t_iter_s": wfbp.t_iter,
                    "rel_error": _rel(wfbp.t_iter, measured),
                    "predicted_no_overlap_s": serial.t_iter,
                    "rel_error_no_overlap": _rel(serial.t_iter, measured),
                    "measured_throughput": float(row["throughput"]),
                    "predicted_throughput": wfbp.throughput,
                    "measured_efficiency": float(row["efficiency"]),
                    "predicted_efficiency": wfbp.throughput / (n * single.throughput),
                    "pred_comm_total_s": wfbp.comm_total,
                    "pred_comm_exposed_s": wfbp.comm_exposed,
                    "pred_sync_wait_s": wfbp.sync_wait,
                    "alpha_s": cal.link.alpha if cal.link else float("nan"),
                    "beta_s_per_byte": cal.link.beta if cal.link else float("nan"),
                    "comm_source": cal.comm_source,
                    "oversubscribed": where.oversubscribed,
                    "compute_scale": compute_scale(cal.on(cal.placement), cal.on(where), cal.phi) if cal.cpu else 1.0,
                    "note": "",
                }
            )
    frame = pd.DataFrame(rows, columns=PREDICTION_COLUMNS)
    return frame.sort_values(["framework", "backend", "model", "batch_size", "ranks"], kind="stable").reset_index(
        drop=True
    )
