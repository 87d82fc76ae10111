"""The batch scripts a Slurm sweep submits, one golden file per launcher (from --dry-run).

Refresh after an intended change with:  HPCBENCH_UPDATE_GOLDEN=1 python -m pytest tests/slurm/test_sbatch_golden.py
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_module, spec_text

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("launcher", "device"), [("srun", "cpu"), ("mpirun", "cpu"), ("torchrun", "cpu"), ("srun", "cuda")]
)
def test_sbatch_script_matches_golden(
    write_spec: Callable[..., Path], tmp_path: Path, launcher: str, device: str
) -> None:
    backend = "nccl" if device == "cuda" else "gloo"
    text = spec_text("golden", {"nodes": [2]}, launcher=launcher, ranks_per_node=4, device=device, backend=backend)
    text = text.replace(
        "executor: local",
        "executor: slurm\nprofile: testcluster\nslurm: {account: proj, time: '1:30:00', additional: {mail-type: END}}",
    )
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(write_spec(text)), "--out", str(out), "--dry-run")
    assert res.returncode == 0, res.stderr
    (script,) = sorted(out.glob("job-*.sbatch"))
    actual = script.read_text().replace(str(out), "SWEEP_DIR").replace(sys.executable, "PYTHON")
    golden = GOLDEN / f"{launcher}-{device}.sbatch"
    if os.environ.get("HPCBENCH_UPDATE_GOLDEN"):
        golden.write_text(actual)
    assert golden.exists(), f"no golden file {golden}; create it with HPCBENCH_UPDATE_GOLDEN=1"
    assert actual == golden.read_text(), (
        f"{golden.name} differs from what a dry run writes now; if the change is intended, refresh with "
        "HPCBENCH_UPDATE_GOLDEN=1 python -m pytest tests/slurm/test_sbatch_golden.py"
    )
    assert not list(out.glob("*.h5")) and not (out / "manifest.json").exists()  # nothing submitted
