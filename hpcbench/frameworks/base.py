"""The framework adapter contract every framework module implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

from hpcbench.comm import Comm
from hpcbench.rankenv import RankEnv
from hpcbench.registry import Registry
from hpcbench.spec import Point
from hpcbench.trace.recorder import Recorder

Problem = tuple[str, str, str]  # (field, what is wrong, what is allowed)


class Framework(ABC):
    """One deep-learning framework driven through the same phase-timed loop.

    Lifecycle on every rank: `setup` (distributed initialisation), `build` (model, optimizer,
    data), then `step` once per iteration between the worker's `Recorder.start` and
    `Recorder.stop`, marking the phase ends it goes through, then `teardown`.
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]]  # modules that must import for this framework to work
    backends: ClassVar[tuple[str, ...]]
    models: ClassVar[tuple[str, ...]]
    datasets: ClassVar[tuple[str, ...]] = ("synthetic",)

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        """Cross-field problems of a point for this framework (beyond the name lists)."""
        if point.backend not in cls.backends:
            yield "backend", f"{point.backend!r} is not a backend of framework {cls.name!r}", ", ".join(cls.backends)
        if point.model not in cls.models:
            yield "model", f"{point.model!r} is not a model of framework {cls.name!r}", ", ".join(cls.models)
        if point.dataset not in cls.datasets:
            yield "dataset", f"{point.dataset!r} is not supported by {cls.name!r}", ", ".join(cls.datasets)

    @abstractmethod
    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        """Initialise the distributed backend. `comm` is the MPI communicator, if any."""

    def bookkeeping_comm(self) -> Comm | None:
        """Collectives for the store when the job has no MPI (e.g. under torchrun)."""
        return None

    @abstractmethod
    def build(self, point: Point) -> None:
        """Model, optimizer and data for this rank."""

    @abstractmethod
    def step(self, rec: Recorder) -> Any:
        """One training iteration, marking phase ends on `rec`. Returns the loss (any scalar-like)."""

    def recorder(self, capacity: int, clock_offset: int, epoch_ns: int) -> Recorder:
        """The phase recorder for this framework and device (CPU clock by default)."""
        return Recorder(capacity, clock_offset, epoch_ns)

    def versions(self) -> dict[str, str]:
        """Library versions and settings for the provenance record."""
        return {}

    def teardown(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the distributed backend."""


FRAMEWORKS: Registry[type[Framework]] = Registry("framework", "hpcbench.frameworks")
