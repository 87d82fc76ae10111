"""Shared helpers: run the real command-line tools in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


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
