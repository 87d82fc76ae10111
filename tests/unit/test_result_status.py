"""What the executors record in a point's result file when the point fails."""

from __future__ import annotations

from pathlib import Path

from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.reader import read_point
from hpcbench.store.status import creating, mark_failed, result_status
from hpcbench.testing.arrays import iterations
from hpcbench.testing.fabricate import write_point_file

POINT = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=2, batch_size=8)


def test_a_failed_point_keeps_its_rows_and_says_why(tmp_path: Path) -> None:
    result = tmp_path / f"{POINT.id}.h5"
    write_point_file(result, POINT, iterations(2, 6), status=schema.STATUS_RUNNING)
    mark_failed(result, "exit code 137; see logs/x.log")
    data = read_point(result)
    assert data.status == schema.STATUS_FAILED and data.attrs["failure"] == "exit code 137; see logs/x.log"
    assert data.iterations.shape == (2, 6)


def test_a_file_the_ranks_were_still_making_is_not_left_behind(tmp_path: Path) -> None:
    # killed between laying out the file and publishing it: only `<id>.h5.new` is there
    result = tmp_path / f"{POINT.id}.h5"
    write_point_file(creating(result), POINT, iterations(2, 0), status=schema.STATUS_RUNNING)
    assert creating(result).name == f"{POINT.id}.h5.new"
    mark_failed(result, "the sweep process ended while this point ran")
    assert not creating(result).exists() and not result.exists()
    assert result_status(result) is None
    mark_failed(result, "again")  # nothing there: nothing to do
