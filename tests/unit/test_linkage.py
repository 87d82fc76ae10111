"""The build record and the run-time comparison (hpcbench.rank.linkage), on this interpreter.

The record is made by the real command (`python -m hpcbench.rank.linkage record`) in a
subprocess, and compared in subprocesses too: loading mpi4py.MPI without initialising MPI
must not happen in the test process, whose other tests may want MPI initialised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcbench.rank import linkage

OTHER_MPI = "MPICH Version: 4.1.2 MPICH Release date: Wed Jun  7 15:22:45 CDT 2023"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcbench.rank.linkage", *args], capture_output=True, text=True, timeout=120, cwd="/"
    )


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build record of this interpreter, as envs/setup.sh writes it."""
    proc = run("record", "--compiler", "gcc (Debian 12.2.0-14) 12.2.0", "--mpicc", "/usr/bin/mpicc")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path_factory.mktemp("build") / linkage.BUILD_RECORD
    path.write_text(proc.stdout)
    return path


def built(record: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(record.read_text())
    return data


def test_the_record_names_the_libraries_this_interpreter_loads(record: Path) -> None:
    import h5py

    data = built(record)
    assert data["version"] == linkage.RECORD_VERSION
    assert data["hdf5_version"] == h5py.version.hdf5_version
    assert data["hdf5_parallel"] == bool(h5py.get_config().mpi)
    assert data["h5py"] == h5py.__version__
    assert data["compiler"] == "gcc (Debian 12.2.0-14) 12.2.0"
    assert data["mpicc"] == "/usr/bin/mpicc"
    # this machine has Open MPI: the library's own version string and the file it was loaded from
    assert data["mpi_library"].startswith("Open MPI v")
    assert Path(data["mpi_path"]).name.startswith("libmpi.so")
    assert Path(data["hdf5_path"]).name.startswith("libhdf5")


def test_a_matching_record_gives_no_reason(record: Path) -> None:
    proc = run("check", str(record))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"agrees with {record}: MPI 'Open MPI v")
    code = "import sys, pathlib, hpcbench.rank.linkage as l; print(l.mismatch(pathlib.Path(sys.argv[1])))"
    same = subprocess.run([sys.executable, "-c", code, str(record)], capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    assert same.stdout.strip() == "None"


def test_a_record_of_another_build_gives_one_line_naming_both(record: Path, tmp_path: Path) -> None:
    data = built(record)
    other = {**data, "mpi_library": OTHER_MPI, "mpi_path": "/opt/mpich/lib/libmpi.so.12"}
    other.update(hdf5_version="1.14.6", hdf5_parallel=not data["hdf5_parallel"], hdf5_path="/opt/hdf5/lib/libhdf5.so")
    path = tmp_path / linkage.BUILD_RECORD
    path.write_text(json.dumps(other))
    proc = run("check", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = proc.stdout.strip()
    assert "\n" not in reason
    assert f"built with '{OTHER_MPI}' (/opt/mpich/lib/libmpi.so.12)" in reason
    assert f"this rank loads '{data['mpi_library']}' ({data['mpi_path']})" in reason
    assert "built with HDF5 1.14.6" in reason
    assert f"this rank loads HDF5 {data['hdf5_version']}" in reason
    assert "envs/setup.sh" in reason


def test_without_mpi_loaded_only_hdf5_is_compared_unless_asked(record: Path, tmp_path: Path) -> None:
    """A rank that does not use MPI (torchrun) is not made to load it, nor to leave it
    uninitialised for a framework that initialises it later."""
    path = tmp_path / linkage.BUILD_RECORD
    path.write_text(json.dumps({**built(record), "mpi_library": OTHER_MPI}))
    code = (
        "import sys, pathlib, hpcbench.rank.linkage as l; p = pathlib.Path(sys.argv[1])\n"
        "print(l.mismatch(p)); print('mpi4py.MPI' in sys.modules); print(l.mismatch(p, load_mpi=True))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, loaded, asked = proc.stdout.splitlines()
    assert (first, loaded) == ("None", "False")
    assert asked.startswith(f"MPI library differs from the build: built with '{OTHER_MPI}'")


def test_no_record_no_reason(tmp_path: Path) -> None:
    assert linkage.mismatch(tmp_path / linkage.BUILD_RECORD) is None
    assert linkage.record_path(tmp_path) == tmp_path / "hpcbench-build.json"
    proc = run("check", str(tmp_path / "absent.json"))
    assert proc.returncode == 0
    assert "no build record" in proc.stderr


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    path = tmp_path / linkage.BUILD_RECORD
    path.write_text('{"mpi_library": ')
    reason = linkage.mismatch(path)
    assert reason is not None
    assert reason.startswith(f"build record {path} is not JSON")
    path.write_text("[1, 2]")
    assert "holds list, not an object" in str(linkage.mismatch(path))


def test_compare_names_an_mpi_that_does_not_load() -> None:
    built_with: dict[str, Any] = {"mpi_library": "Open MPI v4.1.4", "mpi_path": "/usr/lib/libmpi.so.40"}
    built_with.update(hdf5_version="1.10.8", hdf5_parallel=True)
    now: dict[str, Any] = {"mpi_library": None, "mpi_error": "RuntimeError: cannot load MPI library"}
    now.update(hdf5_version="1.10.8", hdf5_parallel=True)
    reason = linkage.compare(built_with, now)
    assert reason is not None
    assert "built with 'Open MPI v4.1.4' (/usr/lib/libmpi.so.40)" in reason
    assert "this rank loads none (RuntimeError: cannot load MPI library)" in reason
    assert "HDF5" not in reason.split("(load")[0]
    assert linkage.compare(built_with, {**now, "mpi_library": "Open MPI v4.1.4"}) is None


def test_a_build_without_mpi_compares_only_hdf5() -> None:
    built_with = {"mpi_library": None, "hdf5_version": "1.14.6", "hdf5_parallel": False}
    now = {"mpi_library": "Open MPI v4.1.4", "hdf5_version": "1.14.6", "hdf5_parallel": False}
    assert linkage.compare(built_with, now) is None
