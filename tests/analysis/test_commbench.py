"""`python -m hpcbench.commbench` under real mpirun ranks, its HDF5 file, and α–β fitted on it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
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


TOLD_FROM_NOISE = 3.0  # standard errors β must stand above 0 (docs/metrics-and-model.md#commbench)


def hand_fit(path: Path) -> tuple[float, float, float]:
    """(α, β, β's standard errors) of a 2-rank file's rows, fitted here by hand. On 2 ranks a
    ring, and Open MPI 4.1's ring and Rabenseifner's alike, cost 2α + nβ for n bytes (Open MPI
    4.1's rules worked out in tests/analysis/test_calibration.py): a straight line in n, fitted
    by ordinary least squares; where its α comes out negative, α = 0 and β is the line's
    through the origin (docs/metrics-and-model.md)."""
    rows = calibration.read_commbench(path)
    assert set(rows["ranks"]) == {2}
    assert calibration.rules(path) in ("open-mpi-4.1", ""), "2α + nβ is worked out for Open MPI 4.1 and a ring"
    n, t = rows["bytes"].to_numpy(dtype=float), rows["time_s"].to_numpy(dtype=float)
    slope, intercept = (float(v) for v in np.polyfit(n, t, 1))
    residual = t - (intercept + slope * n)
    se = math.sqrt(float(residual @ residual) / (len(n) - 2) / float(((n - n.mean()) ** 2).sum()))
    told = slope / se if se > 0 else math.inf
    if intercept < 0:
        return 0.0, float(n @ t) / float(n @ n), told
    return intercept / 2, slope, told


def test_link_fitted_on_real_runs_is_the_line_through_the_measurements(files: dict[int, Path]) -> None:
    # Real runs on a loaded 2-core host: how fast its shared memory is, load decides, so the truth
    # is the measured times themselves, fitted by hand above. Ranks beyond the cores time the
    # scheduler, not the link: the fit is held to 1 core per rank, the 2-rank file here. The
    # outcome is decided by the data, not by load: the fit must return the hand fit's α and β
    # (the same rows: agreement to rounding), and may refuse only where the hand fit's β stands
    # under 3 standard errors (a loaded host's small sizes slow enough to hide the bandwidth).
    dedicated = [path for n, path in files.items() if n <= (os.cpu_count() or 1)]
    assert dedicated == [files[2]]
    alpha, beta, told = hand_fit(files[2])
    if beta <= 0 or told < TOLD_FROM_NOISE:
        with pytest.raises(calibration.CalibrationError, match="cannot be told from noise") as info:
            calibration.link_from_commbench(dedicated)
        assert " ms" in str(info.value) and "standard errors" in str(info.value)
        return
    link = calibration.link_from_commbench(dedicated)
    assert link.alpha == pytest.approx(alpha, rel=1e-6, abs=1e-12) and link.beta == pytest.approx(beta, rel=1e-6)
    # and the line gives back the largest size's measured time: of any rows the fit accepts, within
    # about 1 % (that size's leverage is about 1); 5 % is beyond what any scatter of the others moves it
    largest = calibration.read_commbench(files[2]).iloc[-1]
    predicted = ring_allreduce(float(largest["bytes"]), 2, link)
    assert predicted == pytest.approx(2 * alpha + float(largest["bytes"]) * beta, rel=1e-6)
    assert predicted == pytest.approx(float(largest["time_s"]), rel=0.05)


def test_intra_node_level_from_real_runs(files: dict[int, Path]) -> None:
    for n, path in files.items():
        where = calibration.placement(path)
        assert (where.ranks, where.nodes, where.ranks_per_node, where.level) == (n, 1, n, "intra")
    alpha, beta, told = hand_fit(files[2])
    if beta <= 0 or told < TOLD_FROM_NOISE:  # refused where the hand fit cannot tell β from noise, and only there
        with pytest.raises(calibration.CalibrationError, match="cannot be told from noise"):
            calibration.levels_from_commbench([files[2]])
        return
    fits = calibration.levels_from_commbench([files[2]])
    assert set(fits) == {"intra"}
    assert fits["intra"].files == (files[2],)
    assert fits["intra"].link.alpha == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert fits["intra"].link.beta == pytest.approx(beta, rel=1e-6)
    assert fits["intra"].beta_t == pytest.approx(told, rel=1e-6)


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
