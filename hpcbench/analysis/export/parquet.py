"""Parquet files of a sweep: one per table, written point by point.

Each table has one open `ParquetWriter`; a point's rows are converted and written in chunks
of at most CHUNK_ROWS rows (a row group each; the chunks of small points are gathered into
row groups of about half that), so memory holds a point and a chunk or two, whatever the
sweep's size. The tables of one point are written by parallel threads (Arrow
encodes and compresses outside the GIL). zstd throughout; the encodings are the columns'
(schemas.py). `points.parquet`, one row per point, is written at the end.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hpcbench.analysis import tables
from hpcbench.analysis.export import schemas
from hpcbench.analysis.export.columns import Column, schema, writer_options
from hpcbench.store import schema as store_schema
from hpcbench.store.reader import PointData

TABLES: dict[str, tuple[Column, ...]] = {
    "points": schemas.POINTS,
    "iterations": schemas.ITERATIONS,
    "messages": schemas.MESSAGES,
    "resources": schemas.RESOURCES,
    "evaluations": schemas.EVALUATIONS,
    "energy": schemas.ENERGY,
    "ranks": schemas.RANKS,
}
FILES = tuple(f"{name}.parquet" for name in TABLES)

_CHUNKS: dict[str, Callable[[PointData], Iterator[Any]]] = {
    "iterations": schemas.iteration_chunks,
    "messages": schemas.message_chunks,
    "resources": schemas.resource_chunks,
    "evaluations": schemas.evaluation_chunks,
    "energy": schemas.energy_chunks,
    "ranks": schemas.rank_chunks,
}


def _without_arrays(p: PointData) -> PointData:
    """`p` with its ranks and attributes, its large arrays emptied (what the points table reads)."""
    return dataclasses.replace(
        p,
        iterations=np.zeros((p.iterations.shape[0], 0), dtype=store_schema.ITERATION_DTYPE),
        comm=p.comm[:0].copy(),
        resources=p.resources[:0].copy(),
        eval=p.eval[:0].copy(),
        energy=p.energy[:0].copy(),
    )


def _writer(path: Path, columns: tuple[Column, ...]) -> Any:
    return pq.ParquetWriter(path, schema(columns), **writer_options(columns))


class _Table:
    """One open Parquet file. Small chunks (small points) are held back and written together,
    so that a sweep of many small points does not become as many tiny row groups."""

    def __init__(self, path: Path, columns: tuple[Column, ...]) -> None:
        self.writer = _writer(path, columns)
        self.rows = 0
        self._held: list[Any] = []
        self._held_rows = 0

    def write(self, chunk: Any) -> None:
        self.rows += chunk.num_rows
        if chunk.num_rows >= schemas.CHUNK_ROWS // 2:  # large enough to be a row group of its own
            self.flush()
            self.writer.write_table(chunk, row_group_size=schemas.CHUNK_ROWS)
            return
        self._held.append(chunk)
        self._held_rows += chunk.num_rows
        if self._held_rows >= schemas.CHUNK_ROWS // 2:
            self.flush()

    def flush(self) -> None:
        if self._held:
            held = pa.concat_tables(self._held).unify_dictionaries()  # one dictionary per column
            self.writer.write_table(held, row_group_size=schemas.CHUNK_ROWS)  # < CHUNK_ROWS rows
            self._held, self._held_rows = [], 0


class ParquetExport:
    """The Parquet files of one export, in `directory` (the staging folder)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rows = dict.fromkeys(TABLES, 0)
        self._points: list[PointData] = []  # the points without their arrays, for points.parquet
        self._tables = {name: _Table(directory / f"{name}.parquet", TABLES[name]) for name in _CHUNKS}

    def jobs(self, p: PointData) -> list[Callable[[], None]]:
        """The work of adding point `p` (one job per table, to run in parallel)."""
        self._points.append(_without_arrays(p))
        return [functools.partial(self._write, name, p) for name in _CHUNKS]

    def _write(self, name: str, p: PointData) -> None:
        table = self._tables[name]
        for chunk in _CHUNKS[name](p):
            table.write(chunk)

    def close(self) -> list[Path]:
        """Write points.parquet, close every file; the files written."""
        for name, table in self._tables.items():
            table.flush()
            table.writer.close()
            self.rows[name] = table.rows
        analysed = tables.points_table(self._points).to_dict("records")  # the analysis' points table
        rows = [schemas.points_row(p, row) for p, row in zip(self._points, analysed, strict=True)]
        table = schemas.points_table(rows)
        pq.write_table(table, self.directory / "points.parquet", **writer_options(schemas.POINTS))
        self.rows["points"] = table.num_rows
        return [self.directory / name for name in FILES]

    def abort(self) -> None:
        for table in self._tables.values():
            table.writer.close()
