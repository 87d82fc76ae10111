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


# What each study's inputs fix at smoke size on torch/gloo (the study's YAML through
# analysis/study.py's smoke(): the first value of each other axis, at most 2 ranks, batches at
# most 4; and EXTRA above): its table's rows in order, worked out by hand.
ROWS = {
    "seed000_scaling.py": {"framework": ["torch"] * 2, "backend": ["gloo"] * 2, "model": ["lenet"] * 2, "N": [1, 2],
                           "batch": [4, 4]},
    "seed001_lif.py": {"network": ["CNN"] * 2, "model": ["cifar10_quick"] * 2, "framework": ["torch"] * 2,
                       "backend": ["gloo"] * 2, "N": [1, 2]},
    "seed002_hyper.py": {"Framework": ["torch"], "#THREADS": [1], "Batch Size": [4], "LR": [0.01], "#Epochs": [1]},
    "seed003_ps.py": {"framework": ["torch"], "backend": ["gloo"], "architecture": ["all-reduce"], "mode": ["sync"],
                      "N": [2]},
    "seed004_horovod.py": {"framework": ["torch"], "backend": ["gloo"], "model": ["lenet"], "batch": [2],
                           "largest N": [2]},
}  # fmt: skip


def check_values(script: str, table: pd.DataFrame) -> None:
    """The measured columns against what the definitions (docs/metrics-and-model.md) make of the
    inputs: throughput N·b / t_iter, speedup and efficiency against the one-rank point, one
    rank's LIF 1, CPU total the sum of its parts, an accuracy on synthetic data said to be one."""
    rel = 1e-9
    if script == "seed000_scaling.py":
        rate = table["samples/s"].to_numpy()
        assert rate == pytest.approx((table["N"] * table["batch"] / (table["t_iter (ms)"] / 1e3)).to_numpy(), rel=rel)
        assert table["speedup"].tolist() == pytest.approx([1.0, rate[1] / rate[0]], rel=rel)
        assert table["efficiency (%)"].tolist() == pytest.approx([100.0, 100 * rate[1] / (2 * rate[0])], rel=rel)
    elif script == "seed001_lif.py":
        assert table["LIF"].iloc[0] == 1.0  # one rank: the slowest is the mean
        assert table["LIF"].iloc[1] >= 1.0
        assert table["LIF excess (%)"].to_numpy() == pytest.approx(100 * (table["LIF"] - 1).to_numpy(), abs=1e-9)
    elif script == "seed002_hyper.py":
        parts = table["CPU user"] + table["CPU system"] + table["CPU iowait"]
        assert table["CPU total"].to_numpy() == pytest.approx(parts.to_numpy(), rel=rel)
        # no --data-dir: synthetic data stands in for MNIST, and the accuracy says it was measured on it
        assert table["Accuracy (%)"].astype(str).str.endswith("synthetic data)").all(), table["Accuracy (%)"].tolist()
        assert (table["Training Time (s)"] > 0).all()
        assert ((table["Memory AVG (MiB)"] > 0) & (table["Memory AVG (MiB)"] <= table["Memory MAX (MiB)"])).all()
    elif script == "seed003_ps.py":
        assert table["samples/s"].to_numpy() == pytest.approx(2 * 4 / (table["t_iter (ms)"] / 1e3).to_numpy(), rel=rel)
        assert table["slower than best sync (x)"].tolist() == [1.0]  # the one synchronous system is the best
    elif script == "seed004_horovod.py":
        one, two = float(table["images/s, N=1"].iloc[0]), float(table["images/s, N=2"].iloc[0])
        assert table["efficiency at largest N (%)"].iloc[0] == pytest.approx(100 * two / (2 * one), rel=rel)


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
    for column in STUDIES[script]:
        assert column in table.columns, (column, list(table.columns))
    expected = ROWS[script]
    assert {column: table[column].tolist() for column in expected} == expected
    for column in STUDIES[script]:
        assert table[column].notna().all() or column.startswith("model"), (column, table[column].tolist())
    check_values(script, table)
    assert (out / "table.md").read_text().startswith("# Seed 0")
    assert (out / "all" / "report.html").exists()
