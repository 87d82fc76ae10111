"""envs/build.sh is idempotent: run again with everything in place, it only checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpcbench.plan import envs

pytestmark = pytest.mark.slow
BUILD = envs.ROOT / "envs" / "build.sh"


def build(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), name], capture_output=True, text=True, timeout=1800, env=os.environ)


def snapshot(env_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of the environment (bytecode caches aside): size and modification time."""
    found = {}
    for path in env_dir.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            found[str(path.relative_to(env_dir))] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.mark.parametrize("name", ["modern", "legacy"])
def test_second_build_only_checks_and_changes_nothing(name: str, request: pytest.FixtureRequest) -> None:
    python: Path = request.getfixturevalue(name)
    env_dir = python.parent.parent
    first = build(name)  # brings the environment up to date if this checkout changed its inputs
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(env_dir)
    second = build(name)
    assert second.returncode == 0, second.stderr[-3000:]
    lines = second.stderr.splitlines()
    assert f"[build] up to date: {env_dir} (inputs unchanged; checking it)" in lines
    work = ("[build] installing", "[build] building", "[build] creating")
    assert not [line for line in lines if line.startswith(work)]
    assert lines[-1].startswith(f"[build] ready: {name} ({python}): ")
    assert "horovod 0.28.1 (gloo, mpi)" in lines[-1]
    assert "(parallel HDF5)" in lines[-1]
    after = snapshot(env_dir)
    assert after == before
