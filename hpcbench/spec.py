"""Sweep specs: YAML text -> validated, expanded, frozen `Point`s with stable ids.

This module is the ground floor: it imports nothing else of hpcbench but the error types.
What is registered higher up (framework, launcher, model and dataset names, the backends of
each framework) reaches it as plain data: a `Choices` mapping and a point-level check
callback supplied by the caller.

The public spec format::

    name: quickstart
    executor: local              # local | slurm
    matrix:                      # cartesian product of these lists
      ranks_per_node: [1, 2, 4]
      model: [lenet]
    fixed:                       # same value for every point
      batch_size: 32
    exclude:                     # partial points to drop
      - {ranks_per_node: 4, model: mlp}
    options:                     # how to run, not what is measured (not part of point ids)
      writer: auto

Any point field may sit in `matrix` or in `fixed`; unknown keys are errors. A matrix entry
that is not a field name and lists mappings is a grouped axis: each entry sets its fields
together (framework and backend pairs, say)::

    matrix:
      stack:
        - {framework: torch, backend: gloo}
        - {framework: tensorflow, backend: multiworker, env: modern}
      ranks_per_node: [1, 2]
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from hpcbench import slurm_options
from hpcbench.errors import SpecError

Scalar = str | int | float | bool

DEVICES = ("cpu", "cuda")
OPTIMIZERS = ("sgd", "momentum", "adam")
EXECUTORS = ("local", "slurm")
WRITERS = ("auto", "mpio", "gather")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Synonyms accepted in specs, mapped to the canonical field name.
SYNONYMS = {"gpus_per_node": "ranks_per_node"}


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep.

    Its `id` hashes every field that is set. Rule for fields added later: they must default
    to None or to an empty tuple (meaning "unset"), so that the ids of existing sweeps stay
    the same and a re-run still finds what is done.
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
    batch_size: int = 32  # per rank
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

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def total_iterations(self) -> int:
        """Iterations run, warm-up included (with `epochs`, see `iterations_for`)."""
        return self.warmup + self.iterations

    def iterations_for(self, steps_per_epoch: int) -> int:
        """Iterations run, warm-up included, once the dataset's steps per epoch are known."""
        return self.warmup + (self.epochs * steps_per_epoch if self.epochs else self.iterations)

    @property
    def id(self) -> str:
        return point_id(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready fields (mappings for `environ` and `extra`)."""
        d = dataclasses.asdict(self)
        d["environ"] = dict(self.environ)
        d["extra"] = dict(self.extra)
        d["slurm"] = slurm_options.to_raw(dict(self.slurm))
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
        values["slurm"] = slurm_options.as_items("point.slurm", values.get("slurm") or {})
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Point:
        return cls.from_dict(json.loads(text))

    def label(self) -> str:
        """A short human label: the fields most sweeps vary."""
        return f"{self.framework}/{self.backend} {self.model} {self.nodes}x{self.ranks_per_node} b={self.batch_size}"


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Point))
DEFAULTS = Point()


def point_id(fields: Mapping[str, Any]) -> str:
    """Stable id: sha256 of the canonical JSON of the fields that are set (12 hex digits)."""
    canonical = {k: v for k, v in sorted(fields.items()) if v is not None and v != () and v != {}}
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _sorted_items(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(mapping.items()))


# --------------------------------------------------------------------------------------
# Field validation. Each checker takes (path, value) and returns the canonical value or
# raises SpecError naming the path, the value and what is allowed.


def _int(minimum: int) -> Callable[[str, Any], int]:
    def check(path: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"{value!r} is not an integer", f"integers >= {minimum}")
        if value < minimum:
            raise SpecError(path, f"{value} is too small", f"integers >= {minimum}")
        return value

    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def optional(path: str, value: Any) -> Any:
        return None if value is None else check(path, value)

    return optional


def _positive_float(path: str, value: Any) -> float:
    allowed = "a positive finite number, e.g. 0.01 or 1.0e-3"
    if isinstance(value, bool):
        raise SpecError(path, f"{value!r} is not a number", allowed)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(path, f"{value!r} is not a number", allowed) from None
    if not math.isfinite(number) or number <= 0:
        raise SpecError(path, f"{value!r} is out of range", allowed)
    return number


def _text(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(path, f"{value!r} is not a non-empty string", "a non-empty string")
    if "\0" in value:
        raise SpecError(path, "contains a NUL character", "a string without NUL")
    return value


def _one_of(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def check(path: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise SpecError(path, f"{value!r} is not known", ", ".join(choices) or "none defined yet")
        return value

    return check


def environ_items(path: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping NAME: value")
    items = []
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError(f"{path}.{name}", "is not a valid environment variable name", "[A-Za-z_][A-Za-z0-9_]*")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise SpecError(f"{path}.{name}", f"{v!r} is not a string or number", "a string or a number")
        text = str(v)
        if "\0" in text:
            raise SpecError(f"{path}.{name}", "contains a NUL character", "a string without NUL")
        items.append((name, text))
    return tuple(sorted(items))


def _extra(path: str, value: Any) -> tuple[tuple[str, Scalar], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", "a mapping key: scalar")
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise SpecError(f"{path}.{key}", "key is not a non-empty string", "string keys")
        if not isinstance(v, str | int | float | bool):
            raise SpecError(f"{path}.{key}", f"{v!r} is not a scalar", "strings, numbers, booleans")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{path}.{key}", f"{v!r} is not finite", "finite numbers")
        if isinstance(v, str) and "\0" in v:
            raise SpecError(f"{path}.{key}", "contains a NUL character", "a string without NUL")
    return _sorted_items(value)


Choices = Mapping[str, Sequence[str]]
"""Allowed values for registry-backed fields (framework, launcher, model, dataset, env)."""


def _checkers(choices: Choices) -> dict[str, Callable[[str, Any], Any]]:
    def choice(name: str) -> Callable[[str, Any], Any]:
        return _one_of(tuple(choices[name])) if name in choices else _text

    return {
        "framework": choice("framework"),
        "backend": _text,  # checked per framework, once points exist
        "launcher": choice("launcher"),
        "nodes": _int(1),
        "ranks_per_node": _int(1),
        "device": _one_of(DEVICES),
        "model": choice("model"),
        "dataset": choice("dataset"),
        "data_dir": _optional(_text),
        "batch_size": _int(1),
        "iterations": _int(1),
        "warmup": _int(0),
        "optimizer": _one_of(OPTIMIZERS),
        "lr": _positive_float,
        "seed": _int(0),
        "threads": _optional(_int(1)),
        "env": _optional(choice("env")),
        "environ": environ_items,
        "extra": _extra,
        "slurm": slurm_options.as_items,
        "epochs": _optional(_int(1)),
    }


# --------------------------------------------------------------------------------------
# The sweep.


@dataclass(frozen=True)
class Options:
    """How points are run; not part of what is measured, so not part of point ids."""

    writer: str = "auto"  # auto | mpio | gather
    flush_every: int = 1000  # iterations buffered per rank between writes to the HDF5 file
    timeout_s: float | None = None  # per point, wall clock; None: no limit
    sample_period_s: float = 1.0  # resource sampler period (CPU, memory, GPU, InfiniBand)
    stall_timeout_s: float | None = 600.0  # fail the point when a rank finishes no iteration for this long


@dataclass(frozen=True)
class Sweep:
    name: str
    executor: str
    points: tuple[Point, ...]
    options: Options = Options()
    slurm: Mapping[str, Any] = field(default_factory=dict)  # defaults for every point (slurm_options)
    profile: str | None = None  # site profile name (slurm/profiles/NAME.yaml) or path
    text: str = ""  # the spec as written, recorded in every point file
    origin: Mapping[str, str] = field(default_factory=dict)  # field -> "matrix" | "fixed"
    warnings: tuple[str, ...] = ()


PointCheck = Callable[[Point], Iterable[tuple[str, str, str]]]
"""Returns (field, problem, allowed) for each cross-field problem of one point."""

_TOP_KEYS = ("name", "description", "executor", "profile", "slurm", "matrix", "fixed", "exclude", "options")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str | int | float | bool | None):
            raise SpecError(f"line {key_node.start_mark.line + 1}", f"key {key!r} is not a scalar", "scalar keys")
        if key in mapping:
            raise SpecError(
                f"line {key_node.start_mark.line + 1}", f"duplicate key {key!r}", "each key once per mapping"
            )
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "spec"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(where, f"is not valid YAML: {problem}") from None


def load_sweep(text: str, choices: Choices | None = None, check: PointCheck | None = None) -> Sweep:
    """Parse, validate and expand a sweep spec. Raises SpecError on the first problem."""
    raw = parse_yaml(text)
    if not isinstance(raw, Mapping):
        raise SpecError("spec", "is not a mapping", "a YAML mapping with keys " + ", ".join(_TOP_KEYS))
    _no_unknown(raw, _TOP_KEYS, "")
    checkers = _checkers(choices or {})

    name = _text("name", raw.get("name"))
    if len(name) > 200:
        raise SpecError("name", "is longer than 200 characters", "a name of at most 200 characters")
    if "description" in raw and not isinstance(raw["description"], str):
        raise SpecError("description", "is not a string", "text")
    executor = _one_of(EXECUTORS)("executor", raw.get("executor", "local"))
    slurm = slurm_options.parse("slurm", raw.get("slurm"))
    profile = None if raw.get("profile") is None else _text("profile", raw["profile"])

    matrix = _section(raw, "matrix")
    fixed = _section(raw, "fixed")
    axes: dict[str, list[Any]] = {}
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    groups: set[str] = set()  # grouped axes: each value sets several fields together
    for section_name, section in (("matrix", matrix), ("fixed", fixed)):
        for key, value in section.items():
            path = f"{section_name}.{key}"
            if section_name == "matrix" and _is_group(key, value):
                axes[key] = _group_values(path, value, checkers, origin)
                groups.add(key)
                continue
            canonical = _field_name(path, key)
            if canonical in origin:
                raise SpecError(path, f"{canonical} is given twice (also in {origin[canonical]})", "each field once")
            origin[canonical] = path
            if section_name == "matrix":
                axes[canonical] = _axis_values(path, value, checkers[canonical])
            else:
                values[canonical] = checkers[canonical](path, value)

    excludes = _excludes(raw.get("exclude") if raw.get("exclude") is not None else [], checkers)
    options = _options(raw.get("options") if raw.get("options") is not None else {})

    names = list(axes)
    points: list[Point] = []
    used = [False] * len(excludes)
    for combo in itertools.product(*(axes[n] for n in names)):
        fields = dict(values)
        for axis, value in zip(names, combo, strict=True):
            if axis in groups:
                fields.update(value)
            else:
                fields[axis] = value
        hit = [
            i for i, ex in enumerate(excludes) if all(fields.get(k, getattr(DEFAULTS, k)) == v for k, v in ex.items())
        ]
        for i in hit:
            used[i] = True
        if not hit:
            points.append(Point(**fields))
    if not points:
        raise SpecError("exclude", "drops every point of the sweep", "a sweep with at least one point")

    if check is not None:
        for p in points:
            for fname, problem, allowed in check(p):
                where = origin.get(fname, f"{fname} (default)")
                raise SpecError(where, f"{problem} [point {p.id}: {p.label()}]", allowed)

    warnings = tuple(f"exclude[{i}] matches no point" for i, u in enumerate(used) if not u)
    return Sweep(name, executor, tuple(points), options, slurm, profile, text, origin, warnings)


def _no_unknown(mapping: Mapping[Any, Any], allowed: Sequence[str], path: str) -> None:
    for key in mapping:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise SpecError(where, "unknown key", ", ".join(allowed))


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = raw.get(name)
    if section is None:  # `matrix:` with nothing under it
        return {}
    if not isinstance(section, Mapping):
        raise SpecError(name, "is not a mapping", "a mapping of point fields")
    return section


def _field_name(path: str, key: Any) -> str:
    canonical = SYNONYMS.get(key, key) if isinstance(key, str) else key
    if canonical not in FIELD_NAMES:
        raise SpecError(path, "unknown field", ", ".join(sorted(FIELD_NAMES | set(SYNONYMS))))
    return str(canonical)


def _axis_values(path: str, value: Any, check: Callable[[str, Any], Any]) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise SpecError(path, f"{value!r} is not a non-empty list", "a non-empty list of values")
    out: list[Any] = []
    for i, item in enumerate(value):
        v = check(f"{path}[{i}]", item)
        if v in out:
            raise SpecError(f"{path}[{i}]", f"{item!r} is listed twice", "distinct values")
        out.append(v)
    return out


def _is_group(key: Any, value: Any) -> bool:
    """A matrix entry that is not a point field and lists mappings: a grouped axis."""
    canonical = SYNONYMS.get(key, key) if isinstance(key, str) else key
    return (
        canonical not in FIELD_NAMES
        and isinstance(value, list)
        and bool(value)
        and all(isinstance(v, Mapping) for v in value)
    )


def _group_values(
    path: str, value: list[Mapping[str, Any]], checkers: Mapping[str, Callable[[str, Any], Any]], origin: dict[str, str]
) -> list[dict[str, Any]]:
    """The entries of a grouped axis (e.g. `stack: [{framework: torch, backend: gloo}, ...]`),
    each a mapping of point fields set together; its fields may not be set anywhere else."""
    out: list[dict[str, Any]] = []
    mine: set[str] = set()
    for i, entry in enumerate(value):
        if not entry:
            raise SpecError(f"{path}[{i}]", "is an empty mapping", "a mapping of point fields to values")
        fields = {}
        for key, v in entry.items():
            where = f"{path}[{i}].{key}"
            canonical = _field_name(where, key)
            if canonical in origin and canonical not in mine:
                raise SpecError(where, f"{canonical} is given twice (also in {origin[canonical]})", "each field once")
            origin.setdefault(canonical, where)
            mine.add(canonical)
            fields[canonical] = checkers[canonical](where, v)
        if fields in out:
            raise SpecError(f"{path}[{i}]", "is listed twice", "distinct entries")
        out.append(fields)
    return out


def _excludes(raw: Any, checkers: Mapping[str, Callable[[str, Any], Any]]) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise SpecError("exclude", "is not a list", "a list of partial points")
    out = []
    for i, entry in enumerate(raw):
        path = f"exclude[{i}]"
        if not isinstance(entry, Mapping) or not entry:
            raise SpecError(path, "is not a non-empty mapping", "a mapping of point fields to values")
        partial = {}
        for key, value in entry.items():
            canonical = _field_name(f"{path}.{key}", key)
            partial[canonical] = checkers[canonical](f"{path}.{key}", value)
        out.append(partial)
    return out


def _options(raw: Any) -> Options:
    if not isinstance(raw, Mapping):
        raise SpecError("options", "is not a mapping", "a mapping")
    _no_unknown(raw, [f.name for f in dataclasses.fields(Options)], "options")
    writer = _one_of(WRITERS)("options.writer", raw.get("writer", "auto"))
    flush_every = _int(1)("options.flush_every", raw.get("flush_every", Options.flush_every))
    timeout = raw.get("timeout_s")
    timeout_s = None if timeout is None else _positive_float("options.timeout_s", timeout)
    period = _positive_float("options.sample_period_s", raw.get("sample_period_s", Options.sample_period_s))
    stall = raw.get("stall_timeout_s", Options.stall_timeout_s)
    stall_timeout_s = None if stall is None else _positive_float("options.stall_timeout_s", stall)
    return Options(writer, flush_every, timeout_s, period, stall_timeout_s)
