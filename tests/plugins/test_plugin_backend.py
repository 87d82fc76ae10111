"""A new backend is one new module, and the model follows what it declares: a toy framework
registered from the test tree (a plugin named in $HPCBENCH_PLUGINS) runs real 2-rank points
of two backends that differ only in their declared traits; the rank records them in the point
file, and the performance model predicts the two differently, with no edit in hpcbench."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.analysis import pipeline
from hpcbench.store.reader import read_point
from tests.conftest import ROOT, run_module, spec_text

PLUGIN = {"HPCBENCH_PLUGINS": "tests.plugins.toy_backend", "PYTHONPATH": str(ROOT)}
EXCHANGE = {"forward_s": 0.004, "backward_s": 0.008, "comm_bytes": 1_000_000, "comm_tensors": 4}


@pytest.mark.mpi
def test_a_backend_from_a_plugin_is_modelled_by_its_declared_traits(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    matrix = {"backend": ["ring", "mpi"], "ranks_per_node": [1, 2]}
    text = spec_text("toy", matrix, framework="toyfw", model="sleep", launcher="mpirun", iterations=12, extra=EXCHANGE)
    out = tmp_path / "sweep"
    res = run_module("hpcbench", "run", str(write_spec(text)), "--out", str(out), env=PLUGIN, timeout=300)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in (out / "logs").glob("*.log"))
    assert res.returncode == 0, res.stdout + res.stderr + logs

    recorded = {read_point(path).point.backend: read_point(path).traits for path in out.glob("*.h5")}
    assert recorded["mpi"].mpi_exchange and not recorded["ring"].mpi_exchange  # as the plugin declared them
    assert recorded["ring"].launcher_mpi  # the worker's part: mpirun starts ranks through MPI_Init

    predictions = pipeline.analyse(out).predictions
    rows = {r["backend"]: r for r in predictions[predictions["ranks"] == 2].to_dict("records")}
    ring, mpi = rows["ring"], rows["mpi"]
    assert ring["pred_comm_total_s"] > 0 and mpi["pred_comm_total_s"] > 0  # both exchanged real messages
    # an MPI_Allreduce exchange is served after backward: nothing overlaps, whatever the fit
    assert mpi["predicted_t_iter_s"] == pytest.approx(mpi["predicted_no_overlap_s"], rel=1e-12)
    # the same messages from a backend that declares nothing may start during backward
    assert ring["predicted_t_iter_s"] < ring["predicted_no_overlap_s"]
