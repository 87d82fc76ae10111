"""The analysis cache (hpcbench/analysis/cache.py): a sweep analysed from its cached per-point
tables gives the tables its files give, a changed, added or removed point file is redone, a
damaged entry is ignored, and `--no-cache` bypasses it. Point files written through the real
writer; numbers, never timings."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import cache, loading, per_point, pipeline, tables
from hpcbench.analysis.pipeline import Analysis
from hpcbench.cli import analyze as cli
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.testing.arrays import comm_rows, eval_rows, iterations
from hpcbench.testing.fabricate import write_point_file

PHASES = {"data": 0.002, "h2d": 0.001, "forward": 0.010, "backward": 0.020, "update": 0.003}
COMM = 0.004  # each iteration's exchange after backward: t_iter = 40 ms with the phases above
TABLES = ("points", "stats", "repeats", "evaluations", "predictions", "held_out", "collectives")
SLOW = ("stragglers", "whatif", "hosts", "buckets")


def point_file(directory: Path, n_ranks: int, seed: int = 0, forward: float = PHASES["forward"],
               status: str = schema.STATUS_COMPLETE, batch: int = 16) -> Path:  # fmt: skip
    """A synchronous point of `n_ranks` ranks x 30 iterations (5 warm-up): rank 1 (where there
    is one) 20 % slower in forward, one message per rank and iteration, two evaluations."""
    rng = np.random.default_rng(seed)
    n_iters = 30
    a = iterations(n_ranks, n_iters, warmup=5, batch=batch)
    compute = np.zeros((n_ranks, n_iters))
    for phase, seconds in {**PHASES, "forward": forward}.items():
        values = seconds * (1.0 + 0.01 * rng.random((n_ranks, n_iters)))
        if phase == "forward" and n_ranks > 1:
            values[1] *= 1.2
        a[phase] = values
        compute += values
    step = compute.max(axis=0) + COMM
    a["comm"] = step - compute
    a["comm_total"] = a["comm"]
    a["t_start"] = np.concatenate(([0.0], np.cumsum(step)[:-1]))[None, :]
    a["t_end"] = a["t_start"] + step
    ready = a["t_start"] + compute
    comm = comm_rows([(r, i, 1_000_000, float(ready[r, i]), float(a["t_end"][r, i]))
                      for r in range(n_ranks) for i in range(n_iters)])  # fmt: skip
    evals = eval_rows([(r, e, 10.0 * e, 1.0, 50 + 10 * e + r, 100) for r in range(n_ranks) for e in (1, 2)])
    point = Point(framework="torch", backend="gloo", ranks_per_node=n_ranks, batch_size=batch, seed=seed)
    path = directory / f"{point.id}.h5"
    write_point_file(path, point, a, comm=comm, evals=evals, hostnames=["node0"] * n_ranks, status=status)
    return path


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for n in (1, 2, 4):
        for seed in (0, 1):
            point_file(tmp_path, n, seed)
    return tmp_path


def assert_same(a: Analysis, b: Analysis) -> None:
    """Every table of `a` equal to `b`'s, value for value and dtype for dtype."""
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    for name in SLOW:
        pd.testing.assert_frame_equal(getattr(a.slow, name), getattr(b.slow, name), check_exact=True)
    assert [p.point_id for p in a.slow.points] == [p.point_id for p in b.slow.points]
    for p, q in zip(a.slow.points, b.slow.points, strict=True):
        np.testing.assert_array_equal(p.heat, q.heat)
        pd.testing.assert_frame_equal(p.ranks, q.ranks, check_exact=True)
    assert (a.warnings, a.notes, a.headlines) == (b.warnings, b.notes, b.headlines)


def t_iter(a: Analysis, path: Path) -> float:
    return float(np.asarray(a.stats.set_index("point").loc[path.stem, "t_iter_s"]))


def test_a_sweep_analysed_again_comes_from_the_cache_with_the_same_tables(sweep: Path) -> None:
    files = tables.load(sweep)
    uncached = pipeline.analyse(sweep, use_cache=False)
    assert not (sweep / cache.CACHE_DIR).exists()  # --no-cache writes nothing
    first = pipeline.analyse(sweep)
    assert (first.cache.hits, first.cache.misses, first.cache.sweep_hit) == (0, 6, False)
    assert sorted(p.name for p in (sweep / cache.CACHE_DIR).iterdir()) == sorted(
        [f"{p.path.name}.npz" for p in files.points] + [cache.SWEEP_ENTRY]
    )
    again = pipeline.analyse(sweep)
    assert (again.cache.hits, again.cache.misses, again.cache.ignored, again.cache.sweep_hit) == (6, 0, 0, True)
    assert again.cache.written == 0
    assert_same(again, uncached)
    assert_same(first, uncached)
    # what the tables show is the files' numbers: t_iter = 36 ms of phases (38 ms where rank 1's
    # forward is 20 % longer, on two and more ranks) + 4 ms of exchange, within the 1 % noise
    for p in files.points:
        assert t_iter(again, p.path) == pytest.approx(0.040 if p.iterations.shape[0] == 1 else 0.042, rel=0.02)
    # the arrays are still there for whoever needs them, read on first use
    assert [p.point_id for p in again.data] == [p.point_id for p in files.points]
    assert again.specs == {p.point_id: p.point for p in files.points}


def test_the_per_point_tables_give_the_stats_table_of_the_files(sweep: Path) -> None:
    files = tables.load(sweep).points
    derived = [per_point.derive(p) for p in files]
    pd.testing.assert_frame_equal(per_point.stats_table(derived), tables.stats_table(files), check_exact=True)
    pd.testing.assert_frame_equal(per_point.points_table(derived), tables.points_table(files), check_exact=True)
    pd.testing.assert_frame_equal(
        per_point.evaluations_table(derived), tables.evaluations_table(files), check_exact=True
    )


def test_a_rewritten_point_file_is_derived_again_and_its_new_numbers_shown(sweep: Path) -> None:
    pipeline.analyse(sweep)
    path = point_file(sweep, 2, seed=0, forward=0.030)  # the same point, rewritten: forward 20 ms longer
    redone = pipeline.analyse(sweep)
    assert (redone.cache.hits, redone.cache.misses, redone.cache.sweep_hit) == (5, 1, False)
    assert t_iter(redone, path) == pytest.approx(0.060 + 0.006, rel=0.02)  # rank 1's forward 36 ms
    assert_same(redone, pipeline.analyse(sweep, use_cache=False))


def test_an_added_point_appears_and_a_removed_one_disappears(sweep: Path) -> None:
    before = pipeline.analyse(sweep)
    added = point_file(sweep, 8, seed=0)
    grown = pipeline.analyse(sweep)
    assert added.stem in set(grown.stats["point"]) and added.stem not in set(before.stats["point"])
    assert (grown.cache.hits, grown.cache.misses, grown.cache.sweep_hit) == (6, 1, False)
    assert_same(grown, pipeline.analyse(sweep, use_cache=False))
    removed = tables.load(sweep).points[0].path
    removed.unlink()
    shrunk = pipeline.analyse(sweep)
    assert removed.stem not in set(shrunk.stats["point"]) and len(shrunk.stats) == 6
    assert not (sweep / cache.CACHE_DIR / f"{removed.name}.npz").exists()  # its entry went with it
    assert_same(shrunk, pipeline.analyse(sweep, use_cache=False))


def test_a_damaged_entry_is_ignored_and_written_again(sweep: Path) -> None:
    uncached = pipeline.analyse(sweep, use_cache=False)
    pipeline.analyse(sweep)
    entries = sorted((sweep / cache.CACHE_DIR).glob("*.h5.npz"))
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # cut short
    entries[1].write_bytes(b"not an entry")
    (sweep / cache.CACHE_DIR / cache.SWEEP_ENTRY).write_bytes(b"")
    damaged = pipeline.analyse(sweep)
    assert (damaged.cache.hits, damaged.cache.misses, damaged.cache.ignored) == (4, 2, 3)
    assert_same(damaged, uncached)
    mended = pipeline.analyse(sweep)
    assert (mended.cache.hits, mended.cache.ignored, mended.cache.sweep_hit) == (6, 0, True)
    assert_same(mended, uncached)


def test_an_entry_of_another_key_is_not_used(sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline.analyse(sweep)
    monkeypatch.setattr(cache, "code_version", lambda: "another analysis")
    other = pipeline.analyse(sweep)
    assert (other.cache.hits, other.cache.misses, other.cache.sweep_hit) == (0, 6, False)
    target = pipeline.analyse(sweep, target_accuracy=0.6)  # time-to-accuracy against another target
    assert (target.cache.hits, target.cache.sweep_hit) == (0, False)
    assert_same(target, pipeline.analyse(sweep, target_accuracy=0.6, use_cache=False))


def test_an_incomplete_point_is_not_cached(sweep: Path) -> None:
    running = point_file(sweep, 2, seed=5, status=schema.STATUS_RUNNING)
    first = pipeline.analyse(sweep)
    assert running.stem not in set(first.stats["point"])
    assert any(running.name in w and "not complete" in w for w in first.warnings)
    assert not (sweep / cache.CACHE_DIR / f"{running.name}.npz").exists()
    done = point_file(sweep, 2, seed=5)  # the same point, now complete
    assert done == running
    second = pipeline.analyse(sweep)
    assert running.stem in set(second.stats["point"]) and second.cache.misses == 1


def test_a_sweep_directory_where_the_cache_cannot_be_written_is_analysed_without_it(sweep: Path) -> None:
    (sweep / cache.CACHE_DIR).write_text("a file where the cache's directory would be")
    analysis = pipeline.analyse(sweep)
    assert (analysis.cache.hits, analysis.cache.written) == (0, 0)
    assert_same(analysis, pipeline.analyse(sweep, use_cache=False))


def test_analyze_no_cache_bypasses_the_cache(sweep: Path) -> None:
    out = io.StringIO()
    assert cli.main(["analyze", "--no-cache", str(sweep)], out=out) == 0
    assert not (sweep / cache.CACHE_DIR).exists()
    plain = (sweep / cli.SUMMARY).read_text()
    assert cli.main(["analyze", str(sweep)], out=io.StringIO()) == 0
    assert (sweep / cache.CACHE_DIR).is_dir()
    entry = next((sweep / cache.CACHE_DIR).glob("*.h5.npz"))
    stamp = entry.stat().st_mtime_ns
    cached_out = io.StringIO()
    assert cli.main(["analyze", str(sweep)], out=cached_out) == 0
    assert entry.stat().st_mtime_ns == stamp  # used, not written again
    assert (sweep / cli.SUMMARY).read_text() == plain
    assert cached_out.getvalue() == out.getvalue()
    assert loading.load(sweep).cache_stats.hits == 6
    assert loading.load(sweep, use_cache=False).cache_stats.hits == 0


def test_a_sweep_with_layouts_keeps_every_points_collectives(tmp_path: Path) -> None:
    from tests.analysis.test_collectives import SHARDED, _point

    _point(tmp_path, "sharded", 2, 4, (("fsdp", 4), ("tp", 2)), SHARDED)
    _point(tmp_path, "plain", 1, 4, (), [(b"allreduce", b"dp", 3_000_000, 2e-3, 3)])  # no layout: its rows too
    uncached = pipeline.analyse(tmp_path, use_cache=False)
    assert sorted(set(uncached.collectives["axis"])) == ["dp", "fsdp", "tp"]
    pipeline.analyse(tmp_path)
    again = pipeline.analyse(tmp_path)
    assert (again.cache.hits, again.cache.misses, again.cache.written) == (2, 0, 0)
    assert_same(again, uncached)
