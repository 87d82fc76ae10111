"""Seed 001 (Kavarakuntla et al.): load imbalance across frameworks for a CNN, an MLP and an autoencoder.

    python analysis/seed001_lif.py [--gpu] [--smoke] [--frameworks torch] [--out DIR]

Writes runs/seed001-lif/table.md and .csv: per framework, model and rank count, the
iteration time, the load-imbalance factor (max / mean of the ranks' compute time, and its
excess form), communication share, efficiency, and the running-time model's prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import study

from hpcbench.analysis.pipeline import Analysis

TITLE = "Seed 001: load-imbalance factor across frameworks and models"
KIND = {"cifar10_quick": "CNN", "lenet": "CNN", "alexnet": "CNN", "mlp": "MLP", "autoencoder": "autoencoder"}


def table(a: Analysis) -> pd.DataFrame:
    frame = a.stats.merge(a.predictions[["point", "predicted_t_iter_s", "rel_error"]], on="point")
    frame["network"] = frame["model"].map(KIND).fillna("")
    frame["t_iter (ms)"] = frame["t_iter_s"] * 1e3
    frame["predicted (ms)"] = frame["predicted_t_iter_s"] * 1e3
    frame["model error (%)"] = frame["rel_error"] * 100
    frame["LIF excess (%)"] = frame["lif_excess"] * 100
    frame["comm in flight (%)"] = frame["comm_union_share"] * 100  # a share of wall time
    frame["comm summed (%)"] = frame["comm_share"] * 100  # summed message time: can pass 100 %
    frame["efficiency (%)"] = frame["efficiency"] * 100
    frame = frame.sort_values(["model", "framework", "ranks"])
    return study.columns(frame, {
        "network": "network", "model": "model", "framework": "framework", "backend": "backend", "ranks": "N",
        "t_iter (ms)": "t_iter (ms)", "lif": "LIF", "LIF excess (%)": "LIF excess (%)",
        "comm in flight (%)": "comm in flight (%)", "comm summed (%)": "comm summed (%)",
        "efficiency (%)": "efficiency (%)",
        "predicted (ms)": "model t_iter (ms)", "model error (%)": "model error (%)",
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(study.main(Path(__file__).with_name("seed001_lif.yaml"), TITLE, table))
