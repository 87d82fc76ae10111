"""Seed 000 (Shi, Wang, Chu): frameworks x CNNs x ranks, phase breakdown, and the iteration model.

    python analysis/seed000_scaling.py [--gpu] [--smoke] [--frameworks torch] [--out DIR]

Writes runs/seed000-scaling/table.md and .csv: per framework, model and rank count, the
throughput, speedup and efficiency, the mean time of each phase, and the model's predicted
iteration time (fitted on the smallest runs) with its error against the measurement.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import study

from hpcbench.analysis.pipeline import Analysis

TITLE = "Seed 000: scaling, phase breakdown and the iteration model"


def table(a: Analysis) -> pd.DataFrame:
    frame = a.stats.merge(a.predictions[["point", "predicted_t_iter_s", "rel_error", "calibration"]], on="point")
    for phase in ("data", "h2d", "forward", "backward", "comm", "update", "t_iter"):
        frame[f"{phase} (ms)"] = frame[f"{phase}_s"] * 1e3
    frame["predicted (ms)"] = frame["predicted_t_iter_s"] * 1e3
    frame["model error (%)"] = frame["rel_error"] * 100
    frame["efficiency (%)"] = frame["efficiency"] * 100
    frame = frame.sort_values(["framework", "backend", "model", "ranks"])
    return study.columns(frame, {
        "framework": "framework", "backend": "backend", "model": "model", "ranks": "N", "batch_size": "batch",
        "throughput": "samples/s", "speedup": "speedup", "efficiency (%)": "efficiency (%)",
        "data (ms)": "I/O (ms)", "h2d (ms)": "H2D (ms)", "forward (ms)": "forward (ms)",
        "backward (ms)": "backward (ms)", "comm (ms)": "comm, exposed (ms)", "update (ms)": "update (ms)",
        "t_iter (ms)": "t_iter (ms)", "predicted (ms)": "model t_iter (ms)", "model error (%)": "model error (%)",
        "calibration": "fitted on",
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(study.main(Path(__file__).with_name("seed000_scaling.yaml"), TITLE, table))
