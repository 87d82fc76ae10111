"""Shared helpers: run the real command-line tools in subprocesses; hpcbench installed as a user
installs it (`installed`)."""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from hpcbench.errors import HpcbenchError
from hpcbench.plan import envs
from hpcbench.store.reader import PointData, read_point
from hpcbench.testing.installed import Installed, install

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_ENVS = bool(os.environ.get("HPCBENCH_REQUIRE_ENVS"))  # CI: a missing environment fails, not skips
# CI (`CI=true`, as `.ci/run` and most CI services set it): a tier CI must run fails when a part
# it needs is missing (root, a framework environment, Chromium), instead of skipping quietly.
REQUIRED = REQUIRE_ENVS or os.environ.get("CI", "").lower() in ("true", "1")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> Result:
    """`python -m MODULE ARGS` with this interpreter, as a user would run it."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def spec_text(name: str = "t", matrix: dict[str, Any] | None = None, **fixed: Any) -> str:
    """A small, fast sweep spec (few iterations) with overrides."""
    base: dict[str, Any] = {"batch_size": 8, "iterations": 4, "warmup": 1, "model": "lenet"}
    base.update(fixed)
    options = base.pop("options", None)
    for axis in matrix or {}:
        base.pop(axis, None)  # an axis of the matrix is not also fixed
    spec: dict[str, Any] = {"name": name, "executor": "local", "matrix": matrix or {"ranks_per_node": [1]}}
    spec["fixed"] = base
    if options:
        spec["options"] = options
    return yaml.safe_dump(spec)


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """hpcbench `pip install`ed (not editable) from a copy of this checkout, run from a folder
    outside it (the site-install test and the Slurm test of an installed package)."""
    return install(tmp_path_factory.mktemp("install"))


def run_sweep(write_spec: Callable[..., Path], out: Path, text: str, timeout: float = 600) -> list[PointData]:
    """Run `text` through the sweep command as a user would (each point's ranks run in the
    environment the point names) and read its point files back; a failure shows the logs."""
    res = run_module("hpcbench.sweep", str(write_spec(text)), "--out", str(out), timeout=timeout)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((out / "logs").glob("*.log")))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    return [read_point(p) for p in sorted(out.glob("*.h5"))]


@functools.cache
def _env_probe(name: str, modules: tuple[str, ...]) -> tuple[Path | None, str]:
    """Asked once per environment and modules: importing TensorFlow takes seconds."""
    try:
        exe = envs.python(name)
    except HpcbenchError as exc:
        return None, str(exc)
    if modules:
        code = "; ".join(f"import {m}" for m in modules)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        probe = subprocess.run([str(exe), "-c", code], capture_output=True, text=True, timeout=120, env=env)
        if probe.returncode != 0:
            return None, f"environment {name!r} cannot import {', '.join(modules)}: {probe.stderr.strip()[-300:]}"
    return exe, ""


# The quick tier (`pytest -m "not slow"`, docs/testing.md): the tiers that start ranks, clusters,
# labs or framework environments are slow by the folder they live in or their markers; a slower
# test elsewhere says so itself (`pytest.mark.slow`).
SLOW_FOLDERS = frozenset({"mpi", "slurm", "net", "envs", "frameworks", "gpu"})
SLOW_MARKERS = ("mpi", "slurm", "gpu")


# Parallel runs (`pytest -n 2`, pytest-xdist, docs/testing.md): a module's tests stay on one
# worker, so its module-scoped set-up is made once; the tests that start a Slurm cluster (the
# test cluster, the network lab's, both on this host) form one group, run one after another.
# Groups are handed out costliest first, so that no long one starts last.
CLUSTER_FOLDERS = frozenset({"slurm", "net"})
FOLDER_ORDER = ("slurm", "net", "frameworks", "envs", "mpi", "analysis", "cli")


def _folder(item: pytest.Item) -> str:
    try:
        return Path(item.path).resolve().relative_to(Path(__file__).resolve().parent).parts[0]
    except ValueError:  # a test file outside tests/ (pytester's)
        return ""


def _rank(folder: str) -> int:
    return FOLDER_ORDER.index(folder) if folder in FOLDER_ORDER else len(FOLDER_ORDER)


def _lock_files(config: pytest.Config) -> tuple[Path, Path] | None:
    """The turnstile and the lock every worker of this parallel run shares (None: not
    parallel): beside the workers' temporary folders, which pytest removes with old runs."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    base = Path(config.option.basetemp or tempfile.gettempdir()).parent / f"hpcbench-tests-{run}"
    return base.with_suffix(".turnstile"), base.with_suffix(".lock")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked `quiet` (its claim is about a machine's load, a shaped link's rate) runs
    with no other test beside it: under `pytest -n` it takes the lock exclusively, the others
    share it. The turnstile keeps the others from starving it: a test takes the turnstile
    before the lock, and a quiet test holds it until it is done."""
    files = _lock_files(item.config)
    if files is None:
        return (yield)
    quiet = item.get_closest_marker("quiet") is not None
    with files[0].open("a") as turnstile, files[1].open("a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        finally:
            if not quiet:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if quiet:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = _folder(item)
        if folder in SLOW_FOLDERS or any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
        group = "clusters" if folder in CLUSTER_FOLDERS else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: _rank(_folder(item)))  # stable: a module's order is kept


def skip_unless_required(why: str) -> NoReturn:
    """Skip a test whose part is missing here, saying what; under CI (`REQUIRED`) fail instead,
    naming it, so a tier CI must run never passes by skipping."""
    if REQUIRED:
        pytest.fail(f"{why} (CI requires it: CI=true or HPCBENCH_REQUIRE_ENVS is set)")
    pytest.skip(why)


def env_python(name: str, *modules: str) -> Path:
    """The interpreter of environment `name` if it is built and imports `modules`; else the
    test skips, saying how to build it, or fails when HPCBENCH_REQUIRE_ENVS is set (CI)."""
    exe, why = _env_probe(name, modules)
    if exe is None:
        skip_unless_required(f"needs the {name} environment (bash envs/build.sh {name}): {why}")
    return exe
