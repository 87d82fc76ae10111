"""`python -m hpcbench.commbench` under real mpirun ranks, its HDF5 file, and α–β fitted on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from hpcbench.analysis.model import linkfit as calibration
from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import ring_allreduce
from hpcbench.errors import HpcbenchError
from hpcbench.rank.collectives import library_version
from hpcbench.testing.mpi import MPI_ENV, run_mpi
from tests.conftest import ROOT, run_module

pytestmark = pytest.mark.mpi

SIZES = [4096, 1 << 20, 16 << 20]  # 4000x apart: the bandwidth term stands out of any load noise


def commbench(n: int, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    sizes = ("--sizes", "4K,1M,16M", "--iters", "10", "--warmup", "2")
    return run_mpi(n, sys.executable, "-m", "hpcbench.commbench", *sizes, "-o", out, *args, cwd=ROOT)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("commbench")
    out = {}
    for n in (2, 3):
        path = base / f"ranks {n}; x.h5"  # a path that would break a shell
        proc = commbench(n, path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"all-reduce, {n} ranks on 1 hosts, mpi" in proc.stdout
        assert proc.stdout.count("\n") >= 2 + len(SIZES)  # header, title row and one row per size
        out[n] = path
    return out


def test_results_as_nccl_tests_defines_them(files: dict[int, Path]) -> None:
    for n, path in files.items():
        rows = calibration.read_commbench(path)
        assert rows["bytes"].tolist() == SIZES
        assert rows["count"].tolist() == [s // 4 for s in SIZES]
        assert (rows["ranks"] == n).all()
        assert (rows["op"] == "allreduce").all()
        assert (rows["time_min_s"] <= rows["time_s"]).all() and (rows["time_s"] <= rows["time_max_s"]).all()
        assert rows["algbw"].to_numpy() == pytest.approx((rows["bytes"] / rows["time_s"]).to_numpy())
        assert rows["busbw"].to_numpy() == pytest.approx(rows["algbw"].to_numpy() * 2 * (n - 1) / n)
        with h5py.File(path, "r") as f:
            assert f.attrs["ranks"] == n
            assert f.attrs["average"] == "avg"
            assert len(f.attrs["hostnames"]) == n
            # which all-reduce the library ran: its version and its collective settings
            assert f.attrs["mpi"] == library_version()
            settings = {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_coll")}
            assert json.loads(f.attrs["mpi_environment"]) == settings
        assert calibration.rules(path) == mpi_rules.library(library_version(), settings)


def test_link_fitted_over_rank_counts_reproduces_the_measurements(files: dict[int, Path]) -> None:
    # Real runs on a loaded 2-core host: what load cannot break. Either the fit tells bandwidth
    # from noise and its line passes through what it was fitted on, or it refuses and says why;
    # never a link of β = 0 (infinite bandwidth). Known α and β are checked on fabricated files below.
    # Ranks beyond the cores time the scheduler, not the link: the fit is held to 1 core per rank.
    dedicated = [path for n, path in files.items() if n <= (os.cpu_count() or 1)]
    try:
        link, refused = calibration.link_from_commbench(dedicated), ""
    except calibration.CalibrationError as exc:
        link, refused = None, str(exc)
    if link is None:
        assert "cannot be told from noise" in refused and " ms" in refused, refused
        return
    assert link.alpha >= 0 and link.beta > 0
    rows = calibration.read_commbench(dedicated[0])
    largest = rows.iloc[-1]
    predicted = ring_allreduce(float(largest["bytes"]), int(largest["ranks"]), link)
    assert 0 < predicted < 10 * float(largest["time_s"])


def test_intra_node_level_from_real_runs(files: dict[int, Path]) -> None:
    for n, path in files.items():
        where = calibration.placement(path)
        assert (where.ranks, where.nodes, where.ranks_per_node, where.level) == (n, 1, n, "intra")
    try:
        fits, refused = calibration.levels_from_commbench([files[2]]), ""
    except calibration.CalibrationError as exc:  # a loaded host: refused with its reason, never β = 0
        fits, refused = {}, str(exc)
    if not fits:
        assert "cannot be told from noise" in refused, refused
        return
    assert set(fits) == {"intra"}
    assert fits["intra"].files == (files[2],) and fits["intra"].link.beta > 0


def test_bad_sizes_exit_2_with_one_line(tmp_path: Path) -> None:
    for sizes, message in (("4K,abc", "'abc' is not a size"), ("6", "not a positive multiple of 4 bytes")):
        res = run_module("hpcbench.commbench", "--sizes", sizes, env=MPI_ENV)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpcbench.commbench: error: --sizes:") and message in lines[0]


def test_single_process_and_foreign_file(tmp_path: Path) -> None:
    out = tmp_path / "one.h5"
    res = run_module("hpcbench.commbench", "--sizes", "1K", "--iters", "3", "-o", str(out), env=MPI_ENV)
    assert res.returncode == 0, res.stderr
    assert calibration.read_commbench(out)["ranks"].tolist() == [1]
    with pytest.raises(HpcbenchError, match="no all-reduce between >= 2 ranks"):
        calibration.link_from_commbench([out])
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1]
    with pytest.raises(HpcbenchError, match="not a commbench file"):
        calibration.read_commbench(foreign)


def test_device_cuda_without_a_gpu_exits_2_with_one_line() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: tests/gpu runs --device cuda for real")
    res = run_module("hpcbench.commbench", "--device", "cuda", "--sizes", "4K", env=MPI_ENV)
    assert res.returncode == 2, res.stderr  # bad input (docs/running.md#outputs-and-exit-codes)
    lines = res.stderr.strip().splitlines()
    assert lines == [
        "hpcbench.commbench: error: --device cuda: no CUDA device is visible to this rank (use --device cpu)"
    ]
