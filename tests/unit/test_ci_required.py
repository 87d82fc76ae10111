"""A tier CI must run fails under CI instead of skipping (`skip_unless_required`); elsewhere it
skips, saying what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BODY = """
from tests.conftest import skip_unless_required

def test_needs_a_part():
    skip_unless_required("the network lab needs root")
"""


@pytest.mark.parametrize(
    ("ci", "require_envs", "failed"),
    [("", "", False), ("true", "", True), ("", "1", True)],
)
def test_a_missing_part_skips_here_and_fails_under_ci(tmp_path: Path, ci: str, require_envs: str, failed: bool) -> None:
    test = tmp_path / "test_part.py"
    test.write_text(BODY)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HPCBENCH_REQUIRE_ENVS")}
    env.update(
        PYTHONPATH=str(ROOT),
        **({"CI": ci} if ci else {}),
        **({"HPCBENCH_REQUIRE_ENVS": require_envs} if require_envs else {}),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(test), "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "the network lab needs root" in out, out
    if failed:
        assert proc.returncode == 1 and "1 failed" in out and "CI requires it" in out, out
    else:
        assert proc.returncode == 0 and "1 skipped" in out, out
