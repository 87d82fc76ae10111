"""A calibration workload: every phase lasts exactly as long as the point says, nothing else.

It measures the harness itself (recording, writing, launching) and checks that known
durations come back out of the point file. Durations come from the point's `extra`:
`data_s`, `h2d_s`, `forward_s`, `backward_s`, `comm_s`, `update_s` (seconds, default 0);
`rank_scale` multiplies every duration on rank r by (1 + r * rank_scale) to make a known
load imbalance.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from hpcbench.frameworks.base import FRAMEWORKS, Framework, Problem
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.schema import PHASES
from hpcbench.trace.recorder import Phase, Recorder

SPIN_S = 0.002  # sleep until this close to the deadline, then spin: sleep alone overshoots


def hold(seconds: float) -> None:
    """Wait `seconds` precisely (a few microseconds)."""
    deadline = time.perf_counter() + seconds
    if seconds > SPIN_S:
        time.sleep(seconds - SPIN_S)
    while time.perf_counter() < deadline:
        pass


@FRAMEWORKS.register
class SyntheticFramework(Framework):
    name = "synthetic"
    requires = ()
    backends = ("none",)
    models = ("sleep",)

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        for key, value in point.extra:
            allowed = [f"{p}_s" for p in PHASES] + ["rank_scale"]
            if key not in allowed:
                yield "extra", f"{key!r} is not a synthetic workload setting", ", ".join(allowed)
            elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                yield "extra", f"{key}: {value!r} is not a non-negative number", "seconds >= 0"

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        extra = dict(point.extra)
        scale = 1.0 + renv.rank * float(extra.get("rank_scale", 0.0))
        self._plan = [(getattr(Phase, p.upper()), float(extra.get(f"{p}_s", 0.0)) * scale) for p in PHASES]

    def build(self, point: Point) -> None:
        pass

    def step(self, rec: Recorder) -> Any:
        for phase, seconds in self._plan:
            if seconds:  # a phase without work is not marked: it lasts 0 s, as in the other adapters
                hold(seconds)
                rec.mark(phase)
        return 0.0
