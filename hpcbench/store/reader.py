"""Reading point files back. Needs h5py and numpy only (no MPI, no framework).

A file of any schema up to the current one reads in the current shape: `read_point` hands
what it read to store/upgrade.py, which fills what older schemas did not write (absent
tables empty, absent columns unknown, the provenance the analysis needs), once, here.

Reading is h5py's low-level calls where the high-level ones cost more than the reading (a
sweep of 10,000 small points reads 60,000 datasets and 130,000 attributes): the file opened
without a chunk cache (a table of 100 rows in a 4,096-row chunk reads its 100 rows, not the
chunk), a dataset's or an attribute's on-disk type compared with the types already seen
(H5Tequal) instead of converted to a numpy dtype again, and of the point group only the two
attributes read (`json`, `id`). The arrays and values are h5py's own, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpcbench.errors import HpcbenchError, SchemaError
from hpcbench.spec import Point
from hpcbench.store import schema, upgrade
from hpcbench.store.traits import Traits


@dataclass
class PointData:
    path: Path
    attrs: dict[str, Any]  # root attributes
    point: Point
    point_id: str
    provenance: dict[str, Any]
    ranks: np.ndarray  # (n_ranks,) RANK_DTYPE
    iterations: np.ndarray  # (n_ranks, iterations_written) ITERATION_DTYPE
    comm: np.ndarray  # (n_events,) COMM_DTYPE, all ranks (empty before schema 2)
    resources: np.ndarray  # (n_samples,) RESOURCE_DTYPE, all ranks (empty before schema 2; columns
    # added since the file's schema hold their unknown value, store/upgrade.py)
    eval: np.ndarray  # (n_evals,) EVAL_DTYPE, all ranks (empty before schema 3)
    energy: np.ndarray  # (n_readings,) ENERGY_DTYPE, all ranks (empty before schema 8, and where no
    # energy source could be read: provenance `energy_sources` says why)

    @property
    def status(self) -> str:
        return str(self.attrs.get("status", ""))

    @property
    def complete(self) -> bool:
        return self.status == schema.STATUS_COMPLETE

    @property
    def stopped(self) -> bool:
        """Stopped on a signal, every rank at the same iteration (resumable; `stop_reason` says why)."""
        return self.status == schema.STATUS_STOPPED

    @property
    def hostnames(self) -> list[str]:
        return [h.decode() for h in self.ranks["hostname"]]

    @property
    def environment(self) -> dict[str, str]:
        """The ranks' recorded environment (provenance `environment`); {} where none was recorded."""
        recorded = self.provenance.get("environment", {})
        return {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}

    @property
    def traits(self) -> Traits:
        """How the point's backend and launcher behave (store/traits.py): as the rank recorded
        them (provenance `traits`), or, in a file written before they were, as the built-in
        backend of that name behaved then (filled on reading, upgrade.recorded_later)."""
        return Traits.from_mapping(self.provenance["traits"])


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _attrs(obj: h5py.HLObject) -> dict[str, Any]:
    return {k: _plain(_attr(obj, k)) for k in obj.attrs}


# On-disk types seen, each with what h5py reads it as: (its type, the numpy dtype, the memory
# type). A file's type equal to one of them (H5Tequal) reads without converting it again.
_SEEN: list[tuple[h5py.h5t.TypeID, np.dtype[Any], h5py.h5t.TypeID]] = []


def _known(tid: h5py.h5t.TypeID, derive: Any) -> tuple[np.dtype[Any], h5py.h5t.TypeID]:
    """The numpy dtype and memory type h5py reads the on-disk type `tid` as (`derive()`: that
    dtype, asked only for a type not seen before)."""
    for seen, dtype, mtype in _SEEN:
        if seen == tid:
            return dtype, mtype
    dtype = derive()
    mtype = h5py.h5t.py_create(dtype)
    if len(_SEEN) < 64:
        _SEEN.append((tid.copy(), dtype, mtype))
    return dtype, mtype


def _attr(obj: h5py.HLObject, name: str) -> Any:
    """`obj.attrs[name]`, as h5py's AttributeManager reads it, its type looked up in `_SEEN`."""
    attr = h5py.h5a.open(obj.id, name.encode())
    shape = attr.shape
    dtype, mtype = _known(attr.get_type(), lambda: attr.dtype)
    if shape is None or dtype.subdtype is not None:  # empty, or a top-level array type: h5py's own way
        return obj.attrs[name]
    arr = np.zeros(shape, dtype=dtype)
    attr.read(arr, mtype=mtype)
    info = h5py.h5t.check_string_dtype(dtype)
    if info and info.length is None:  # variable-length strings, decoded as h5py decodes them
        arr = np.array([b.decode("utf-8", "surrogateescape") for b in arr.flat], dtype=dtype).reshape(arr.shape)
    return arr[()] if arr.ndim == 0 else arr


def _dataset(f: h5py.File, name: str, columns: int | None = None) -> np.ndarray:
    """`f[name][()]` (`f[name][:, :columns]` given `columns`), as h5py reads it, its type
    looked up in `_SEEN`."""
    dsid = h5py.h5d.open(f.id, name.encode())
    dtype, mtype = _known(dsid.get_type(), lambda: dsid.dtype)
    space = dsid.get_space()
    shape = space.shape
    if dtype.subdtype is not None or len(shape) != (1 if columns is None else 2) or (columns or 0) < 0:
        read: np.ndarray = f[name][()] if columns is None else f[name][:, :columns]
        return read
    if columns is not None and columns < shape[1]:
        shape = (shape[0], columns)
    arr = np.empty(shape, dtype=dtype)
    if arr.size == 0:
        return arr
    if shape != space.shape:
        space.select_hyperslab((0, 0), shape)
    dsid.read(h5py.h5s.create_simple(shape), space, arr, mtype)
    return arr


def read_point(path: Path | str) -> PointData:
    """Read a point file. Raises SchemaError for files this version cannot read."""
    path = Path(path)
    try:
        f = h5py.File(path, "r", rdcc_nbytes=0)  # no chunk cache: a small table reads its rows only
    except OSError as exc:
        raise SchemaError(f"{path}: not a readable HDF5 file ({exc})") from None
    with f:
        try:
            return _read(path, f)
        except SchemaError:
            raise
        except (KeyError, OSError, ValueError, TypeError, HpcbenchError) as exc:  # missing or unreadable parts
            raise SchemaError(f"{path}: damaged point file ({type(exc).__name__}: {exc})") from None


def _read(path: Path, f: h5py.File) -> PointData:
    attrs = _attrs(f)
    version = attrs.get("schema_version")
    if version is None:
        raise SchemaError(f"{path}: not an hpcbench point file (no schema_version)")
    if int(version) > schema.SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: written with schema {version}, this hpcbench reads up to {schema.SCHEMA_VERSION}: "
            "upgrade hpcbench to read it"
        )
    if schema.POINT not in f:  # says it is one, lacks a part every schema wrote
        raise SchemaError(f"{path}: damaged point file (no /{schema.POINT})")
    group = f[schema.POINT]
    point = Point.from_json(_plain(_attr(group, "json")))
    written = int(attrs.get("iterations_written", 0))
    names = _known(h5py.h5d.open(f.id, schema.ITERATIONS.encode()).get_type(), lambda: f[schema.ITERATIONS].dtype)[0]
    missing = sorted(set(schema.ITERATION_DTYPE.names or ()) - set(names.names or ()))
    if missing:  # before reading the rows: every schema wrote them all
        raise SchemaError(f"{path}: damaged point file (iterations lack the fields {', '.join(missing)})")
    provenance = _attrs(f[schema.PROVENANCE])
    for key, value in list(provenance.items()):
        if isinstance(value, str) and value[:1] in "{[":
            with contextlib.suppress(json.JSONDecodeError):
                provenance[key] = json.loads(value)
    tables = {name: _dataset(f, name) if name in f else None for name in schema.TABLES}
    parts = upgrade.Parts(int(version), point, provenance, _dataset(f, schema.ITERATIONS, written), **tables)
    try:
        arrays = upgrade.upgrade(parts)
    except upgrade.Damaged as exc:
        raise SchemaError(f"{path}: damaged point file ({exc})") from None
    # A job that died inside a flush may have appended its messages and not yet counted the
    # block's iterations (`iterations_written` is set last): such messages belong to no row.
    comm = arrays[schema.COMM]
    if len(comm) and int(comm["iteration"].max()) >= written:
        arrays[schema.COMM] = comm[comm["iteration"] < written]
    return PointData(
        path,
        attrs,
        point,
        str(_plain(_attr(group, "id"))),
        provenance,
        _dataset(f, schema.RANKS),
        arrays[schema.ITERATIONS],
        arrays[schema.COMM],
        arrays[schema.RESOURCES],
        arrays[schema.EVAL],
        arrays[schema.ENERGY],
    )
