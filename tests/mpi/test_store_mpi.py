"""Both writers of the shared point file, with real mpirun ranks and real (parallel) HDF5."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.store import schema
from hpcbench.store.reader import read_point
from hpcbench.testing.mpi import run_mpi

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).with_name("write_point.py")


def mpirun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    return run_mpi(n, sys.executable, SCRIPT, *args)


def test_h5py_here_is_built_with_mpi() -> None:
    # The environment (envs/setup.sh) builds parallel h5py; without it the mpio tests below prove nothing.
    assert h5py.get_config().mpi


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("writer", ["mpio", "gather"])
def test_every_rank_rows_land_in_one_file(tmp_path: Path, ranks: int, writer: str) -> None:
    out = tmp_path / "point.h5"
    n_iters, flush_every = 11, 4  # three blocks, the last one short
    proc = mpirun(ranks, str(out), writer, str(n_iters), str(flush_every))
    assert proc.returncode == 0, proc.stderr

    data = read_point(out)
    assert data.complete
    assert data.provenance["writer"] == writer
    assert data.iterations.shape == (ranks, n_iters)
    assert list(data.ranks["rank"]) == list(range(ranks))
    assert len(set(data.ranks["pid"].tolist())) == ranks  # really separate processes
    for r in range(ranks):
        rows = data.iterations[r]
        # write_point.py encodes (rank, iteration) into every row it writes
        np.testing.assert_array_equal(rows["samples"], r * 1000 + np.arange(n_iters))
        np.testing.assert_allclose(rows["forward"], r + np.arange(n_iters) / 100)
    assert data.attrs["iterations_written"] == n_iters


def test_mpio_refused_without_mpi_launcher(tmp_path: Path) -> None:
    # A single process not started by mpirun has no communicator to share the file with.
    out = tmp_path / "p.h5"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "mpio", "3", "3"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "writer 'mpio' asked for but not possible here" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("writer", ["mpio", "gather"])
def test_job_killed_while_making_its_file_leaves_no_result(tmp_path: Path, writer: str) -> None:
    # Killed after the layout was written but before its first flush, HDF5 has not written the
    # superblock yet: such a file is unreadable, so it must never sit at the result path.
    out = tmp_path / "point.h5"
    proc = mpirun(2, str(out), writer, "8", "4", "--die-creating")
    assert proc.returncode != 0
    assert not out.exists(), "an unreadable half-made file at the result path"
    # A rerun replaces what the killed one left and writes a complete file.
    proc = mpirun(2, str(out), writer, "8", "4")
    assert proc.returncode == 0, proc.stderr
    assert read_point(out).complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["point.h5"]


def test_killed_job_leaves_flushed_blocks_readable(tmp_path: Path) -> None:
    out = tmp_path / "point.h5"
    # Rank 1 dies (SIGKILL) after the second block was flushed by everyone.
    proc = mpirun(2, str(out), "mpio", "12", "4", "--die-after-blocks", "2")
    assert proc.returncode != 0
    data = read_point(out)
    assert data.status == schema.STATUS_RUNNING
    assert data.iterations.shape == (2, 8)
    np.testing.assert_array_equal(data.iterations[1]["samples"], 1000 + np.arange(8))
