"""Writing one shared point file from every rank.

Two writers with one contract, chosen by `open_writer`:

* `MpioWriter`: h5py built with MPI (`h5py.get_config().mpi`); all ranks open the file
  with `driver='mpio'`, create every object collectively with known shapes, and write
  their own rows independently.
* `GatherWriter`: any h5py; ranks send their blocks to rank 0, which writes them.

Every method is collective: all ranks call it, in the same order, with the same metadata.
The file is made under a temporary name (`creating(path)`) and renamed to `path` once its
layout is flushed, so `path` is either absent or a readable file: a job killed while the
file is being made leaves at most the temporary file, which holds no rows and is replaced
by the next attempt. After each `write_iterations` the file is flushed, so a job killed
later leaves a file holding everything up to that flush.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.rank.collectives import Comm
from hpcbench.store import schema
from hpcbench.store.status import creating


@dataclass
class FileMeta:
    """What goes into a new point file's attributes: identical on every rank."""

    root: dict[str, Any]
    point: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)


TABLE_CHUNK_ROWS = 4096
Tables = Mapping[str, np.ndarray]  # schema.TABLES name -> this rank's new rows


class PointWriter(Protocol):
    kind: str

    def write_iterations(self, start: int, rows: np.ndarray, tables: Tables | None = None) -> None:
        """This rank's rows for iterations [start, start + len(rows)), and its new rows of the
        append-only tables (comm, resources). Collective; the file is flushed after it."""

    def close(self, status: str, attrs: Mapping[str, Any] | None = None) -> None:
        """Record the final status (and `attrs`, e.g. a stopped file's `stop_reason`) and
        close the file. Collective."""


def attr_value(value: Any) -> Any:
    """An HDF5-storable form of a metadata value (None and mappings become JSON text)."""
    if value is None or isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str):
        return value.replace("\0", "\\0")  # HDF5 strings end at NUL
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return np.array([v.replace("\0", "\\0") for v in value], dtype=h5py.string_dtype())
        return json.dumps(list(value))
    return value


def _write_attrs(obj: h5py.HLObject, attrs: Mapping[str, Any]) -> None:
    for key, value in sorted(attrs.items()):
        obj.attrs[key] = attr_value(value)


def _create_layout(f: h5py.File, meta: FileMeta, n_ranks: int, n_iterations: int) -> None:
    _write_attrs(f, meta.root)
    f.attrs["schema_version"] = schema.SCHEMA_VERSION
    f.attrs["status"] = schema.STATUS_RUNNING
    f.attrs["n_ranks"] = n_ranks
    f.attrs["n_iterations"] = n_iterations
    f.attrs["iterations_written"] = 0
    _write_attrs(f.create_group(schema.POINT), meta.point)
    _write_attrs(f.create_group(schema.PROVENANCE), meta.provenance)
    f.create_dataset(schema.RANKS, shape=(n_ranks,), dtype=schema.RANK_DTYPE)
    # No fill values: rows are read only up to `iterations_written`, and filling the whole
    # dataset at allocation would write every byte twice. (A property list rather than
    # `fill_time="never"`, which h5py < 3 - Debian 11's, in the caffe environment - lacks.)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    f.create_dataset(schema.ITERATIONS, shape=(n_ranks, n_iterations), dtype=schema.ITERATION_DTYPE, dcpl=dcpl)
    for name, dtype in schema.TABLES.items():
        f.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(TABLE_CHUNK_ROWS,), dtype=dtype)


def _publish(path: Path, comm: Comm) -> None:
    """Rename the flushed new file (`creating(path)`) to `path` (rank 0), once every rank is
    past the flush.

    The ranks keep writing through their open handles: a rename leaves an open file as it is."""
    comm.barrier()
    if comm.rank == 0:
        os.replace(creating(path), path)
    comm.barrier()  # no rank starts timing before the file is in place: errors surface here


class MpioWriter:
    kind = "mpio"

    def __init__(self, path: Path, comm: Comm, meta: FileMeta, n_iterations: int, rank_row: np.ndarray) -> None:
        self._comm = comm
        self._file = h5py.File(creating(path), "w", driver="mpio", comm=comm.mpi_comm)
        _create_layout(self._file, meta, comm.size, n_iterations)
        self._file[schema.RANKS][comm.rank] = rank_row
        self._written = 0
        self._file.flush()
        _publish(path, comm)

    def write_iterations(self, start: int, rows: np.ndarray, tables: Tables | None = None) -> None:
        if len(rows):
            self._file[schema.ITERATIONS][self._comm.rank, start : start + len(rows)] = rows
        for name in schema.TABLES:
            mine = (tables or {}).get(name)
            counts = self._comm.allgather(0 if mine is None else len(mine))
            dset = self._file[name]
            offset = dset.shape[0] + sum(counts[: self._comm.rank])
            dset.resize((dset.shape[0] + sum(counts),))  # collective: same size on every rank
            if mine is not None and len(mine):
                dset[offset : offset + len(mine)] = mine
        self._written = max(self._written, start + len(rows))
        self._file.attrs["iterations_written"] = self._written
        self._file.flush()

    def close(self, status: str, attrs: Mapping[str, Any] | None = None) -> None:
        _write_attrs(self._file, attrs or {})
        self._file.attrs["status"] = status
        self._file.close()


class GatherWriter:
    kind = "gather"

    def __init__(self, path: Path, comm: Comm, meta: FileMeta, n_iterations: int, rank_row: np.ndarray) -> None:
        self._comm = comm
        self._file: h5py.File | None = None
        self._written = 0
        rows = comm.gather(rank_row)
        if comm.rank == 0:
            assert rows is not None
            self._file = h5py.File(creating(path), "w")
            _create_layout(self._file, meta, comm.size, n_iterations)
            self._file[schema.RANKS][:] = np.concatenate([np.atleast_1d(r) for r in rows])
            self._file.flush()
        _publish(path, comm)

    def write_iterations(self, start: int, rows: np.ndarray, tables: Tables | None = None) -> None:
        blocks = self._comm.gather(rows)
        gathered = {name: self._comm.gather((tables or {}).get(name)) for name in schema.TABLES}
        if self._file is None:
            return
        for name, parts in gathered.items():
            assert parts is not None
            new = [p for p in parts if p is not None and len(p)]
            if new:
                dset = self._file[name]
                size = dset.shape[0]
                block = np.concatenate(new)
                dset.resize((size + len(block),))
                dset[size:] = block
        assert blocks is not None
        if any(len(b) != len(rows) for b in blocks):
            raise HpcbenchError(f"ranks flushed different numbers of iterations: {[len(b) for b in blocks]}")
        if len(rows):
            dset = self._file[schema.ITERATIONS]
            for rank, block in enumerate(blocks):  # row by row: no copy into one (ranks, n) array
                dset[rank, start : start + len(block)] = block
        self._written = max(self._written, start + len(rows))
        self._file.attrs["iterations_written"] = self._written
        self._file.flush()

    def close(self, status: str, attrs: Mapping[str, Any] | None = None) -> None:
        self._comm.barrier()
        if self._file is not None:
            _write_attrs(self._file, attrs or {})
            self._file.attrs["status"] = status
            self._file.close()


def parallel_hdf5_available() -> bool:
    return bool(h5py.get_config().mpi)


def choose_writer(comm: Comm, mode: str = "auto") -> str:
    """'mpio' or 'gather' for `mode` (auto | mpio | gather) on this job; raises if impossible."""
    mpio_possible = comm.mpi_comm is not None and parallel_hdf5_available()
    if mode == "mpio" and not mpio_possible:
        why = "h5py was built without MPI" if not parallel_hdf5_available() else "the ranks were not started by MPI"
        raise HpcbenchError(f"writer 'mpio' asked for but not possible here: {why} (use writer: gather or auto)")
    if mode not in ("auto", "mpio", "gather"):
        raise HpcbenchError(f"unknown writer {mode!r} (allowed: auto, mpio, gather)")
    return "mpio" if mode == "mpio" or (mode == "auto" and mpio_possible) else "gather"


def open_writer(
    path: Path, comm: Comm, meta: FileMeta, n_iterations: int, rank_row: np.ndarray, kind: str
) -> PointWriter:
    """Create the point file at `path` (collective) with the writer `kind` from choose_writer."""
    cls = MpioWriter if kind == "mpio" else GatherWriter
    return cls(path, comm, meta, n_iterations, rank_row)


def write_rowless(path: Path, meta: FileMeta, n_ranks: int, attrs: Mapping[str, Any]) -> None:
    """A point file with no rows, its attributes set (`attrs`, the status among them): a
    result the ranks recorded no iteration of (store/oom.py). Made aside and renamed, as every file."""
    with h5py.File(creating(path), "w") as f:
        _create_layout(f, meta, n_ranks, 0)
        _write_attrs(f, attrs)
    os.replace(creating(path), path)
