"""Point files that cannot be read — truncated, foreign, from a future version, damaged —
give a clear error naming the file; `analyze` skips them with a warning and reports the rest."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest

from hpcbench.errors import SchemaError
from hpcbench.store.reader import read_point
from tests.conftest import run_module, spec_text

pytestmark = pytest.mark.mpi  # the good file comes from a real (1-rank) run


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("good")
    spec = base / "spec.yaml"
    spec.write_text(spec_text("good", framework="synthetic", backend="none", model="sleep", iterations=20))
    res = run_module("hpcbench.sweep", str(spec), "--out", str(base / "sweep"))
    assert res.returncode == 0, res.stderr
    (path,) = (base / "sweep").glob("*.h5")
    assert read_point(path).complete
    return path


def truncated(good: Path, dest: Path) -> None:
    data = good.read_bytes()
    dest.write_bytes(data[: len(data) // 2])


def empty(good: Path, dest: Path) -> None:
    dest.write_bytes(b"")


def not_hdf5(good: Path, dest: Path) -> None:
    dest.write_text("point,framework\n1,torch\n")


def foreign(good: Path, dest: Path) -> None:
    with h5py.File(dest, "w") as f:
        f["data"] = [1, 2, 3]
        f.attrs["creator"] = "someone else"


def future(good: Path, dest: Path) -> None:
    shutil.copy(good, dest)
    with h5py.File(dest, "r+") as f:
        f.attrs["schema_version"] = 99


def no_iterations(good: Path, dest: Path) -> None:
    shutil.copy(good, dest)
    with h5py.File(dest, "r+") as f:
        del f["iterations"]


def wrong_fields(good: Path, dest: Path) -> None:
    shutil.copy(good, dest)
    with h5py.File(dest, "r+") as f:
        n_ranks, n = f["iterations"].shape
        del f["iterations"]
        f.create_dataset("iterations", shape=(n_ranks, n), dtype=[("t_start", "<f8")])


def bad_point_json(good: Path, dest: Path) -> None:
    shutil.copy(good, dest)
    with h5py.File(dest, "r+") as f:
        f["point"].attrs["json"] = '{"framework": "torch", "no_such_field": 1}'


CASES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "truncated": (truncated, "not a readable HDF5 file"),
    "empty": (empty, "not a readable HDF5 file"),
    "not_hdf5": (not_hdf5, "not a readable HDF5 file"),
    "foreign": (foreign, "not an hpcbench point file"),
    "future": (future, "written with schema 99, this hpcbench reads up to"),
    "no_iterations": (no_iterations, "damaged point file"),
    "wrong_fields": (wrong_fields, "iterations lack the fields"),
    "bad_point_json": (bad_point_json, "damaged point file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unreadable_file_gives_a_clear_error(case: str, good: Path, tmp_path: Path) -> None:
    make, message = CASES[case]
    path = tmp_path / f"{case}.h5"
    make(good, path)
    with pytest.raises(SchemaError) as info:
        read_point(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_analyze_skips_bad_points_with_a_warning_and_reports_the_rest(good: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copy(good, sweep / good.name)
    for case, (make, _) in CASES.items():
        make(good, sweep / f"{case}.h5")
    res = run_module("hpcbench.analyze", str(sweep))
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: skipped")]
    assert len(warnings) == len(CASES)
    for case in CASES:
        assert any(f"{case}.h5" in w for w in warnings), case
    assert "Traceback" not in res.stderr
    rows = (sweep / "summary.csv").read_text().strip().splitlines()
    assert len(rows) == 2 and rows[1].startswith(good.stem)


def test_messages_of_iterations_not_counted_are_not_read(tmp_path: Path) -> None:
    """A job that died inside a flush: its messages appended, the block's iterations not yet
    counted in `iterations_written` (the soak's 30 s outage struck there once). The reader
    gives the messages of the iterations written, none of the others."""
    from hpcbench.spec import Point
    from hpcbench.store import schema
    from hpcbench.testing.arrays import comm_rows, iterations
    from hpcbench.testing.fabricate import write_point_file

    rows = [(rank, i, 1024, i + 0.1, i + 0.2) for rank in (0, 1) for i in range(4)]
    path = write_point_file(
        tmp_path / "died.h5", Point(ranks_per_node=2), iterations(2, 4), comm=comm_rows(rows),
        status=schema.STATUS_FAILED,
    )  # fmt: skip
    with h5py.File(path, "r+") as f:
        f.attrs["iterations_written"] = 2  # the second block's rows never counted
    data = read_point(path)
    assert data.iterations.shape == (2, 2)
    assert sorted(data.comm["iteration"].tolist()) == [0, 0, 1, 1]
