"""The model's held-out prediction on the network lab: synthetic points on 1..N lab nodes
(one rank per node, every link shaped), the model calibrated on the small ones only, its
prediction of the large ones beside their measured t_iter.

    with Lab(nodes=4, subnet="10.234.0.0/24", prefix="hbp") as lab:
        for i in range(1, 5):
            lab.shape(i, 150)
        result = held_out(lab, tmp, calibrate=[1, 2], predict=[3, 4], workload=Workload())
        result.errors        # {3: -0.02, 4: -0.03}: (predicted - measured) / measured
        result.link_beta     # the ring link's β fitted on the 2-node point (s per byte)

The points run under mpirun through the lab's remote shell (the local executor, a host list
naming one slot per node namespace), Open MPI's all-reduce pinned to the ring (the algorithm
the model assumes) at every rank count, two TCP connections per pair of ranks, and ranks that yield the CPU
while they wait in MPI (the lab's nodes share this host's cores; see RING_MCA). The
calibration sweep directory holds only the calibration points; the prediction is
`hpcbench predict CAL_DIR --nodes ... --csv` (the project's command), and the measured t_iter
is the analysis tables' of a second sweep holding the held-out points.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from hpcbench.analysis import tables
from hpcbench.analysis.model.predict import fit_link_from_points
from hpcbench.cli import predict
from hpcbench.errors import HpcbenchError
from hpcbench.sweepdir.manifest import DONE, Manifest
from hpcbench.testing.netlab import Lab

# Open MPI: the ring all-reduce at every rank count; two TCP connections per pair of ranks (with
# one, two ranks sending to each other at once reached half a shaped link's rate); ranks that
# yield the CPU while they wait. The lab's nodes share this host's cores: 3 or 4 ranks polling
# without yielding starve each other's progress, and a 2 MiB ring all-reduce at 150 Mbit/s took
# 1.9x (3 ranks) and 3.0x (4 ranks) the 2-rank time instead of the ring's 4/3 and 3/2 (the
# bytes on each link were the ring's); yielding, 1.33x and 1.47x.
RING_MCA = (
    ("coll_tuned_use_dynamic_rules", "1"),
    ("coll_tuned_allreduce_algorithm", "4"),
    ("btl_tcp_links", "2"),
    ("mpi_yield_when_idle", "1"),
)


@dataclass(frozen=True)
class Workload:
    """A synthetic point's settings: sleep-based compute (no core contention) and one real
    all-reduce of `comm_bytes` per iteration."""

    forward_s: float = 0.02
    backward_s: float = 0.03
    comm_bytes: int = 2 * 1024 * 1024
    iterations: int = 24
    warmup: int = 3
    batch_size: int = 8


@dataclass
class HeldOut:
    """What `held_out` measured and predicted."""

    measured: dict[int, float] = field(default_factory=dict)  # nodes -> measured t_iter (s), all points
    predicted: dict[int, float] = field(default_factory=dict)  # held-out nodes -> predicted t_iter (s)
    link_beta: float = float("nan")  # the ring link's β (s per byte) the prediction used
    comm_source: str = ""
    report: str = ""  # what `hpcbench predict` printed

    @property
    def errors(self) -> dict[int, float]:
        return {n: (t - self.measured[n]) / self.measured[n] for n, t in self.predicted.items()}


class HeldOutError(HpcbenchError):
    """A sweep of the held-out check did not complete."""


def _profile(lab: Lab, directory: Path) -> Path:
    subnet = str(lab.subnet)
    mca = [arg for name, value in RING_MCA for arg in ("--mca", name, value)]
    profile = {
        "description": "the network lab: one rank per node namespace, the ring all-reduce",
        "mpirun_args": [
            "--host", ",".join(f"{n.namespace}:1" for n in lab.nodes),
            "--mca", "plm_rsh_agent", str(lab.rsh_agent(directory)), "--mca", "btl", "self,tcp",
            "--mca", "oob_tcp_if_include", subnet, "--mca", "btl_tcp_if_include", subnet, *mca,
        ],
        "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
    }  # fmt: skip
    path = directory / "lab.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _spec(name: str, profile: Path, nodes: Sequence[int], work: Workload, directory: Path) -> Path:
    extra = {"forward_s": work.forward_s, "backward_s": work.backward_s, "comm_bytes": work.comm_bytes}
    spec: dict[str, Any] = {
        "name": name, "executor": "local", "profile": str(profile),
        "matrix": {"nodes": list(nodes)},
        "fixed": {"framework": "synthetic", "backend": "none", "model": "sleep", "launcher": "mpirun",
                  "ranks_per_node": 1, "batch_size": work.batch_size, "iterations": work.iterations,
                  "warmup": work.warmup, "extra": extra},
        "options": {"timeout_s": 300},
    }  # fmt: skip
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _sweep(spec: Path, out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcbench.sweep", str(spec), "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    entries = Manifest.load(out).entries.values() if out.exists() else []
    if proc.returncode != 0 or not entries or any(e.state != DONE for e in entries):
        reasons = "; ".join(f"{e.state}: {e.reason}" for e in entries)
        raise HeldOutError(f"sweep {spec.name} did not complete ({reasons}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def _measured(out: Path) -> dict[int, float]:
    stats = tables.stats_table(tables.load(out).points)
    return {int(r["nodes"]): float(r["t_iter_s"]) for r in stats.to_dict("records")}


def held_out(
    lab: Lab, directory: Path, calibrate: Sequence[int], predict_nodes: Sequence[int], work: Workload
) -> HeldOut:
    """Run the calibration points and the held-out points on `lab` (its links shaped by the
    caller), predict the held-out ones from the calibration sweep alone."""
    profile = _profile(lab, directory)
    cal_dir, held_dir = directory / "calibration", directory / "held-out"
    _sweep(_spec("calibration", profile, calibrate, work, directory), cal_dir)
    _sweep(_spec("held-out", profile, predict_nodes, work, directory), held_dir)
    result = HeldOut()
    result.measured = {**_measured(cal_dir), **_measured(held_dir)}
    csv = directory / "predicted.csv"
    out = io.StringIO()
    code = predict.main([str(cal_dir), "--nodes", ",".join(str(n) for n in predict_nodes), "--csv", str(csv)], out)
    result.report = out.getvalue()
    if code != 0:
        raise HeldOutError(f"hpcbench predict failed:\n{result.report}")
    table = pd.read_csv(csv)
    result.predicted = {int(r["nodes"]): float(r["t_iter_s"]) for r in table.to_dict("records")}
    result.comm_source = str(table["comm_source"].iloc[0])
    cal = tables.load(cal_dir).points
    largest = max(cal, key=lambda p: p.iterations.shape[0])
    result.link_beta = fit_link_from_points([largest])[0].beta  # the fit the prediction made
    return result
