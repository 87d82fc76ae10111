"""Every seed study runs end to end at smoke size on PyTorch: spec -> sweep (real mpirun
ranks) -> analysis -> the paper's table, skipping the cells that cannot run here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

STUDIES = {
    "seed000_scaling.py": ["samples/s", "forward (ms)", "backward (ms)", "model t_iter (ms)", "model error (%)"],
    "seed001_lif.py": ["network", "LIF", "LIF excess (%)", "model t_iter (ms)"],
    "seed002_hyper.py": ["Training Time (s)", "Testing Time (s)", "Accuracy (%)", "CPU user", "CPU system",
                         "CPU iowait", "CPU total", "Memory AVG (MiB)", "Memory MAX (MiB)"],
    "seed003_ps.py": ["architecture", "mode", "samples/s", "comm in flight (%)", "comm exposed (%)", "comm summed (%)"],
    "seed004_horovod.py": ["model", "batch", "images/s, N=1", "images/s, N=2"],
}  # fmt: skip


# The ImageNet-sized CNNs of studies 000 and 004 take seconds per step on two shared cores: their
# smoke runs use LeNet-5 (the pipeline is the same); the others run their own models.
# Study 004's PyTorch cells include Horovod in another environment; its smoke run takes DDP's cell only.
EXTRA = {
    "seed000_scaling.py": ["--models", "lenet"],
    "seed004_horovod.py": ["--models", "lenet", "--frameworks", "torch/gloo"],
}


@pytest.mark.parametrize("script", sorted(STUDIES))
def test_study_runs_at_smoke_size_on_torch(script: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "analysis" / script), "--smoke", "--frameworks", "torch", "--out", str(out),
         *EXTRA.get(script, [])],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
        env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "note: skipped tensorflow/" in proc.stdout  # cells of other frameworks are left out with a note
    table = pd.read_csv(out / "table.csv")
    assert len(table) >= 1
    for column in STUDIES[script]:
        assert column in table.columns, (column, list(table.columns))
    framework = "Framework" if "Framework" in table.columns else "framework"
    assert (table[framework] == "torch").all()
    assert (out / "table.md").read_text().startswith("# Seed 0")
    assert (out / "all" / "report.html").exists()
