"""Real MPI ranks on this host, as the tests and benchmarks start them: `mpirun -n N`,
oversubscribed (more ranks than cores) and unbound, allowed to run as root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# mpirun refuses to run as root without both (containers and CI run as root).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpirun_argv(n: int, *argv: str | Path) -> list[str]:
    """`mpirun -n N ARGV...` for this host, whatever its number of cores."""
    return ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none", *map(str, argv)]


def run_mpi(
    n: int,
    *argv: str | Path,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` on N ranks, its output captured as text."""
    return subprocess.run(
        mpirun_argv(n, *argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **MPI_ENV, **(env or {})},
    )
