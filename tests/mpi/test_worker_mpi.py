"""The whole path on real parts: sweep CLI -> mpirun / torchrun ranks -> PyTorch DDP over gloo
-> one shared HDF5 file per point -> read back."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hpcbench.analysis import metrics
from hpcbench.store import PHASES
from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, Manifest
from tests.conftest import run_module, spec_text

pytestmark = pytest.mark.mpi


def check_point_file(data: PointData, ranks: int, iterations: int, warmup: int) -> None:
    assert data.complete
    it = data.iterations
    assert it.shape == (ranks, iterations + warmup), "every rank's rows present"
    assert sorted(data.ranks["rank"].tolist()) == list(range(ranks))
    assert len(set(data.ranks["pid"].tolist())) == ranks
    durations = it["t_end"] - it["t_start"]
    assert (durations > 0).all()
    assert (it["t_start"] > 0).all(), "times are on the common clock, after the file's epoch"
    phases = sum(it[p] for p in PHASES)
    assert (phases <= durations + 1e-9).all(), "phases are disjoint parts of the iteration"
    for p in ("data", "forward", "backward", "update"):
        assert (it[p] > 0).all(), p
    assert (it["samples"] == data.point.batch_size).all()
    assert np.isfinite(it["loss"]).all()
    assert it["warmup"][:, :warmup].all() and not it["warmup"][:, warmup:].any()
    # iterations of one rank follow each other
    assert (np.diff(it["t_start"], axis=1) > 0).all()
    assert data.provenance["hostnames"] and len(data.provenance["hostnames"]) == ranks
    assert data.provenance["torch"].startswith("2.")
    # torch heeds `threads`: the threads the model counts are the point's (none said: absent)
    assert data.provenance.get("compute_threads") == data.point.threads
    assert data.attrs["spec"].startswith("executor: local") or "name:" in data.attrs["spec"]


@pytest.mark.parametrize(("ranks", "writer"), [(2, "mpio"), (4, "mpio"), (2, "gather")])
def test_mpirun_ranks_write_one_shared_file(
    write_spec: Callable[..., Path], tmp_path: Path, ranks: int, writer: str
) -> None:
    spec = write_spec(spec_text("mpi", {"ranks_per_node": [ranks]}, options={"writer": writer, "flush_every": 3}))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    (h5,) = [p for p in out.glob("*.h5")]
    data = read_point(h5)
    check_point_file(data, ranks, iterations=4, warmup=1)
    assert data.provenance["writer"] == writer
    assert data.provenance["launcher_source"] == "openmpi"
    # gradients were exchanged: every rank timed all-reduce messages
    assert (data.iterations["comm_total"] > 0).all()
    assert Manifest.load(out).entries[data.point_id].state == DONE


def test_torchrun_ranks_write_through_one_writer(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(spec_text("trun", {"ranks_per_node": [2]}, launcher="torchrun"))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    (h5,) = list(out.glob("*.h5"))
    data = read_point(h5)
    check_point_file(data, 2, iterations=4, warmup=1)
    assert data.provenance["writer"] == "gather"  # no MPI under torchrun: gathered over gloo
    assert data.provenance["launcher_source"] == "torchrun"


def test_exception_on_one_rank_ends_the_job(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    # Rank 1 raises at iteration 3 of 10000: the others must not wait forever in all-reduce.
    spec = write_spec(spec_text("fault", {"ranks_per_node": [2]}, iterations=10_000, options={"flush_every": 2}))
    out = tmp_path / "sweep"
    t0 = time.monotonic()
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"HPCBENCH_FAULT": "1:3"}, timeout=120)
    assert time.monotonic() - t0 < 90
    assert res.returncode == 1
    manifest = Manifest.load(out)
    (entry,) = manifest.entries.values()
    assert entry.state == FAILED
    assert "exit code" in entry.reason and entry.log in entry.reason
    log = (out / entry.log).read_text()
    assert "HPCBENCH_FAULT: rank 1 fails at iteration 3" in log
    # the blocks flushed before the failure are kept, marked failed
    data = read_point(out / entry.result)
    assert data.status == "failed"
    assert data.iterations.shape == (2, 2)


def test_quickstart_shape_sweep_and_scaling_table(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(spec_text("scale", {"ranks_per_node": [1, 2, 4]}, iterations=6, warmup=2))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_module("hpcbench.analyze", str(out))
    assert res.returncode == 0, res.stderr
    with (out / "summary.csv").open(newline="") as f:  # quoted fields: the notes hold commas
        rows = list(csv.DictReader(f))
    for column in ("point", "framework", "backend", "model", "nodes", "ranks_per_node", "ranks", "batch_size",
                   "t_iter_s", "throughput", "speedup", "efficiency", "lif"):  # fmt: skip
        assert column in rows[0]
    assert len(rows) == 3
    assert [int(r["ranks"]) for r in rows] == [1, 2, 4]
    # The table's numbers are the metrics of the stored measurements of all ranks.
    for r in rows:
        data = read_point(out / f"{r['point']}.h5")
        t = metrics.t_iter(data.iterations)
        assert float(r["t_iter_s"]) == pytest.approx(t)
        assert float(r["throughput"]) == pytest.approx(int(r["ranks"]) * 8 / t)
    assert float(rows[0]["speedup"]) == pytest.approx(1.0)
    assert float(rows[2]["efficiency"]) == pytest.approx(
        float(rows[2]["throughput"]) / (4 * float(rows[0]["throughput"]))
    )
    # a second run finds every point done and rewrites nothing
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.h5")}
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0
    assert res.stdout.count("done already") == 3
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("*.h5")}


def test_a_stalled_rank_is_caught_by_the_watchdog(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = spec_text(
        "stall", {"ranks_per_node": [2]}, framework="synthetic", backend="none", model="sleep",
        iterations=100_000, warmup=0, extra={"forward_s": 0.001}, options={"stall_timeout_s": 3, "flush_every": 50},
    )  # fmt: skip
    spec = write_spec(text)
    out = tmp_path / "sweep"
    t0 = time.monotonic()
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"HPCBENCH_FAULT": "1:20:stall"}, timeout=120)
    assert time.monotonic() - t0 < 60
    assert res.returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == FAILED
    assert "stalled: no iteration finished for" in entry.reason
    assert "(limit 3 s" in entry.reason
    data = read_point(out / entry.result)
    assert data.status == "failed"
    assert data.iterations.shape == (2, 0)  # nothing flushed: rank 1 stalled before the first block


def test_failing_rank_reason_names_the_error(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(spec_text("why", {"ranks_per_node": [2]}, iterations=50))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"HPCBENCH_FAULT": "0:2"})
    assert res.returncode == 1
    (entry,) = Manifest.load(out).entries.values()
    assert "rank 0 of point" in entry.reason
    assert "InjectedFault: HPCBENCH_FAULT: rank 0 fails at iteration 2" in entry.reason
