"""A real Slurm cluster (controller, slurmdbd + MariaDB, four slurmd) on this host, started once
per test session by slurm/testcluster/start.sh and stopped at the end."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbench.sweepdir.manifest import ACTIVE, Manifest
from tests.conftest import ROOT, Result, run_module, spec_text

STATE_DIR = "/tmp/hpcbench-slurm-tests"
MAX_ARRAY_SIZE = 4  # small, so that array splitting is exercised by a handful of points


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    env = {
        **os.environ,
        "HPCBENCH_SLURM_DIR": STATE_DIR,
        "HPCBENCH_SLURM_PORT_BASE": "17800",
        "HPCBENCH_SLURM_MAX_ARRAY_SIZE": str(MAX_ARRAY_SIZE),
    }
    start = ROOT / "slurm" / "testcluster" / "start.sh"
    proc = subprocess.run(
        ["bash", str(start), "-n", "4", "--fresh"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, f"test cluster did not start:\n{proc.stderr[-3000:]}"
    conf = proc.stdout.strip().removeprefix("export SLURM_CONF=")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield conf
    finally:
        stop = ROOT / "slurm" / "testcluster" / "stop.sh"
        subprocess.run(["bash", str(stop), "-d", STATE_DIR, "--purge"], capture_output=True, env=env, timeout=120)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def wait_until_finished(directory: Path, timeout: float = 300) -> Result:
    """`status --wait`, bounded: fails the test rather than hanging it."""
    res = run_module("hpcbench.sweep", "status", str(directory), "--wait", "--interval", "1", timeout=timeout)
    assert not any(e.state in ACTIVE for e in Manifest.load(directory).entries.values())
    return res


def wait_for_state(directory: Path, point_id: str, state: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run_module("hpcbench.sweep", "status", str(directory))
        if Manifest.load(directory).entries[point_id].state == state:
            return
        time.sleep(1)
    raise AssertionError(f"point {point_id} did not reach {state} in {timeout} s")


def slurm_spec(name: str, matrix: dict[str, object], **fixed: object) -> str:
    """A small spec (tests.conftest.spec_text) submitted to the test cluster."""
    text = spec_text(name, matrix, **fixed)
    return text.replace("executor: local", "executor: slurm\nprofile: testcluster")
