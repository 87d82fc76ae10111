"""Seed 003: all-reduce against parameter servers, synchronous against asynchronous, on CPUs.

    python analysis/seed003_ps.py [--gpu] [--smoke] [--frameworks torch] [--out DIR]

Writes runs/seed003-ps/table.md and .csv: per framework and exchange (all-reduce or
parameter server, synchronous or asynchronous) and rank count, throughput, iteration time,
communication share, efficiency, and the slowdown against the fastest synchronous system.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import study

from hpcbench.analysis.pipeline import Analysis

TITLE = "Seed 003: all-reduce vs parameter server, synchronous vs asynchronous"
ARCHITECTURE = {"gloo": "all-reduce", "nccl": "all-reduce", "mpi": "all-reduce", "horovod": "all-reduce",
                "multiworker": "all-reduce", "ps": "parameter server", "dist_sync": "parameter server",
                "dist_async": "parameter server"}  # fmt: skip


def _mode(backend: str, extra: str) -> str:
    if backend == "dist_async":
        return "async"
    if backend == "ps":
        return "sync" if json.loads(extra or "{}").get("sync", False) else "async"
    return "sync"


def table(a: Analysis) -> pd.DataFrame:
    frame = a.stats.merge(a.points[["point", "extra"]], on="point")
    frame["architecture"] = frame["backend"].map(ARCHITECTURE).fillna("")
    frame["mode"] = [_mode(b, e) for b, e in zip(frame["backend"], frame["extra"], strict=True)]
    frame["t_iter (ms)"] = frame["t_iter_s"] * 1e3
    # shares of wall time (a message in flight, then after backward), and the summed message time apart
    frame["comm in flight (%)"] = frame["comm_union_share"] * 100
    frame["comm exposed (%)"] = frame["comm_exposed_share"] * 100
    frame["comm summed (%)"] = frame["comm_share"] * 100
    frame["efficiency (%)"] = frame["efficiency"] * 100
    sync = frame[frame["mode"] == "sync"].groupby("ranks")["throughput"].max()
    frame["slower than best sync (x)"] = frame["ranks"].map(sync) / frame["throughput"]
    frame = frame.sort_values(["ranks", "architecture", "mode", "framework"])
    return study.columns(frame, {
        "framework": "framework", "backend": "backend", "architecture": "architecture", "mode": "mode",
        "ranks": "N", "throughput": "samples/s", "t_iter (ms)": "t_iter (ms)",
        "comm in flight (%)": "comm in flight (%)", "comm exposed (%)": "comm exposed (%)",
        "comm summed (%)": "comm summed (%)",
        "efficiency (%)": "efficiency (%)", "slower than best sync (x)": "slower than best sync (x)",
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(study.main(Path(__file__).with_name("seed003_ps.yaml"), TITLE, table))
