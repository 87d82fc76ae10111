"""What calibrations derive from a sweep's measured points, once per analysis (`Derived`):
their compute phases, their placement on the CPUs (analysis/placement.py), the share of their time
their threads waited for a CPU, and the costs of their messages (fit.py).

A message's recorded end is the moment its backend completed it, or, where the point's
provenance says `comm_end: wait` (`ends_seen_in_wait`), the moment a wait after backward saw
it done; there its service is counted from that wait at the earliest (fit.wait_starts).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import numpy as np
import pandas as pd

from hpcbench.analysis.model import fit
from hpcbench.analysis.model.servers import servers_of
from hpcbench.analysis.placement import Placement, placement_of
from hpcbench.store import schema
from hpcbench.store.reader import PointData

LOOP_COMPUTES = 0.25  # the loop's runnable share within this of the compute share: the loop computes
COMPUTE_PHASES = ("data", "h2d", "forward", "backward", "update")


def timed_mask(iterations: np.ndarray) -> np.ndarray:
    """The iterations that no rank marked as warm-up."""
    return np.asarray(~iterations["warmup"].any(axis=0))


def _main_op(comm: np.ndarray) -> bytes | None:
    """The collective most messages used (all-reduce in data-parallel training)."""
    if len(comm) == 0:
        return None
    if (comm["op"] == comm["op"][0]).all():
        return bytes(comm["op"][0])
    ops, counts = np.unique(comm["op"], return_counts=True)
    return bytes(ops[int(np.argmax(counts))])


def ends_seen_in_wait(p: PointData) -> bool:
    """Whether the point's message ends are the moments a wait after backward saw them (fit.py),
    as its provenance's `comm_end` says (the reader gives files written before it was recorded
    the value their exchange had then)."""
    return bool(p.provenance.get("comm_end") == schema.COMM_END_WAIT)


class Derived:
    """What calibrations derive from a sweep's points, each once per analysis: the leave-one-
    scale-out check calibrates every configuration once per scale from the same points (a big
    point's messages are selected and timed once, not once per calibration)."""

    def __init__(self, stats: pd.DataFrame | None = None) -> None:
        """`stats` (indexed by point id): the points' phases, for `compute_s`."""
        self.stats = stats
        self._compute: dict[str, float] = {}
        if stats is not None:
            compute = stats[[f"{name}_s" for name in COMPUTE_PHASES]].sum(axis=1, skipna=False)
            self._compute = {str(k): float(v) for k, v in compute.items()}
        self._messages: dict[str, np.ndarray] = {}
        self._costs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._placements: dict[str, Placement] = {}

    def cpu_wait(self, p: PointData) -> float:
        """The share of its runnable time that the point's training loop waited for a CPU
        (resources.py), where the loop is what computes: it was runnable for the compute
        phases' share of t_iter (or, a loop that polls in the exchange as MPI's does, for
        the compute's and the exchange's), within LOOP_COMPUTES. NaN otherwise, or not
        measured: a loop that hands the compute to a framework's own threads (TensorFlow,
        MXNet, JAX) or process (CNTK) does not wait for a CPU when they do."""
        columns = ("cpu_wait", "loop_runnable", "t_iter_s", "comm_s")
        if self.stats is None or not set(columns) <= set(self.stats.columns) or p.point_id not in self.stats.index:
            return math.nan
        wait, runnable, t_iter, comm = (float(cast(float, self.stats.loc[p.point_id, c])) for c in columns)
        compute = self._compute.get(p.point_id, math.nan)
        if not t_iter > 0 or not runnable > 0:
            return math.nan
        computes = any(abs(runnable * t_iter / busy - 1) <= LOOP_COMPUTES for busy in (compute, compute + comm))
        return wait if computes else math.nan

    def compute_s(self, p: PointData) -> float:
        """The point's compute phases per sample (s)."""
        return self._compute[p.point_id] / p.point.batch_size

    def placement(self, p: PointData) -> Placement:
        if p.point_id not in self._placements:
            self._placements[p.point_id] = placement_of(p)
        return self._placements[p.point_id]

    def work_wait(self, p: PointData) -> float:
        """The run-queue wait share of the point's threads, each weighted by its time on a CPU
        (`work_wait`, schema 7); NaN where not measured."""
        if self.stats is None or "work_wait" not in self.stats.columns or p.point_id not in self.stats.index:
            return math.nan
        return float(cast(float, self.stats.loc[p.point_id, "work_wait"]))

    def measured_placement(self, p: PointData) -> Placement:
        """`placement(p)` with its pollers as the point's waits measured them: threads that
        waited a share w of their runnable time for a CPU had C / (1 − w) thread-loads beside
        them. The wait is its training loop's where the loop computes (`cpu_wait`), else its
        threads' by their work (`work_wait`): the framework's own threads that compute (a loop
        that hands them the compute waits for them, not for a CPU) and the polling thread
        itself, which spins on a CPU only as long as it is scheduled."""
        where = self.placement(p)
        if where.pollers == 0 or not where.cores > 0:
            return where
        wait = self.cpu_wait(p)
        wait = wait if 0 <= wait < 1 else self.work_wait(p)
        if not 0 <= wait < 1:
            return where
        return replace(where, pollers=where.pollers_seen(where.cores / (1 - wait)))

    def messages(self, p: PointData) -> np.ndarray:
        """The point's messages of (at most fit.MAX_ITERATIONS) timed iterations."""
        if p.point_id not in self._messages:
            self._messages[p.point_id] = fit.timed_messages(p.comm, timed_mask(p.iterations))
        return self._messages[p.point_id]

    def costs(self, p: PointData) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, seconds) of the point's main collective's messages (of every push and pull
        of a parameter-server backend)."""
        if p.point_id not in self._costs:
            selected = self.messages(p)
            if servers_of(p.point, p.traits):  # pushes queue behind pushes, pulls behind pulls
                streams = [selected[selected["op"] == op] for op in np.unique(selected["op"])]
            else:
                op = _main_op(selected)
                streams = [selected if op is None or (selected["op"] == op).all() else selected[selected["op"] == op]]
            waits = fit.wait_starts(p.iterations) if ends_seen_in_wait(p) else None
            found = [c for c in (fit.message_cost_columns(comm, None, waits=waits) for comm in streams) if c]
            self._costs[p.point_id] = (
                np.concatenate([c["bytes"] for c in found]).astype(float) if found else np.zeros(0),
                np.concatenate([c["seconds"] for c in found]).astype(float) if found else np.zeros(0),
            )
        return self._costs[p.point_id]
