"""Point files read and derived in worker processes, where a sweep has many to read (loading.py).

A worker reads a file and derives its tables (`per_point.derive`) as loading.load does here,
and hands back its arrays, its tables and its warnings by pickle, in file order: the tables
are the same, value for value, as one process's. It pays only with many files (a small point
is read and derived in a few milliseconds): at least `PARALLEL_FROM` files to read and more
than one CPU; a file of `LARGE_FILE` bytes or more is read in the calling process (its arrays
would be copied out of the worker and held twice on the way). The workers are forked where
this process runs one thread on Linux (nothing imported again, no lock held by another
thread inherited), else started by a fork server (which imports the caller's main module
again: a script that analyses at its top level, outside `if __name__ == "__main__":`, and
runs threads is analysed in one process). `HPCBENCH_ANALYSIS_WORKERS` sets the number of
workers (1: no pool); by default, the CPUs this process may run on.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from hpcbench.analysis import per_point, tables
from hpcbench.analysis.per_point import PointTables
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData

PARALLEL_FROM = 400  # files to read from which a pool pays for its start
LARGE_FILE = 64 * 2**20  # bytes from which a file is read in the calling process
WORKERS_ENV = "HPCBENCH_ANALYSIS_WORKERS"
CHUNK = 16  # files a worker takes at once

Result = tuple[PointData | None, list[str], PointTables | None]  # read_checked's data and warnings, derive's tables


def read_and_derive(path: Path, target_accuracy: float | None) -> Result:
    """What loading.load does with a file that has no cache entry: read it, check it, derive it."""
    warnings: list[str] = []
    data = tables.read_checked(path, warnings)
    if data is None:
        return None, warnings, None
    return data, warnings, per_point.derive(data, target_accuracy)


def workers() -> int:
    """The worker processes to use: `HPCBENCH_ANALYSIS_WORKERS`, else this process's CPUs."""
    setting = os.environ.get(WORKERS_ENV, "").strip()
    if setting:
        if not setting.isdigit() or int(setting) < 1:
            raise HpcbenchError(f"{WORKERS_ENV}={setting!r}: not a number of worker processes (1 or more)")
        return int(setting)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pooled(paths: list[Path]) -> list[Path]:
    """Of the files `paths` to read, those a pool would read: none where there are too few or
    one worker, else all but the large ones."""
    small = [p for p in paths if _size(p) < LARGE_FILE]
    return small if len(small) >= PARALLEL_FROM and workers() > 1 and _start_method() else []


def _start_method() -> str:
    """fork where it is safe (Linux, this process's only thread), else a fork server; "" for none."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and threading.active_count() == 1 and "fork" in methods:
        return "fork"
    if "forkserver" in methods and _main_guarded():
        return "forkserver"
    return ""


def _main_guarded() -> bool:
    """Whether the main module can be imported again by a fork server's worker without running
    the caller's work again: a module run with -m or an entry point, not a bare script."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return main is None or spec is not None or not getattr(main, "__file__", None)


@contextmanager
def derived(paths: list[Path], target_accuracy: float | None) -> Iterator[Iterator[Result]]:
    """`read_and_derive` of each of `paths`, in order, computed ahead by a pool of workers."""
    if not paths:
        yield iter(())
        return
    method = _start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload([__name__])
    pool = ProcessPoolExecutor(max_workers=min(workers(), len(paths)), mp_context=context)
    try:
        yield pool.map(partial(read_and_derive, target_accuracy=target_accuracy), paths, chunksize=CHUNK)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
