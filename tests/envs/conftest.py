"""The framework environments built by envs/build.sh, for the tests of this folder.

A test that needs a built environment skips (saying how to build it) unless
HPCBENCH_REQUIRE_ENVS is set, as CI does: then a missing environment fails the test.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.testing.mpi import run_mpi
from tests.conftest import env_python


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
        return run_mpi(n, *argv, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "3"})

    return run
