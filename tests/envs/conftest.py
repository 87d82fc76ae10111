"""The framework environments built by envs/build.sh, for the tests of this folder.

A test that needs a built environment skips (saying how to build it) unless
HPCBENCH_REQUIRE_ENVS is set, as CI does: then a missing environment fails the test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench import envs
from hpcbench.errors import HpcbenchError

REQUIRED = bool(os.environ.get("HPCBENCH_REQUIRE_ENVS"))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def env_python(name: str) -> Path:
    """The interpreter of environment `name`; skip (or fail, with HPCBENCH_REQUIRE_ENVS) if not built."""
    try:
        return envs.python(name)
    except HpcbenchError as exc:
        if REQUIRED:
            pytest.fail(f"{exc} (HPCBENCH_REQUIRE_ENVS is set)")
        pytest.skip(f"{exc}; set HPCBENCH_REQUIRE_ENVS=1 to make this a failure")


@pytest.fixture
def modern() -> Path:
    return env_python("modern")


@pytest.fixture
def legacy() -> Path:
    return env_python("legacy")


@pytest.fixture
def mpirun() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`mpirun -n N ARGV...` on this host (oversubscribed, as root if need be)."""

    def run(n: int, *argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none", *map(str, argv)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **MPI_ENV},
        )

    return run
