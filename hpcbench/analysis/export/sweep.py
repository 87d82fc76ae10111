"""Exporting a sweep: its complete points, read one at a time, into the chosen formats.

Per point, the Parquet tables and its stats row are computed by worker threads while the
next point is read and the point's log timings taken (at most two points in memory); then its
arrays are let go. summary.json and the logs, which need every point's row (speedup
compares points), are written at the end. Everything goes through a staging folder
(output.py): an export is wholly there or not at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from hpcbench.analysis import tables
from hpcbench.analysis.export import mllog
from hpcbench.analysis.export.output import Staging, check_free
from hpcbench.analysis.export.summary import Summary, records, summary_json
from hpcbench.errors import HpcbenchError, SpecError
from hpcbench.store import schema
from hpcbench.store.status import result_status
from hpcbench.sweepdir.paths import inside

if TYPE_CHECKING:
    from hpcbench.analysis.export.parquet import ParquetExport

FORMATS = ("parquet", "mllog", "json")
# parquet.FILES, known here without importing pyarrow (mllog and json do without it)
PARQUET_TABLES = ("points", "iterations", "messages", "resources", "evaluations", "energy", "ranks")
PARQUET_FILES = tuple(f"{name}.parquet" for name in PARQUET_TABLES)
SUMMARY = "summary.json"
DEFAULT_OUT = "export"  # inside the sweep directory
THREADS = 3  # a large point's three long jobs (iterations, messages, stats) at once; the OS shares the cores


@dataclass
class Exported:
    out: Path
    formats: list[str]
    files: list[Path] = field(default_factory=list)
    points: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # Parquet rows per table
    warnings: list[str] = field(default_factory=list)  # point files skipped


class NothingToExport(SpecError):
    """No point of the sweep could be exported: the skipped point files' warnings say why."""


def parse_formats(values: Sequence[str]) -> list[str]:
    """Formats from repeated and comma-separated values, in the order first named."""
    chosen: list[str] = []
    for value in values:
        for name in (part.strip().lower() for part in value.split(",")):
            if name not in FORMATS:
                raise SpecError("--format", f"{name!r} is not an export format", ", ".join(FORMATS))
            if name not in chosen:
                chosen.append(name)
    if not chosen:
        raise SpecError("--format", "no format named", ", ".join(FORMATS))
    return chosen


def _log_name(point_id: str) -> str:
    return f"{mllog.DIRECTORY}/{point_id}.log"


def _candidates(directory: Path, warnings: list[str]) -> list[Path]:
    """The point files whose status says complete (read from their attributes alone)."""
    found = []
    for path in tables.point_files(directory):
        status = result_status(path)
        if status == schema.STATUS_COMPLETE:
            found.append(path)
        else:
            why = "not a readable HDF5 file" if status is None else f"status {status or 'unknown'}, not complete"
            warnings.append(f"skipped {path.name}: {why}")
    return found


def _parquet_exporter() -> type[ParquetExport]:
    """The Parquet writer, imported when asked for: mllog and json need no pyarrow."""
    try:
        from hpcbench.analysis.export.parquet import ParquetExport
    except ImportError as exc:
        raise HpcbenchError(f"--format parquet needs pyarrow ({exc}): pip install 'hpcbench-dl[analysis]'") from None
    return ParquetExport


def export_sweep(
    directory: Path | str,
    formats: Sequence[str],
    out: Path | str | None = None,
    force: bool = False,
    warnings: list[str] | None = None,
) -> Exported:
    """Export the complete points of `directory` in `formats` into `out` (default
    DIRECTORY/export). Bad input raises SpecError (exit status 2) before anything is written;
    a file of the export that exists already is bad input too, unless `force` (then a regular
    file is replaced, never a folder, link or device). `warnings`: a list that receives every
    point file skipped and why, as it is skipped (the same list as the result's), so that a
    caller can show them all when no point could be exported (NothingToExport)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SpecError("SWEEP_DIR", f"{directory}: no such directory", "a sweep directory holding <point>.h5 files")
    chosen = parse_formats(formats)
    try:
        target = Path(out) if out is not None else inside(directory, DEFAULT_OUT)
    except HpcbenchError as exc:
        raise SpecError("-o/--output", str(exc), "a directory of your own with -o") from None
    result = Exported(target, chosen, warnings=warnings if warnings is not None else [])
    candidates = _candidates(directory, result.warnings)
    if not candidates:
        raise NothingToExport(
            "SWEEP_DIR",
            f"{directory}: no complete point files to export{_skipped(result)}",
            "a sweep with complete points",
        )
    planned = [*(PARQUET_FILES if "parquet" in chosen else ()), *([SUMMARY] if "json" in chosen else ())]
    planned += [_log_name(path.stem) for path in candidates] if "mllog" in chosen else []
    check_free(target, planned, force, reads=[directory])
    exporter = _parquet_exporter() if "parquet" in chosen else None
    with Staging(target, force) as stage, ThreadPoolExecutor(THREADS, thread_name_prefix="export") as pool:
        parquet = exporter(stage.path) if exporter is not None else None
        try:
            names = _export_points(directory, stage, pool, candidates, chosen, parquet, result)
        except BaseException:
            if parquet is not None:
                parquet.abort()
            raise
        result.files = stage.commit(names)
    return result


def _skipped(result: Exported) -> str:
    """How many point files were skipped, for an error message (the warnings name each)."""
    n = len(result.warnings)
    return f" ({n} point file{'s' if n != 1 else ''} skipped; the warnings name each and why)" if n else ""


def _export_points(
    directory: Path,
    stage: Staging,
    pool: ThreadPoolExecutor,
    candidates: list[Path],
    chosen: list[str],
    parquet: ParquetExport | None,
    result: Exported,
) -> list[str]:
    """Every point through every format; the names of the files staged. The next point is
    read while the jobs of the one before run (at most two points in memory)."""
    summary = Summary() if "json" in chosen or "mllog" in chosen else None
    runs: list[mllog.Run] = []
    pending: list[Future[Any]] = []
    try:
        for path in candidates:
            p = tables.read_checked(path, result.warnings)
            _wait(pending)
            pending = []
            if p is None:
                continue
            jobs: list[Callable[[], Any]] = []
            if summary is not None:
                jobs.append(functools.partial(summary.add, p))  # first: the longest on a large point
            if parquet is not None:
                jobs += parquet.jobs(p)
            pending = [pool.submit(job) for job in jobs]
            if "mllog" in chosen:
                runs.append(mllog.Run.of(p))
            result.points += 1
            del p, jobs
        _wait(pending)
    except BaseException:
        wait(pending)  # no job may still write when the files are closed and removed
        raise
    if result.points == 0:
        raise NothingToExport("SWEEP_DIR", f"no point file could be exported{_skipped(result)}", "complete point files")
    names: list[str] = []
    if parquet is not None:
        parquet.close()
        result.rows = dict(parquet.rows)
        names += PARQUET_FILES
    if summary is not None:
        names += _write_summaries(directory, stage, summary, runs, chosen, result.warnings)
    return names


def _wait(futures: list[Future[Any]]) -> None:
    for future in futures:
        future.result()  # a job's exception is raised here


def _write_summaries(
    directory: Path, stage: Staging, summary: Summary, runs: list[mllog.Run], chosen: list[str], warnings: list[str]
) -> list[str]:
    """summary.json and the logs (both need every point's stats row); the names staged."""
    names = []
    stats = summary.table()
    if "json" in chosen:
        (stage.path / SUMMARY).write_text(summary_json(stats, str(directory), warnings))
        names.append(SUMMARY)
    by_point = {row["point"]: row for row in records(stats)}
    for run in runs:
        name = _log_name(run.point_id)
        log = inside(stage.path, PurePath(name))
        log.parent.mkdir(exist_ok=True)
        log.write_text(mllog.text(run, by_point.get(run.point_id, {})))
        names.append(name)
    return names
