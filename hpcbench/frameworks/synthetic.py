"""A calibration workload: every phase lasts exactly as long as the point says, nothing else.

It measures the harness itself (recording, writing, launching), checks that known
durations come back out of the point file, and makes workloads with a known straggler.
Settings come from the point's `extra`:

- `data_s`, `h2d_s`, `forward_s`, `backward_s`, `comm_s`, `update_s`: seconds each phase
  lasts (default 0). `comm_s` is a plain wait, with no message.
- `rank_scale`: every duration on rank r is multiplied by (1 + r * rank_scale), a known
  load imbalance.
- `slow_rank` (a rank number) and `slow_factor` (>= 1, default 1): the compute phases
  (data, h2d, forward, backward, update) of rank `slow_rank` last `slow_factor` times as
  long: a known straggler.
- `comm_bytes` (bytes per tensor, > 0) and `comm_tensors` (all-reduces per iteration,
  default 1): when the ranks have MPI (launchers mpirun, srun), the `comm` phase is a real
  exchange: `comm_tensors` blocking all-reduces (sum) of float32 buffers of `comm_bytes`
  bytes across the ranks, one after the other once backward ended, each recorded as a
  gradient message (`allreduce`, tensor `tensorK`) and its duration added to `comm_total`.
  Ranks that arrive early wait in it for the last one, as in synchronous training. Buffers
  are allocated once, in `build`; `comm_s`, when also set, is waited before the messages.
  Without MPI (one rank, or a launcher without it) there is nothing to exchange with and
  the setting is refused when the point is planned for more than one rank (the launcher
  must be an MPI one: `launcher_need`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from hpcbench.frameworks._mpi import TimedAllreduce
from hpcbench.frameworks.base import FRAMEWORKS, Framework, LauncherNeed, Problem
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.schema import COMPUTE_PHASES, PHASES
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder

SPIN_S = 0.002  # sleep until this close to the deadline, then spin: sleep alone overshoots
SECONDS = tuple(f"{p}_s" for p in PHASES)
FACTORS = ("rank_scale", "slow_factor")
COUNTS = ("slow_rank", "comm_bytes", "comm_tensors")


def hold(seconds: float) -> None:
    """Wait `seconds` precisely (a few microseconds)."""
    deadline = time.perf_counter() + seconds
    if seconds > SPIN_S:
        time.sleep(seconds - SPIN_S)
    while time.perf_counter() < deadline:
        pass


def _problem(key: str, value: Any) -> Problem | None:
    """What is wrong with one `extra` setting, or None."""
    if key not in (*SECONDS, *FACTORS, *COUNTS):
        return "extra", f"{key!r} is not a synthetic workload setting", ", ".join((*SECONDS, *FACTORS, *COUNTS))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return "extra", f"{key}: {value!r} is not a non-negative number", "numbers >= 0"
    if key in COUNTS and not isinstance(value, int):
        return "extra", f"{key}: {value!r} is not a whole number", "integers >= 0"
    if key == "slow_factor" and value < 1:
        return "extra", f"slow_factor: {value!r} is below 1", "a factor >= 1"
    if key in ("comm_bytes", "comm_tensors") and value == 0:
        return "extra", f"{key}: 0 sends nothing", "integers >= 1 (leave it out for no exchange)"
    return None


@FRAMEWORKS.register
class SyntheticFramework(Framework):
    name = "synthetic"
    requires = ()
    backends: ClassVar[tuple[str, ...]] = ("none",)
    models = ("sleep",)
    # its messages, when it sends any, are blocking all-reduces timed as they run: the defaults
    traits: ClassVar[Mapping[str, Traits]] = {"none": Traits()}

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        extra = dict(point.extra)
        for key, value in extra.items():
            problem = _problem(key, value)
            if problem is not None:
                yield problem
        slow = extra.get("slow_rank")
        if isinstance(slow, int) and not isinstance(slow, bool) and slow >= point.ranks:
            yield "extra", f"slow_rank: {slow} is not a rank of a {point.ranks}-rank point", f"0..{point.ranks - 1}"
        if "comm_tensors" in extra and "comm_bytes" not in extra:
            yield "extra", "comm_tensors without comm_bytes sends nothing", "set comm_bytes too"

    @classmethod
    def launcher_need(cls, point: Point) -> LauncherNeed | None:
        if "comm_bytes" in dict(point.extra) and point.ranks > 1:
            return LauncherNeed("comm_bytes all-reduces buffers between the ranks over MPI", field="extra")
        return None

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        extra = dict(point.extra)
        scale = 1.0 + renv.rank * float(extra.get("rank_scale", 0.0))
        slow = float(extra.get("slow_factor", 1.0)) if extra.get("slow_rank") == renv.rank else 1.0
        self._plan = [
            (getattr(Phase, p.upper()), float(extra.get(f"{p}_s", 0.0)) * scale * (slow if p in COMPUTE_PHASES else 1))
            for p in PHASES
        ]
        self._allreduce = TimedAllreduce(comm.mpi_comm if comm is not None and comm.size > 1 else None)
        self._bytes = int(extra.get("comm_bytes", 0))
        self._tensors = int(extra.get("comm_tensors", 1)) if self._bytes else 0

    def build(self, point: Point) -> None:
        n = max(1, self._bytes // 4)
        # (tensor name, send buffer) and a receive buffer per all-reduce, allocated once
        self._sends = [(f"tensor{k}", np.ones(n, dtype=np.float32)) for k in range(self._tensors)]
        self._receives = [np.empty(n, dtype=np.float32) for _ in range(self._tensors)]

    def step(self, rec: Recorder) -> Any:
        for phase, seconds in self._plan:
            if phase == Phase.COMM and self._tensors:
                hold(seconds)
                self._allreduce.each(rec, self._sends, self._receives)
                rec.mark(phase)
            elif seconds:  # a phase without work is not marked: it lasts 0 s, as in the other adapters
                hold(seconds)
                rec.mark(phase)
        return 0.0
