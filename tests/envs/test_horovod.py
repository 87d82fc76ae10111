"""Horovod, as built by envs/build.sh, all-reduces across real MPI ranks in each environment."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("hvd_allreduce.py")

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def results(proc: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # mpirun forwards each rank's output as it comes: find the results wherever they fall.
    lines = [json.loads(found) for found in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)]
    return sorted(lines, key=lambda r: int(str(r["rank"])))


@pytest.mark.parametrize(
    ("env", "framework"),
    [("modern", "torch"), ("modern", "tensorflow"), ("legacy", "mxnet")],
)
def test_allreduce_sums_over_two_mpi_ranks(
    env: str, framework: str, request: pytest.FixtureRequest, mpirun: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    python: Path = request.getfixturevalue(env)
    out = results(mpirun(2, python, SCRIPT, framework))
    # Each rank gave three (rank + 1)s: the sum over ranks 0 and 1 is 1 + 2 = 3 everywhere,
    # on both ranks, and MPI (not a Horovod-local fallback) ran the exchange.
    assert out == [
        {"rank": 0, "size": 2, "mpi": True, "sum": [3.0, 3.0, 3.0]},
        {"rank": 1, "size": 2, "mpi": True, "sum": [3.0, 3.0, 3.0]},
    ]
