"""The framework adapter contract every framework module implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.registry import Registry, import_error
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.trace.messages import CommRecorder
from hpcbench.trace.recorder import Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

Problem = tuple[str, str, str]  # (field, what is wrong, what is allowed)
MPI_LAUNCHERS = ("mpirun", "srun")  # launchers whose ranks find each other through MPI_Init


@dataclass(frozen=True)
class Evaluation:
    """One rank's result on its held-out shard."""

    correct: int  # correctly classified samples (0 for a model that is not a classifier)
    total: int  # samples classified (0 for a model that is not a classifier: accuracy undefined)
    loss: float  # mean test loss over the shard


class Framework(ABC):
    """One deep-learning framework driven through the same phase-timed loop.

    Lifecycle on every rank: `setup` (distributed initialisation), `build` (model, optimizer,
    data), then `step` once per iteration between the worker's `Recorder.start` and
    `Recorder.stop`, marking the phase ends it goes through, then `teardown`.
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]]  # modules that must import for this framework to work
    backends: ClassVar[tuple[str, ...]]
    # more modules a backend needs beyond `requires` (e.g. "horovod": ("horovod.torch",))
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {}
    models: ClassVar[tuple[str, ...]]
    datasets: ClassVar[tuple[str, ...]] = ("synthetic",)

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        """Cross-field problems of a point for this framework (beyond the name lists)."""
        if point.backend not in cls.backends:
            yield "backend", f"{point.backend!r} is not a backend of framework {cls.name!r}", ", ".join(cls.backends)
        if point.model not in cls.models:
            yield "model", f"{point.model!r} is not a model of framework {cls.name!r}", ", ".join(cls.models)
            return
        if point.dataset not in cls.datasets:
            yield "dataset", f"{point.dataset!r} is not supported by {cls.name!r}", ", ".join(cls.datasets)
            return
        if point.dataset != "synthetic" and not point.data_dir:
            yield "data_dir", f"dataset {point.dataset!r} reads its files from data_dir, which is not set", "a folder"
        if point.model in zoo.NAMES:
            try:
                model_for(point)
            except HpcbenchError as exc:
                yield "model", str(exc), f"models whose input fits dataset {point.dataset!r}"

    @classmethod
    def unavailable(cls, backend: str) -> str | None:
        """Why `backend` cannot run in this interpreter (a module that fails to import), or None."""
        return import_error((*cls.requires, *cls.backend_requires.get(backend, ())))

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

    def steps_per_epoch(self) -> int:
        """Training iterations in one epoch of this rank's shard (after `build`)."""
        return 1

    def parameter_checksum(self) -> float:
        """`checksum` of the model's weights (after `build`); NaN if not available."""
        return float("nan")

    def evaluate(self) -> Evaluation | None:
        """Test this rank's held-out shard with the current weights (no timing: the worker
        times the call). None: this framework does not evaluate."""
        return None

    def recorder(self, capacity: int, clock_offset: int, epoch_ns: int) -> Recorder:
        """The phase recorder for this framework and device (CPU clock by default)."""
        return Recorder(capacity, clock_offset, epoch_ns)

    def comm_recorder(self, rank: int, clock_offset: int, epoch_ns: int) -> CommRecorder:
        """The per-message recorder for this framework and device (CPU clock by default)."""
        return CommRecorder(rank, clock_offset, epoch_ns)

    def versions(self) -> dict[str, str]:
        """Library versions and settings for the provenance record."""
        return {}

    def compute_threads(self, point: Point) -> int | None:
        """Threads each rank computes on, for the provenance's `compute_threads` (the model's
        CPU contention counts them, analysis/model/contention.py): the point's `threads`, which the
        framework heeds (None: its default, not known here). A framework whose runtime takes
        another count whatever `threads` says returns the count it takes."""
        return point.threads

    def comm_end(self) -> str:
        """What a message's recorded end is, for the provenance's `comm_end`: "completion"
        (the moment the backend completed it: a callback, an in-graph stamp, a blocking
        call's return) or "wait" (the moment a wait, in the order the messages were started,
        once backward is over, returned it; analysis/model/fit.py)."""
        return schema.COMM_END_COMPLETION

    def teardown(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the distributed backend."""


def cpu_mpi_problems(point: Point, name: str, device_why: str) -> Iterable[Problem]:
    """What a framework that runs on the CPU and exchanges gradients through mpi4py refuses:
    another device (`device_why` says why), a launcher without MPI, any `extra` setting."""
    if point.device != "cpu":
        yield "device", device_why, "cpu"
    if point.launcher not in MPI_LAUNCHERS:
        yield (
            "launcher",
            f"{name} exchanges gradients over MPI: {point.launcher!r} gives none",
            ", ".join(MPI_LAUNCHERS),
        )
    for key in dict(point.extra):
        yield "extra", f"{key!r} is not a {name} setting", "none"


def checksum(arrays: Iterable[Any]) -> float:
    """One number for a set of weight arrays, equal on ranks whose weights are equal:
    the sum over arrays of (sum of values + sum of squares), in float64."""
    total = 0.0
    for a in arrays:
        v = np.asarray(a, dtype=np.float64)
        total += float(v.sum() + np.square(v).sum())
    return total


def model_for(point: Point) -> zoo.Model:
    """The point's model, shaped for its dataset (synthetic data takes the model's own input)."""
    default = zoo.model(point.model)
    shape, classes = data.input_of(point.dataset, default.input, default.classes)
    return zoo.model(point.model, shape, classes)


def shard_for(point: Point, model: zoo.Model, rank: int, size: int) -> data.Shard:
    """This rank's part of the point's dataset, shaped for `model`."""
    return data.load(
        point.dataset, point.data_dir, model.input, model.classes, point.batch_size, rank, size, point.seed
    )


FRAMEWORKS: Registry[type[Framework]] = Registry("framework", "hpcbench.frameworks")
