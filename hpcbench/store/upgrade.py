"""Older point files brought to the current shape, once, as they are read.

The reader (store/reader.py) hands every file it reads to `upgrade`, so what it returns has
the current schema's shape whatever schema the file was written with, and nothing after it
asks which version a file is or whether a column is there:

- every table (`/comm`, `/resources`, `/eval`, `/energy`) is there, empty in a file written before it
  existed, and every table and `/iterations` has exactly the current dtype: a column the
  file's schema did not have holds its type's *unknown* value (`unknown`: NaN for floats,
  -1 for integers, the empty string for text), the value the sampler writes for a source it
  could not read, so a consumer treats the two alike;
- the provenance keys the analysis needs and that older writers did not record are filled
  the way the analysis guessed them for such files (`recorded_later`): `comm_end` and
  `traits`.

One function per schema step, `STEPS[v]` taking a file of schema v - 1 to v (the history is
in store/schema.py and docs/point-file.md); `upgrade` runs the steps after the file's own
version in order, then `recorded_later`, then gives every array its current dtype (`Damaged`
names a column a file lacks that no step accounts for). The root attributes stay as written:
`schema_version` still says the schema the file was written with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.traits import legacy


class Damaged(ValueError):
    """A file that lacks a part or column which no schema step accounts for."""


@dataclass
class Parts:
    """What the reader read of one file, upgraded in place. A table is None where the file has
    no such dataset."""

    version: int  # the schema the file was written with (its root attribute schema_version)
    point: Point
    provenance: dict[str, Any]  # JSON decoded
    iterations: np.ndarray  # (n_ranks, iterations_written)
    comm: np.ndarray | None
    resources: np.ndarray | None
    eval: np.ndarray | None
    energy: np.ndarray | None = None


def unknown(dtype: np.dtype[Any]) -> Any:
    """The value that means "not measured" in a column of type `dtype`: NaN for a float, -1 for
    an integer (the sampler's conventions, docs/point-file.md), the empty string for text."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "i":
        return -1
    if dtype.kind in "SU":
        return dtype.type()
    raise TypeError(f"no unknown value for a column of type {dtype}")


def with_columns(rows: np.ndarray, target: np.dtype[Any], names: Iterable[str]) -> np.ndarray:
    """`rows` with each of the columns `names` that it lacks added, typed as in `target` and
    holding `unknown` in every row (columns it has are kept as they are)."""
    have = rows.dtype.names or ()
    added = [name for name in names if name not in have]
    if not added:
        return rows
    fields = [(name, rows.dtype[name]) for name in have] + [(name, target[name]) for name in added]
    out = np.empty(rows.shape, dtype=np.dtype(fields))
    for name in have:
        out[name] = rows[name]
    for name in added:
        out[name] = unknown(target[name])
    return out


def _retyped(rows: np.ndarray, name: str, dtype: np.dtype[Any]) -> np.ndarray:
    """`rows` with the column `name` cast to `dtype` (where it has that column)."""
    if name not in (rows.dtype.names or ()) or rows.dtype[name] == dtype:
        return rows
    fields = [(n, dtype if n == name else rows.dtype[n]) for n in rows.dtype.names or ()]
    out = np.empty(rows.shape, dtype=np.dtype(fields))
    for n in rows.dtype.names or ():
        out[n] = rows[n]
    return out


def _empty(dtype: np.dtype[Any]) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


# ---------------------------------------------------------------------------------------
# The steps: STEPS[v] takes a file of schema v - 1 to schema v.


def to_2(parts: Parts) -> None:
    """Schema 2 added the `/comm` and `/resources` tables: a version-1 file has neither, and reads
    with both empty. `iterations.warmup` became uint8 0/1: version 1 wrote a numpy bool (an HDF5
    enum), cast here."""
    parts.iterations = _retyped(parts.iterations, "warmup", schema.ITERATION_DTYPE["warmup"])
    if parts.comm is None:
        parts.comm = _empty(schema.COMM_DTYPE)
    if parts.resources is None:
        parts.resources = _empty(schema.RESOURCE_DTYPE)


def to_3(parts: Parts) -> None:
    """Schema 3 added the `/eval` table: an older file reads with it empty."""
    if parts.eval is None:
        parts.eval = _empty(schema.EVAL_DTYPE)


def to_4(parts: Parts) -> None:
    """Schema 4 added the status `stopped` and its root attribute `stop_reason`: no older file was
    stopped, so nothing is missing. The layout did not change."""


def _resources_with(parts: Parts, names: Iterable[str]) -> None:
    if parts.resources is not None:
        parts.resources = with_columns(parts.resources, schema.RESOURCE_DTYPE, names)


def to_5(parts: Parts) -> None:
    """Schema 5 added the `/resources` columns `sched_run_ns`, `sched_wait_ns`, `main_run_ns` and
    `main_wait_ns` (schema.SCHED_COLUMNS): -1 in every sample of an older file, as where the
    kernel has no schedstat. (Its samples at the timed window's edges are not there either.)"""
    _resources_with(parts, schema.SCHED_COLUMNS)


def to_6(parts: Parts) -> None:
    """Schema 6 added the `/resources` columns `cpu_steal` (NaN in an older file) and
    `child_run_ns` (-1: the descendants were not read, and the analysis counts them among the
    other processes, resources.py)."""
    _resources_with(parts, ("cpu_steal", schema.CHILD_RUN))


def to_7(parts: Parts) -> None:
    """Schema 7 added the `/resources` column `work_wait`: NaN in an older file, as in a sample
    that did not read the threads."""
    _resources_with(parts, (schema.WORK_WAIT,))


def to_8(parts: Parts) -> None:
    """Schema 8 added the `/eval` columns `peak_device_bytes` and `peak_host_bytes` (-1, not
    measured, in an older file) and the `/energy` table (empty in an older file: nothing was
    read)."""
    if parts.eval is not None:
        parts.eval = with_columns(parts.eval, schema.EVAL_DTYPE, ("peak_device_bytes", "peak_host_bytes"))
    if parts.energy is None:
        parts.energy = _empty(schema.ENERGY_DTYPE)


def to_9(parts: Parts) -> None:
    """Schema 9 added the `/comm` column `axis`: "dp" in an older file, whose every message
    was a data-parallel one (a gradient's all-reduce, a parameter server's push or pull)."""
    if parts.comm is not None and "axis" not in (parts.comm.dtype.names or ()):
        parts.comm = with_columns(parts.comm, schema.COMM_DTYPE, ("axis",))
        parts.comm["axis"] = b"dp"


STEPS: dict[int, Callable[[Parts], None]] = {
    2: to_2,
    3: to_3,
    4: to_4,
    5: to_5,
    6: to_6,
    7: to_7,
    8: to_8,
    9: to_9,
}
assert sorted(STEPS) == list(range(2, schema.SCHEMA_VERSION + 1)), "a step for every schema version"


# ---------------------------------------------------------------------------------------
# Provenance recorded later than some files were written, whatever their version


# Files written before `comm_end` was recorded (during schema 6, without a version bump): the
# exchanges that saw their messages' ends in a wait after backward then (provenance key, value).
WAITED_BEFORE_COMM_END = (("torch_exchange", "mpi"), ("torch_exchange", "horovod"), ("jax_exchange", "pmean"))


def recorded_later(parts: Parts) -> None:
    """Fill the provenance keys that the analysis needs and some files lack:

    - `comm_end` (recorded since schema 6): `wait` for the exchanges that saw their ends in a
      wait then (WAITED_BEFORE_COMM_END, by the framework's recorded exchange), else
      `completion`;
    - `traits` (store/traits.py): the traits the built-in backend of the point's name had when
      such files were written (`legacy`), as a mapping like a recorded one.
    """
    prov = parts.provenance
    if prov.get("comm_end") is None:
        waited = any(prov.get(key) == value for key, value in WAITED_BEFORE_COMM_END)
        prov["comm_end"] = schema.COMM_END_WAIT if waited else schema.COMM_END_COMPLETION
    if not isinstance(prov.get("traits"), dict):
        point = parts.point
        prov["traits"] = asdict(legacy(point.framework, point.backend, point.launcher))


# ---------------------------------------------------------------------------------------


def _current(rows: np.ndarray, dtype: np.dtype[Any], what: str) -> np.ndarray:
    """`rows` with exactly `dtype` (its columns in its order and types); Damaged if a column is
    missing."""
    if rows.dtype == dtype:
        return rows
    missing = [name for name in dtype.names or () if name not in (rows.dtype.names or ())]
    if missing:
        raise Damaged(f"{what} lack the fields {', '.join(missing)}")
    out = np.empty(rows.shape, dtype=dtype)
    for name in dtype.names or ():
        out[name] = rows[name]
    return out


def upgrade(parts: Parts) -> dict[str, np.ndarray]:
    """Bring `parts`, read from a file of schema `parts.version` (at most the current one), to
    the current shape: every step after its version, then `recorded_later` (its provenance is
    filled in place). Returns the arrays by name (schema.ITERATIONS and every schema.TABLES
    name), each with exactly its current dtype; a file of the current schema without a table
    reads it empty."""
    for version in range(max(parts.version, 1) + 1, schema.SCHEMA_VERSION + 1):
        STEPS[version](parts)
    recorded_later(parts)
    arrays = {schema.ITERATIONS: _current(parts.iterations, schema.ITERATION_DTYPE, schema.ITERATIONS)}
    for name, dtype in schema.TABLES.items():
        rows = getattr(parts, name)
        arrays[name] = _current(rows if rows is not None else _empty(dtype), dtype, name)
    return arrays


def table(name: str, rows: np.ndarray, version: int) -> np.ndarray:
    """The table `name` (schema.COMM, RESOURCES, EVAL or ENERGY) of a file of schema `version` whose
    rows are `rows`, as the reader gives it: for arrays built outside a file (tests)."""
    if name not in schema.TABLES:
        raise ValueError(f"no table {name!r} (tables: {', '.join(schema.TABLES)})")
    parts = Parts(version, Point(), {}, np.zeros((0, 0), schema.ITERATION_DTYPE), None, None, None)
    setattr(parts, name, rows)
    return upgrade(parts)[name]
