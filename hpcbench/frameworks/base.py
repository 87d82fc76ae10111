"""The framework adapter contract every framework module implements.

`Framework` owns what every adapter does alike: this rank's data shard, its batches and the
test pass over the held-out shard (each adapter evaluates one batch: `evaluate_batch`), the
steps per epoch, the guard of a backend that needs MPI ranks, the rendezvous timeout and the
optimizer's momentum. Each backend declares its traits (what the performance model must
know of it, `hpcbench.store.traits`) and what it needs of the launcher that starts its ranks
(`LauncherNeed`, checked at planning against the launcher's own declarations). An adapter
keeps what differs: building the model, the step, the exchange.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks import replicas
from hpcbench.frameworks.needs import LauncherKind as LauncherKind
from hpcbench.frameworks.needs import LauncherNeed as LauncherNeed
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.registry import Registry, import_error
from hpcbench.spec import Point, parallel
from hpcbench.store import schema
from hpcbench.store.traits import Traits
from hpcbench.trace.messages import CommRecorder
from hpcbench.trace.recorder import Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

Problem = tuple[str, str, str]  # (field, what is wrong, what is allowed)
MOMENTUM = 0.9  # SGD's momentum (`optimizer: momentum`) in every framework
ADAM = (0.9, 0.999, 1e-8)  # Adam's beta1, beta2, epsilon where a framework spells them out
WEIGHT_DECAY = 0.1  # AdamW's decoupled weight decay (`optimizer: adamw`), as GPT-2's and Llama's training
INIT_TIMEOUT_S = 300.0  # default of HPCBENCH_INIT_TIMEOUT_S: how long a backend's rendezvous may take


@dataclass(frozen=True)
class Evaluation:
    """One rank's result on its held-out shard."""

    correct: int  # correctly classified samples (0 for a model that is not a classifier)
    total: int  # samples classified (0 for a model that is not a classifier: accuracy undefined)
    loss: float  # mean test loss over the shard


@dataclass(frozen=True)
class RankData:
    """This rank's data: its shard, the training batches, the test pass's batch size."""

    shard: data.Shard
    batches: data.Batches
    eval_batch: int
    classifies: bool  # the model is a classifier (accuracy is counted)


class Framework(ABC):
    """One deep-learning framework driven through the same phase-timed loop.

    Lifecycle on every rank: `setup` (distributed initialisation), `build` (model, optimizer,
    data: `load_data`), then `step` once per iteration between the worker's `Recorder.start`
    and `Recorder.stop`, marking the phase ends it goes through, `evaluate` (the test pass:
    `evaluate_batch` per batch), then `teardown`.
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]]  # modules that must import for this framework to work
    backends: ClassVar[tuple[str, ...]]
    # more modules a backend needs beyond `requires` (e.g. "horovod": ("horovod.torch",))
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {}
    models: ClassVar[tuple[str, ...]]
    datasets: ClassVar[tuple[str, ...]] = ("synthetic",)
    # each backend's traits (how it groups and exchanges gradients: hpcbench.store.traits);
    # a backend not named has the defaults, Traits()
    traits: ClassVar[Mapping[str, Traits]] = {}
    # what each backend needs of its launcher (a backend not named runs under any)
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {}
    # the one device a backend runs on, where it has one: backend -> (device, the problem
    # on another, what is allowed), refused as a `backend` problem
    backend_devices: ClassVar[Mapping[str, tuple[str, str, str]]] = {}
    momentum: ClassVar[float] = MOMENTUM  # the optimizer's momentum (`optimizer: momentum`)
    # the point's `precision` values this framework trains in (unset: fp32), and its
    # `compile` values (its compiler's modes; none: it runs eagerly only, or always compiles)
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    optimizers: ClassVar[tuple[str, ...]] = ("sgd", "momentum", "adam")  # the point's `optimizer` values
    compile_modes: ClassVar[tuple[str, ...]] = ()
    # why a model of the zoo is not among `models`, where a reason is known (e.g. the
    # transformers in a framework that has no fused attention)
    refusals: ClassVar[Mapping[str, str]] = {}
    # the splits of the point's `parallel` layout this framework runs beyond data parallelism
    # (fsdp, tp, pp: hpcbench.spec.parallel), and why it lacks the others, where known
    layouts: ClassVar[tuple[str, ...]] = ()
    layout_refusals: ClassVar[Mapping[str, str]] = {}
    # the backends whose rank drives several devices (`devices_per_rank` > 1): the framework's replication
    several_devices: ClassVar[tuple[str, ...]] = ()

    _data: RankData | None = None  # set by `load_data` in `build`

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        """Cross-field problems of a point for this framework (beyond the name lists)."""
        if point.backend not in cls.backends:
            yield "backend", f"{point.backend!r} is not a backend of framework {cls.name!r}", ", ".join(cls.backends)
        device, problem, allowed = cls.backend_devices.get(point.backend, (point.device, "", ""))
        if point.device != device:
            yield "backend", problem, allowed
        if point.model not in cls.models:
            why = cls.refusals.get(point.model, f"{point.model!r} is not a model of framework {cls.name!r}")
            yield "model", why, ", ".join(cls.models)
            return
        if point.optimizer not in cls.optimizers:
            yield "optimizer", f"{cls.name} has no {point.optimizer!r} optimizer here", ", ".join(cls.optimizers)
        yield from cls._check_numerics(point)
        yield from cls._check_layout(point)
        yield from cls._check_devices(point)
        if point.dataset not in cls.datasets:
            yield "dataset", f"{point.dataset!r} is not supported by {cls.name!r}", ", ".join(cls.datasets)
            return
        if point.model in zoo.NAMES:
            yield from _check_data(point)

    @classmethod
    def _check_numerics(cls, point: Point) -> Iterable[Problem]:
        """The point's precision and compile mode against this framework's."""
        if point.precision is not None and point.precision not in cls.precisions:
            yield "precision", f"{cls.name} does not train in {point.precision}", ", ".join(cls.precisions)
        if point.compile is not None and point.compile not in cls.compile_modes:
            allowed = ", ".join(cls.compile_modes) or f"none: leave it unset ({cls.name} has no compile modes)"
            yield "compile", f"{point.compile!r} is not a compile mode of {cls.name}", allowed

    @classmethod
    def _check_layout(cls, point: Point) -> Iterable[Problem]:
        """The point's `parallel` layout: its product against the ranks, and the splits this
        framework runs."""
        if not point.parallel:
            return
        yield from parallel.check(point.parallel, point.ranks, point.batch_size)
        layout = point.layout
        for axis in ("fsdp", "tp", "pp"):
            if layout.degree(axis) > 1 and axis not in cls.layouts:
                why = cls.layout_refusals.get(axis, f"{cls.name} does not run {axis} here")
                runs = ", ".join(cls.layouts) or "none: data parallelism only (leave parallel unset)"
                yield f"parallel.{axis}", why, f"the splits {cls.name} runs: {runs}"

    @classmethod
    def _check_devices(cls, point: Point) -> Iterable[Problem]:
        """`devices_per_rank` > 1: only on a backend that drives several devices, and with plain
        data parallelism (the layouts split over ranks, not over a rank's devices)."""
        if point.devices_per_rank == 1:
            return
        if point.backend not in cls.several_devices:
            runs = ", ".join(cls.several_devices)
            why = f"{cls.name} {point.backend} drives one device per rank"
            yield "devices_per_rank", why, f"1; more with {cls.name} backends {runs}" if runs else "1"
        if not point.layout.plain:
            why = f"{point.layout.label()} splits the model over ranks; several devices per rank replicate it"
            yield "devices_per_rank", why, "1 with this parallel layout, or parallel unset (data parallelism)"

    @classmethod
    def traits_of(cls, backend: str) -> Traits:
        """The traits `backend` declares, with this framework's momentum (the launcher's part,
        `launcher_mpi`, is the worker's to set)."""
        return replace(cls.traits.get(backend, Traits()), momentum=cls.momentum)

    @classmethod
    def launcher_need(cls, point: Point) -> LauncherNeed | None:
        """What the point's backend needs of its launcher (None: any launcher will do)."""
        return cls.launcher_needs.get(point.backend)

    @classmethod
    def check_launcher(
        cls, point: Point, launcher: LauncherKind, launchers: Iterable[LauncherKind]
    ) -> Iterable[Problem]:
        """The problem of starting the point's ranks with `launcher` (the point's), if its
        backend needs what that launcher does not give; the allowed ones are those of
        `launchers` (every registered one) that give it. Called by the planning, which sees
        both."""
        need = cls.launcher_need(point)
        if need is None or need.accepts(launcher):
            return
        allowed = [la.name for la in launchers if need.accepts(la)]
        yield (
            need.field,
            f"{cls.name} {point.backend} needs {need.launchers} ({need.why}): {point.launcher!r} is not one",
            ", ".join(allowed) or "none is registered",
        )

    @classmethod
    def unavailable(cls, backend: str) -> str | None:
        """Why `backend` cannot run in this interpreter (a module that fails to import), or None."""
        return import_error((*cls.requires, *cls.backend_requires.get(backend, ())))

    @abstractmethod
    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        """Initialise the distributed backend. `comm` is the MPI communicator, if any."""

    @staticmethod
    def init_timeout_s() -> float:
        """How long a backend may take to bring its ranks together (`HPCBENCH_INIT_TIMEOUT_S`)."""
        return float(os.environ.get("HPCBENCH_INIT_TIMEOUT_S", INIT_TIMEOUT_S))

    def mpi_ranks(self, point: Point, comm: Comm | None) -> Comm:
        """`comm`, which must be MPI's: the guard of a backend that needs ranks an MPI launcher
        started (planning refuses other launchers; this catches ranks that came up without MPI)."""
        if comm is None or comm.mpi_comm is None:
            need = self.launcher_need(point)
            why = f" ({need.why})" if need is not None else ""
            raise HpcbenchError(
                f"{self.name} {point.backend} needs ranks started by an MPI launcher{why}: "
                f"these ranks, started by {point.launcher!r}, have no MPI"
            )
        return comm

    def bookkeeping_comm(self) -> Comm | None:
        """Collectives for the store when the job has no MPI (e.g. under torchrun)."""
        return None

    @abstractmethod
    def build(self, point: Point) -> None:
        """Model, optimizer and data (`load_data`) for this rank."""

    def load_data(self, point: Point, model: zoo.Model, rank: int, size: int) -> data.Shard:
        """This rank's shard of the point's dataset, shaped for `model`, and its batches (in
        `build`); returns the shard (`prepare_split` applied)."""
        devices, batch = point.devices_per_rank, point.batch_size  # a batch per device (replicas.py)
        shard = replicas.rank_shard(lambda r, n: shard_for(point, model, r, n), rank, size, devices, batch)
        shard = data.Shard(self.prepare_split(shard.train), self.prepare_split(shard.test), shard.classes)
        batches = data.Batches(shard.train, point.rank_batch, point.seed, rank, point.dataset != "synthetic")
        self._data = RankData(shard, batches, point.batch_size, model.task == "classify")
        return shard

    def prepare_split(self, split: data.Split) -> data.Split:
        """A split as this framework's steps read it, made once (default: as loaded, NCHW)."""
        return split

    @property
    def rank_data(self) -> RankData:
        if self._data is None:
            raise HpcbenchError(f"{self.name}: no data before build()")
        return self._data

    @property
    def batches(self) -> data.Batches:
        """The training batches of this rank's shard (after `build`)."""
        return self.rank_data.batches

    @abstractmethod
    def step(self, rec: Recorder) -> Any:
        """One training iteration, marking phase ends on `rec`. Returns the loss (any scalar-like)."""

    def steps_per_epoch(self) -> int:
        """Training iterations in one epoch of this rank's shard (after `build`); 1 without data."""
        return self._data.batches.steps_per_epoch if self._data is not None else 1

    def parameter_checksum(self) -> float:
        """`checksum` of the model's weights (after `build`); NaN if not available."""
        return float("nan")

    def peak_device_memory(self) -> int | None:
        """The most device memory this rank's framework has had allocated so far (its
        allocator's peak), in bytes; None on a CPU or without such a counter."""
        return None

    def evaluate(self) -> Evaluation | None:
        """Test this rank's held-out shard with the current weights, batch by batch
        (`evaluate_batch`, inside `evaluating`; no timing: the worker times the call). None:
        this framework has no data to test (it loaded none)."""
        if self._data is None:
            return None
        test, classifies = self._data.shard.test, self._data.classifies
        correct = total = 0
        loss_sum = 0.0
        with self.evaluating():
            for x, y in data.eval_batches(test, self._data.eval_batch):
                batch_loss, batch_correct = self.evaluate_batch(x, y)
                loss_sum += batch_loss
                if classifies:
                    correct += batch_correct
                    total += len(y)
        return Evaluation(correct, total, loss_sum / max(len(test), 1))

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Around the test pass: the model out of training (no dropout, running statistics)."""
        yield

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """One test batch: (its loss summed over its samples, its correctly classified
        samples; 0 for a model that is not a classifier)."""
        raise NotImplementedError(f"{self.name} loads data but does not evaluate a batch")

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


def transformers_refused(why: str) -> dict[str, str]:
    """`refusals` for a framework that builds none of the zoo's transformers: each with `why`."""
    return {name: why for name in zoo.TRANSFORMER_NAMES}


def cpu_problems(point: Point, name: str, device_why: str) -> Iterable[Problem]:
    """What a framework that runs on the CPU only and has no settings refuses: another device
    (`device_why` says why), any `extra` setting."""
    if point.device != "cpu":
        yield "device", device_why, "cpu"
    yield from no_settings(point, name)


def no_settings(point: Point, name: str) -> Iterable[Problem]:
    """Every `extra` setting: a framework without settings refuses them."""
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


def _check_data(point: Point) -> Iterable[Problem]:
    """The point's dataset, data folder and sequence length against its model."""
    default = zoo.model(point.model)
    reads = "tokens" if default.tokens else "images"
    kind = data.KINDS.get(point.dataset, reads)
    if kind != reads:
        allowed = [name for name in data.NAMES if data.KINDS.get(name, reads) == reads]
        yield "dataset", f"{point.dataset!r} holds {kind}; model {point.model!r} reads {reads}", ", ".join(allowed)
        return
    if point.dataset not in ("synthetic", "text") and not point.data_dir:
        yield "data_dir", f"dataset {point.dataset!r} reads its files from data_dir, which is not set", "a folder"
    if point.seq_len is not None and not default.tokens:
        yield "seq_len", f"model {point.model!r} reads {reads}, not token sequences", "unset"
        return
    try:
        model_for(point)
    except HpcbenchError as exc:
        field = "seq_len" if point.seq_len is not None else "model"
        yield field, str(exc), f"models whose input fits dataset {point.dataset!r}"


def model_for(point: Point) -> zoo.Model:
    """The point's model, shaped for its dataset (synthetic data takes the model's own input)
    and, for a sequence model, the point's `seq_len`."""
    default = zoo.model(point.model)
    shape, classes = data.input_of(point.dataset, default.input, default.classes)
    if default.tokens and point.seq_len is not None:
        shape = (point.seq_len,)
    return zoo.model(point.model, shape, classes)


def shard_for(point: Point, model: zoo.Model, rank: int, size: int) -> data.Shard:
    """This rank's part of the point's dataset, shaped for `model`."""
    args = (model.input, model.classes, point.batch_size, rank, size, point.seed, model.task)
    return data.load(point.dataset, point.data_dir, *args)


FRAMEWORKS: Registry[type[Framework]] = Registry("framework", "hpcbench.frameworks")
