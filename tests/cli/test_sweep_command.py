"""The command-line contract: plans, dry runs, and bad input that creates nothing."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_module, spec_text

BAD_SPECS = {
    "unknown field": ("name: x\nfixed: {batch: 3}\n", "fixed.batch: unknown field"),
    "bad value": ("name: x\nmatrix: {ranks_per_node: [1, 0]}\n", "matrix.ranks_per_node[1]: 0 is too small"),
    "unknown framework": ("name: x\nfixed: {framework: torch7}\n", "fixed.framework: 'torch7' is not known"),
    "unknown backend": ("name: x\nfixed: {backend: horovodx}\n", "fixed.backend: 'horovodx' is not a backend"),
    "nccl on cpu": ("name: x\nfixed: {backend: nccl}\n", "nccl needs device: cuda"),
    "unknown launcher": ("name: x\nfixed: {launcher: srunx}\n", "fixed.launcher: 'srunx' is not known"),
    "yaml": ("name: x\nmatrix: [1, 2\n", "is not valid YAML"),
    "not a mapping": ("- 1\n- 2\n", "spec: is not a mapping"),
    "unknown top key": ("name: x\nmatirx: {}\n", "matirx: unknown key"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_invalid_spec_exits_2_with_one_line_and_creates_nothing(
    write_spec: Callable[..., Path], tmp_path: Path, case: str
) -> None:
    text, message = BAD_SPECS[case]
    spec = write_spec(text)
    out = tmp_path / "out"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("hpcbench.sweep: error: ")
    assert message in lines[0]
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_invalid_spec_with_default_output_creates_nothing(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec("name: quick\nfixed: {iterations: -1}\n")
    res = run_module("hpcbench.sweep", str(spec))
    assert res.returncode == 2
    assert not (ROOT / "runs" / "quick").exists()


def test_missing_spec_file(tmp_path: Path) -> None:
    res = run_module("hpcbench.sweep", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2
    assert "nope.yaml: cannot be read" in res.stderr


def test_dry_run_prints_points_and_exact_argv_and_runs_nothing(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "my out; $(touch pwned)"
    spec = write_spec(spec_text("dry", {"ranks_per_node": [1, 2], "launcher": ["mpirun", "torchrun"]}))
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "4 points" in res.stdout
    commands = [line for line in res.stdout.splitlines() if "hpcbench.worker" in line]
    assert len(commands) == 4
    mpirun_lines = [c for c in commands if " mpirun -n 2 " in c]
    assert len(mpirun_lines) == 1
    # the printed command is exact, shell-quoted argv: it parses back to the run file path
    argv = shlex.split(mpirun_lines[0].split(": ", 1)[1])
    assert argv[-1].endswith(".json") and "my out; $(touch pwned)/points/" in argv[-1]
    assert any("torch.distributed.run" in c and "--nproc-per-node 2" in c for c in commands)
    assert not out.exists()
    assert not (ROOT / "pwned").exists()


def test_verbose_prints_each_argv_it_runs(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "s"
    res = run_module("hpcbench.sweep", "-v", str(write_spec(spec_text("v"))), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [line for line in res.stdout.splitlines() if line.startswith("+ mpirun -n 1 ")]
    assert len(runs) == 1 and runs[0].endswith(".json")


def test_other_sweep_in_the_same_directory_is_refused(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert run_module("hpcbench.sweep", str(write_spec(spec_text("first"))), "--out", str(out)).returncode == 0
    manifest = (out / "manifest.json").read_text()
    res = run_module("hpcbench.sweep", str(write_spec(spec_text("second"), "b.yaml")), "--out", str(out))
    assert res.returncode == 2  # bad input (docs/running.md#outputs-and-exit-codes)
    assert "holds sweep 'first', not 'second'" in res.stderr
    assert (out / "manifest.json").read_text() == manifest


def test_status_lists_every_point(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert run_module("hpcbench.sweep", str(write_spec(spec_text("st"))), "--out", str(out)).returncode == 0
    res = run_module("hpcbench.sweep", "status", str(out))
    assert res.returncode == 0
    assert "1 done" in res.stdout and "torch/gloo lenet 1x1 b=8" in res.stdout


def test_analyze_refuses_a_directory_without_results(tmp_path: Path) -> None:
    res = run_module("hpcbench.analyze", str(tmp_path))
    assert res.returncode == 2  # bad input (docs/running.md#outputs-and-exit-codes)
    assert "no complete point files" in res.stderr


def test_second_submission_into_a_busy_directory_stops_with_a_clear_message(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    import subprocess
    import sys
    import time

    out = tmp_path / "s"
    spec = write_spec(spec_text("busy", iterations=100_000))
    first = subprocess.Popen(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / "logs").exists() and time.monotonic() < deadline:  # the first one is running its point
            time.sleep(0.2)
        manifest = (out / "manifest.json").read_text()
        res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
        assert res.returncode == 2  # the command cannot do what it was asked: bad input
        assert f"{out} is in use by another hpcbench.sweep (pid {first.pid})" in res.stderr
        assert (out / "manifest.json").read_text() == manifest
    finally:
        first.terminate()
        first.wait(timeout=60)
