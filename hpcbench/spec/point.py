"""The `Point`: one configuration of a sweep, frozen, with a stable id.

Ground floor: imports nothing of hpcbench but the error types.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcbench.errors import SpecError
from hpcbench.spec.parallel import Layout, layout_of

if TYPE_CHECKING:
    from typing import TypeAlias

# A string: `X | Y` of classes is evaluated here, which Python 3.9 (the Caffe environment's ranks) cannot do.
Scalar: TypeAlias = "str | int | float | bool"
# Synonyms accepted in specs, mapped to the canonical field name.
SYNONYMS = {"gpus_per_node": "ranks_per_node"}


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep.

    Its `id` hashes every field that is set. Rule for fields added later: they must default
    to None or to an empty tuple (meaning "unset"), so that the ids of existing sweeps stay
    the same and a re-run still finds what is done; or their default is listed in
    `ID_OMITS`, left out of the id where a point has it (`devices_per_rank: 1`).
    """

    framework: str = "torch"
    backend: str = "gloo"
    launcher: str = "mpirun"
    nodes: int = 1
    ranks_per_node: int = 1  # with device: cuda, one GPU per rank
    device: str = "cpu"
    model: str = "lenet"
    dataset: str = "synthetic"
    data_dir: str | None = None
    batch_size: int = 32  # per device: per rank, times devices_per_rank (a rank of several devices)
    iterations: int = 100  # timed iterations, after the warm-up ones
    warmup: int = 10
    optimizer: str = "sgd"
    lr: float = 0.01
    seed: int = 0
    threads: int | None = None  # intra-op / BLAS threads per rank; None: cores / ranks per node
    env: str | None = None  # named environment (envs/); None: the interpreter running the sweep
    environ: tuple[tuple[str, str], ...] = ()  # extra environment variables for every rank
    extra: tuple[tuple[str, Scalar], ...] = ()  # site- or framework-specific options
    slurm: tuple[tuple[str, Any], ...] = ()  # per-point Slurm option overrides (slurm_options)
    epochs: int | None = None  # train for whole epochs of the dataset instead of `iterations`
    seq_len: int | None = None  # tokens per sample of a sequence model; None: the model's own
    precision: str | None = None  # fp32 | tf32 | bf16 | fp16 (mixed precision); None: fp32
    compile: str | None = None  # the framework's compiler and its mode (torch: default, ...); None: eager
    # how the model and data split over the ranks (spec/parallel.py): sorted (key, value)
    # pairs of dp, fsdp, tp, pp, zero, microbatches, schedule; (): plain data parallelism
    parallel: tuple[tuple[str, Any], ...] = ()
    # devices one rank drives through its framework's own replication (batch_size is per
    # device: a rank processes batch_size * devices_per_rank samples per iteration)
    devices_per_rank: int = 1
    # a cap on each rank's memory, GiB (rank/memory.py: RLIMIT_DATA on a CPU, PyTorch's
    # per-process fraction of a GPU); past it the point is recorded out_of_memory. None: no cap
    memory_limit_gb: float | None = None

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def layout(self) -> Layout:
        """How the model and data split over the ranks (plain data parallelism without `parallel`)."""
        return layout_of(self.parallel, self.ranks) if self.parallel else Layout(dp=self.ranks)

    @property
    def data_ranks(self) -> int:
        """Ranks that read different data (each `rank_batch` samples per iteration: a batch of
        `batch_size` per device it drives)."""
        return self.layout.data_ranks if self.parallel else self.ranks

    @property
    def rank_batch(self) -> int:
        """Samples one rank processes per iteration: a batch of `batch_size` per device it drives."""
        return self.batch_size * self.devices_per_rank

    @property
    def total_iterations(self) -> int:
        """Iterations run, warm-up included (with `epochs`, see `iterations_for`)."""
        return self.warmup + self.iterations

    def iterations_for(self, steps_per_epoch: int) -> int:
        """Iterations run, warm-up included, once the dataset's steps per epoch are known."""
        return self.warmup + (self.epochs * steps_per_epoch if self.epochs else self.iterations)

    @functools.cached_property
    def id(self) -> str:
        """Hashed once per object (kept in its __dict__: the fields are frozen, and
        dataclasses.replace makes a new object)."""
        return point_id(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready fields (mappings for `environ` and `extra`)."""
        d = dataclasses.asdict(self)
        d["environ"] = dict(self.environ)
        d["extra"] = dict(self.extra)
        d["slurm"] = thaw(self.slurm)
        d["parallel"] = dict(self.parallel)
        return d

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Point:
        unknown = set(d) - FIELD_NAMES
        if unknown:
            raise SpecError("point", f"unknown fields {sorted(unknown)}", ", ".join(sorted(FIELD_NAMES)))
        values = dict(d)
        values["environ"] = _sorted_items(values.get("environ") or {})
        values["extra"] = _sorted_items(values.get("extra") or {})
        values["slurm"] = freeze("point.slurm", values.get("slurm") or {})
        values["parallel"] = _sorted_items(values.get("parallel") or {})
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Point:
        return cls.from_dict(json.loads(text))

    def label(self) -> str:
        """A short human label: the fields most sweeps vary (and the layout, where one is set)."""
        label = f"{self.framework}/{self.backend} {self.model} {self.nodes}x{self.ranks_per_node} b={self.batch_size}"
        if self.devices_per_rank > 1:
            label += f" {self.devices_per_rank} dev/rank"
        return f"{label} {self.layout.label()}" if self.parallel else label


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Point))
DEFAULTS = Point()
# Fields added with a default other than None or (): left out of the id at that default, so
# the ids of the points written before them stay what they were.
ID_OMITS: Mapping[str, Any] = {"devices_per_rank": 1}


def point_id(fields: Mapping[str, Any]) -> str:
    """Stable id: sha256 of the canonical JSON of the fields that are set (12 hex digits)."""
    canonical = {
        k: v
        for k, v in sorted(fields.items())
        if v is not None and v != () and v != {} and not (k in ID_OMITS and v == ID_OMITS[k])
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _sorted_items(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(mapping.items()))


def freeze(path: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """An executor-options mapping in the frozen point form: sorted (key, value) pairs, a
    nested mapping as pairs too, a list as a tuple. The executor that owns the options
    validates them (see `Sweep.sections`); this only fixes their shape."""
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping of option names to values")
    return tuple(sorted((str(k), _freeze_value(v)) for k, v in value.items()))


def _freeze_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze_value(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_value(v) for v in value)
    return value


def thaw(items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The inverse of `freeze`, in JSON's form: pairs back to mappings, tuples to lists."""
    return {k: _thaw_value(v) for k, v in items}


def _thaw_value(value: Any) -> Any:
    if isinstance(value, tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
            return {k: _thaw_value(v) for k, v in value}
        if not value:
            return {}
        return [_thaw_value(v) for v in value]
    return value
