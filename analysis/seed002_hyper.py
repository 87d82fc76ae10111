"""Seed 002 (Wu, Liu, Pu et al.): hyper-parameters, BLAS threads, and time, accuracy, CPU and memory.

    python analysis/seed002_hyper.py [--gpu] [--smoke] [--frameworks torch] [--data-dir MNIST_DIR] [--out DIR]

Writes runs/seed002-hyper/table.md and .csv in the shape of the paper's tables (e.g. its
Tables X and XXII): framework, BLAS library and threads, batch size, learning rate, epochs;
training time, testing time, accuracy; CPU %user / %system / %iowait / total and memory
average / maximum.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import study

from hpcbench.analysis.pipeline import Analysis
from hpcbench.analysis.report.html import readable

TITLE = "Seed 002: hyper-parameters, BLAS threads, training / testing time, accuracy, CPU and memory"


def table(a: Analysis) -> pd.DataFrame:
    settings = a.points[[c for c in ("point", "lr", "threads", "epochs", "env", "blas") if c in a.points]]
    frame = a.stats.merge(settings, on="point", suffixes=("", "_point"))
    frame["accuracy (%)"] = readable(a, frame)["accuracy"]  # synthetic data: read as chance where it is
    frame = frame.sort_values(["framework", "batch_size", "lr", "threads"])
    return study.columns(frame, {
        "framework": "Framework", "blas": "BLAS", "threads": "#THREADS", "batch_size": "Batch Size", "lr": "LR",
        "epochs": "#Epochs", "train_time_s": "Training Time (s)", "test_time_s": "Testing Time (s)",
        "accuracy (%)": "Accuracy (%)", "cpu_user": "CPU user", "cpu_system": "CPU system",
        "cpu_iowait": "CPU iowait", "cpu_total": "CPU total", "mem_avg_mib": "Memory AVG (MiB)",
        "mem_max_mib": "Memory MAX (MiB)",
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(study.main(Path(__file__).with_name("seed002_hyper.yaml"), TITLE, table))
