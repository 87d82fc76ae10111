"""Seed 004: Horovod images/s against ranks and batch size (AlexNet, GoogleNet, ResNet-50).

    python analysis/seed004_horovod.py [--gpu] [--smoke] [--frameworks torch] [--out DIR]

Writes runs/seed004-horovod/table.md and .csv: one row per framework, backend, model and
batch size, the images/s at each rank count side by side, and the efficiency at the largest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import study

from hpcbench.analysis.pipeline import Analysis

TITLE = "Seed 004: images/s vs ranks and batch size"


def table(a: Analysis) -> pd.DataFrame:
    stats = a.stats
    keys = ["framework", "backend", "model", "batch_size"]
    wide = stats.pivot_table(index=keys, columns="ranks", values="throughput", aggfunc="mean")
    wide.columns = [f"images/s, N={n}" for n in wide.columns]
    largest = stats.sort_values("ranks").groupby(keys).tail(1).set_index(keys)
    wide["efficiency at largest N (%)"] = largest["efficiency"] * 100
    wide["largest N"] = largest["ranks"]
    return wide.reset_index().rename(columns={"batch_size": "batch"})


if __name__ == "__main__":
    sys.exit(study.main(Path(__file__).with_name("seed004_horovod.yaml"), TITLE, table))
