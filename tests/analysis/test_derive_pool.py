"""A sweep read and derived by worker processes (analysis/derive_pool.py) gives the tables one
process gives, value for value, with the same warnings and cache entries; the point-file
reader's low-level reads (store/reader.py) give h5py's own arrays and attributes. Point files
written through the real writer; numbers, never timings."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.analysis import cache, derive_pool, pipeline, tables
from hpcbench.store import schema
from hpcbench.store.reader import read_point
from tests.analysis.test_analysis_cache import assert_same, point_file


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for n in (1, 2, 4):
        for seed in range(3):
            point_file(tmp_path, n, seed)
    point_file(tmp_path, 2, seed=9, status=schema.STATUS_RUNNING)  # skipped, with a warning
    return tmp_path


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of two workers for any sweep of two files or more."""
    monkeypatch.setattr(derive_pool, "PARALLEL_FROM", 2)
    monkeypatch.setenv(derive_pool.WORKERS_ENV, "2")


def test_a_sweep_derived_by_workers_gives_the_tables_of_one_process(
    sweep: Path, pooled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tables.point_files(sweep)
    assert derive_pool.pooled(files) == files  # every file goes to the workers
    by_workers = pipeline.analyse(sweep, use_cache=False)
    monkeypatch.setenv(derive_pool.WORKERS_ENV, "1")
    assert derive_pool.pooled(files) == []
    alone = pipeline.analyse(sweep, use_cache=False)
    assert len(alone.stats) == 9 and any("status running" in w for w in alone.warnings)
    assert_same(by_workers, alone)
    assert [p.point_id for p in by_workers.data] == [p.point_id for p in alone.data]
    for p, q in zip(by_workers.data, alone.data, strict=True):
        assert p.iterations.tobytes() == q.iterations.tobytes() and p.comm.tobytes() == q.comm.tobytes()


def test_workers_fill_the_cache_that_a_second_analysis_reads(
    sweep: Path, pooled: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path_factory.mktemp("alone")
    for path in sweep.iterdir():
        shutil.copy2(path, copy / path.name)
    first = pipeline.analyse(sweep)
    # every file missed (the running one too), 9 entries and the sweep's written: as one process counts
    assert (first.cache.hits, first.cache.misses, first.cache.written) == (0, 10, 10)
    monkeypatch.setenv(derive_pool.WORKERS_ENV, "1")
    assert pipeline.analyse(copy).cache == first.cache
    monkeypatch.setenv(derive_pool.WORKERS_ENV, "2")
    again = pipeline.analyse(sweep)
    assert (again.cache.hits, again.cache.misses, again.cache.sweep_hit) == (9, 1, True)  # the running one again
    assert_same(again, first)
    assert_same(first, pipeline.analyse(sweep, use_cache=False))
    assert len(list((sweep / cache.CACHE_DIR).glob("*.h5.npz"))) == 9


def test_the_pool_reads_each_file_as_this_process_does(sweep: Path, pooled: None) -> None:
    files = tables.point_files(sweep)
    with derive_pool.derived(files, None) as results:
        for path, (data, warnings, derived) in zip(files, results, strict=True):
            here = derive_pool.read_and_derive(path, None)
            assert warnings == here[1]
            if data is None:
                assert here[0] is None and derived is None
                continue
            assert here[0] is not None and here[2] is not None and derived is not None
            assert data.point == here[0].point and data.attrs == here[0].attrs
            assert _same_nan(derived.metrics, here[2].metrics)


def _same_nan(a: dict[str, object], b: dict[str, object]) -> bool:
    """Equal rows, NaN equal to NaN."""
    return a.keys() == b.keys() and all(
        x == y or (x != x and y != y) for x, y in zip(a.values(), b.values(), strict=True)
    )


def test_a_bad_worker_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(derive_pool.WORKERS_ENV, "two")
    with pytest.raises(Exception, match="HPCBENCH_ANALYSIS_WORKERS='two'"):
        derive_pool.workers()


def test_the_reader_gives_h5pys_own_arrays_and_attributes(sweep: Path) -> None:
    for path in tables.point_files(sweep):
        p = read_point(path)
        with h5py.File(path, "r") as f:
            written = int(f.attrs["iterations_written"])
            assert p.iterations.tobytes() == f[schema.ITERATIONS][:, :written].tobytes()
            assert p.ranks.dtype == f[schema.RANKS].dtype and p.ranks.tobytes() == f[schema.RANKS][()].tobytes()
            for name in schema.TABLES:
                if name in f:
                    assert getattr(p, name).tobytes() == f[name][()].tobytes(), name
            assert p.attrs.keys() == set(f.attrs)
            for key, value in f.attrs.items():
                expected = value.decode() if isinstance(value, bytes) else value
                expected = expected.item() if isinstance(expected, np.generic) else expected
                assert p.attrs[key] == expected and type(p.attrs[key]) is type(expected), key
            assert p.point_id == f[schema.POINT].attrs["id"] == path.stem
