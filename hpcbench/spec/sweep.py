"""Sweep specs: YAML text -> validated, expanded, frozen `Point`s with stable ids.

The spec package is the ground floor: it imports nothing else of hpcbench but the error
types. What is registered higher up (executor, framework, launcher, model and dataset names,
the backends of each framework, each executor's options) reaches it as plain data: a
`Choices` mapping, a point-level check callback and the executors' option parsers, supplied
by the caller (`hpcbench.plan.launch.parse_sweep`).

The public spec format::

    name: quickstart
    executor: local              # a registered executor: local | slurm
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
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from hpcbench.errors import SpecError
from hpcbench.spec.fields import (
    WRITERS,
    Checker,
    Choices,
    OptionsParser,
    _int,
    _one_of,
    _positive_float,
    _text,
    checkers,
)
from hpcbench.spec.point import DEFAULTS, FIELD_NAMES, SYNONYMS, Point


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
    # each executor's options section, validated by that executor: name -> values (the
    # `slurm:` section holds defaults for every point; a point's `slurm` field overrides them)
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profile: str | None = None  # site profile name (shipped in hpcbench/plan/profiles/) or path
    text: str = ""  # the spec as written, recorded in every point file
    origin: Mapping[str, str] = field(default_factory=dict)  # field -> "matrix" | "fixed"
    warnings: tuple[str, ...] = ()


PointCheck = Callable[[Point], Iterable[tuple[str, str, str]]]
"""Returns (field, problem, allowed) for each cross-field problem of one point."""

_TOP_KEYS = ("name", "description", "executor", "profile", "matrix", "fixed", "exclude", "options")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool, type(None))):
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


def load_sweep(
    text: str,
    choices: Choices | None = None,
    check: PointCheck | None = None,
    sections: Mapping[str, OptionsParser] | None = None,
) -> Sweep:
    """Parse, validate and expand a sweep spec. Raises SpecError on the first problem.

    `choices` gives the allowed values of registry-backed fields (executor included),
    `check` the cross-field problems of a point, `sections` each executor's parser of its
    own options section (a top-level key named after the executor, and the per-point
    `slurm` field). The registries above this floor supply all three (`hpcbench.plan`)."""
    raw = parse_yaml(text)
    sections = sections or {}
    top_keys = (*_TOP_KEYS, *sorted(sections))
    if not isinstance(raw, Mapping):
        raise SpecError("spec", "is not a mapping", "a YAML mapping with keys " + ", ".join(top_keys))
    _no_unknown(raw, top_keys, "")
    fields = checkers(choices or {}, sections)
    name = _name(raw)
    executor_choices = (choices or {}).get("executor")
    executor = (_one_of(tuple(executor_choices)) if executor_choices else _text)(
        "executor", raw.get("executor", "local")
    )
    _only_with_own_executor(raw, executor, sections, {})
    parsed = {key: parse(key, raw.get(key)) for key, parse in sections.items() if raw.get(key) is not None}
    profile = None if raw.get("profile") is None else _text("profile", raw["profile"])

    axes, values, origin, groups = _axes(raw, fields)
    _only_with_own_executor(raw, executor, sections, origin)
    excludes = _excludes(raw.get("exclude") if raw.get("exclude") is not None else [], fields)
    options = _options(raw.get("options") if raw.get("options") is not None else {})
    gpus = origin.get("ranks_per_node", "")  # where gpus_per_node was given, if it was
    points, used = _expand(axes, values, groups, excludes, gpus if gpus.endswith("gpus_per_node") else None)
    if check is not None:
        _check_points(points, check, origin)
    warnings = tuple(f"exclude[{i}] matches no point" for i, u in enumerate(used) if not u)
    return Sweep(name, executor, tuple(points), options, parsed, profile, text, origin, warnings)


# Point fields that hold one executor's per-point options: field name = executor name.
EXECUTOR_FIELDS = ("slurm",)


def _only_with_own_executor(
    raw: Mapping[str, Any], executor: str, sections: Mapping[str, OptionsParser], origin: Mapping[str, str]
) -> None:
    """An executor's options (its top-level section, or the point field named after it) are
    refused under another executor: they would not be used, and the point field would change
    the point ids."""
    for name in sorted({*sections, *EXECUTOR_FIELDS}):
        if name == executor:
            continue
        where = name if raw.get(name) is not None and name in sections else origin.get(name)
        if where is not None:
            raise SpecError(
                where,
                f"{name} options are for executor {name}, and this sweep's executor is {executor}",
                f"{name} options only with executor: {name}; remove them, or set executor: {name}",
            )


def _name(raw: Mapping[str, Any]) -> str:
    name = _text("name", raw.get("name"))
    if len(name) > 200:
        raise SpecError("name", "is longer than 200 characters", "a name of at most 200 characters")
    if "description" in raw and not isinstance(raw["description"], str):
        raise SpecError("description", "is not a string", "text")
    return name


Axes = tuple[dict[str, list[Any]], dict[str, Any], dict[str, str], set[str]]


def _axes(raw: Mapping[str, Any], fields: Mapping[str, Checker]) -> Axes:
    """The matrix axes, the fixed values, where each field was set, and the grouped axes
    (each value of a grouped axis sets several fields together)."""
    axes: dict[str, list[Any]] = {}
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    groups: set[str] = set()
    for section_name in ("matrix", "fixed"):
        for key, value in _section(raw, section_name).items():
            path = f"{section_name}.{key}"
            if section_name == "matrix" and _is_group(key, value):
                axes[key] = _group_values(path, value, fields, origin)
                groups.add(key)
                continue
            canonical = _field_name(path, key)
            if canonical in origin:
                raise SpecError(path, f"{canonical} is given twice (also in {origin[canonical]})", "each field once")
            origin[canonical] = path
            if section_name == "matrix":
                axes[canonical] = _axis_values(path, value, fields[canonical])
            else:
                values[canonical] = fields[canonical](path, value)
    return axes, values, origin, groups


def _expand(
    axes: Mapping[str, list[Any]],
    values: Mapping[str, Any],
    groups: set[str],
    excludes: list[dict[str, Any]],
    gpus: str | None = None,
) -> tuple[list[Point], list[bool]]:
    """The cartesian product of the axes less the excluded points; which excludes matched.
    `gpus`: where the spec gave `gpus_per_node`, the devices of a node (ranks_per_node *
    devices_per_rank), which becomes the point's ranks per node (excludes match it as given)."""
    names = list(axes)
    points: list[Point] = []
    used = [False] * len(excludes)
    for combo in itertools.product(*(axes[n] for n in names)):
        fields = dict(values)
        for i, axis in enumerate(names):  # not zip(strict=): the Caffe environment's ranks run Python 3.9
            value = combo[i]
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
            if gpus is not None:
                fields["ranks_per_node"] = _ranks_per_node(gpus, fields)
            points.append(Point(**fields))
    if not points:
        raise SpecError("exclude", "drops every point of the sweep", "a sweep with at least one point")
    return points, used


def _ranks_per_node(path: str, fields: Mapping[str, Any]) -> int:
    """A node's ranks, from its devices (`gpus_per_node`, at `path`) and each rank's devices."""
    devices, per_rank = fields.get("ranks_per_node", DEFAULTS.ranks_per_node), fields.get("devices_per_rank", 1)
    if devices % per_rank:
        raise SpecError(
            path,
            f"{devices} devices a node do not split into ranks of devices_per_rank {per_rank}",
            "gpus_per_node a multiple of devices_per_rank (gpus_per_node = ranks_per_node * devices_per_rank)",
        )
    return int(devices // per_rank)


def _check_points(points: Iterable[Point], check: PointCheck, origin: Mapping[str, str]) -> None:
    for p in points:
        for fname, problem, allowed in check(p):
            where = origin.get(fname, f"{fname} (default)")
            raise SpecError(where, f"{problem} [point {p.id}: {p.label()}]", allowed)


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
    path: str, value: list[Mapping[str, Any]], checkers: Mapping[str, Checker], origin: dict[str, str]
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


def _excludes(raw: Any, checkers: Mapping[str, Checker]) -> list[dict[str, Any]]:
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
