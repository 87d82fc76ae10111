"""MXNet 1.9 through every backend on real ranks: the parameter server (kvstore dist_sync,
dist_async, with real scheduler and server processes) and Horovod, in the `legacy` environment.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: legacy`, so their ranks run there (MXNet exists only in `legacy`); their point
files are read back here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil  # type: ignore[import-untyped]
import pytest

from hpcbench.analysis import resources
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, spec_text
from tests.frameworks import cells

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2


def run_in(exe: Path, code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ)
    )


def leftover_roles() -> list[int]:
    """Scheduler / server processes still running (the ranks must have ended theirs)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline, environ = proc.info["cmdline"] or [], proc.info["environ"] or {}
        except psutil.Error:
            continue
        if any("import mxnet" in c for c in cmdline) and environ.get("DMLC_ROLE") in ("server", "scheduler"):
            found.append(proc.pid)
    return found


def check_cell(data: PointData) -> None:
    """All phases on every rank; per rank and iteration, the messages carry exactly the
    model's gradient bytes (per op) inside the iteration's backward..comm window; the task
    was learnt."""
    point = data.point
    horovod = point.backend == "horovod"
    # with parameter servers the servers update (inside comm): no local optimizer step
    timed, zero = (cells.PHASES, ()) if horovod else (cells.PHASES[:-1], ("update",))
    cells.check_phases(data, ITERATIONS + WARMUP, timed, zero)
    it = data.iterations
    assert np.isfinite(it["loss"]).all()
    cells.check_messages(data, ("allreduce",) if horovod else ("push", "pull"))
    assert len(set(data.comm["name"].tolist())) == 6  # mlp: 3 dense layers x (weight, bias), one message each per op
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(point.ranks))
    accuracy = ev["correct"].sum() / ev["total"].sum()
    assert accuracy > 0.9, (point.backend, accuracy)
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()
    assert data.provenance["mxnet"] == "1.9.1"


def spec(backend: str, **fixed: object) -> str:
    fields: dict[str, object] = dict(
        framework="mxnet", env="legacy", ranks_per_node=2, model="mlp", batch_size=32, iterations=ITERATIONS,
        warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    fields.update(fixed)
    return spec_text(f"mx-{backend}", {"backend": [backend]}, **fields)


def test_dist_sync_exchanges_every_gradient_and_ranks_agree(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("legacy", "mxnet")
    # Two servers: ps-lite spreads the keys over both; the scheduler and servers are extra
    # processes the ranks start and stop.
    (data,) = run_sweep(write_spec, tmp_path / "out", spec("dist_sync", extra={"servers": 2}))
    check_cell(data)
    assert len(set(data.eval["param_checksum"].tolist())) == 1, "weights identical on every rank"
    prov = data.provenance
    assert prov["mxnet_kvstore"] == "dist_sync" and prov["mxnet_kvstore_servers"] == "2"
    assert sorted(prov["mxnet_kvstore_ranks"].split(",")) == ["0", "1"]
    # Per parameter, the pull follows its push.
    comm = data.comm
    push, pull = comm[comm["op"] == b"push"], comm[comm["op"] == b"pull"]
    assert (pull["t_start"] >= push["t_end"] - 1e-6).all()
    assert leftover_roles() == []
    # the scheduler and servers are the ranks' children: the job's own CPUs, not other processes'
    assert resources.of_point(data)["helper_cpus"] > 0.0


def test_dist_async_servers_take_every_update(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """dist_async: ranks train on different weights, so equal parameters during training is
    not the check. Instead the servers count the updates they apply; before the evaluation
    every worker meets a kvstore barrier and pulls the servers' weights: those took exactly
    workers x iterations updates (every push of every rank) and are then equal on all ranks."""
    env_python("legacy", "mxnet")
    out = tmp_path / "out"
    (data,) = run_sweep(write_spec, out, spec("dist_async"))
    check_cell(data)
    assert data.provenance["mxnet_kvstore"] == "dist_async"
    log = (out / "logs" / f"{data.point_id}.log").read_text()
    total = 2 * (ITERATIONS + WARMUP)
    for rank in (0, 1):
        assert f"rank {rank}: dist_async servers applied {total} updates (expected 2 workers x" in log, log
    assert "staleness per iteration" in log
    assert leftover_roles() == []
    assert len(set(data.eval["param_checksum"].tolist())) == 1, "both ranks evaluate the servers' weights"


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_horovod_allreduces_every_gradient_and_ranks_agree(
    write_spec: Callable[..., Path], tmp_path: Path, launcher: str
) -> None:
    env_python("legacy", "mxnet", "horovod.mxnet")
    (data,) = run_sweep(write_spec, tmp_path / "out", spec("horovod", launcher=launcher))
    check_cell(data)
    assert len(set(data.eval["param_checksum"].tolist())) == 1, "weights identical on every rank"
    assert data.provenance["horovod"] == "0.28.1"


def test_gluon_models_have_the_parameters_of_the_model_trees() -> None:
    exe = env_python("legacy", "mxnet")
    code = """
import mxnet as mx
from hpcbench.workloads import zoo
from hpcbench.frameworks.mxnet import layers as mx_layers
for name in zoo.IMAGE_NAMES:
    m = zoo.model(name)
    net = mx_layers.build(m)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    out = net(mx.nd.zeros((1, *m.input)))
    print(name, mx_layers.count_trainable(net), zoo.count_parameters(m), tuple(out.shape[1:]) == zoo.shapes(m))
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == list(models.IMAGE_NAMES)
    for name, built, expected, shape_ok in rows:
        assert int(built) == int(expected), name
        assert shape_ok == "True", name


def test_a_kvstore_that_would_train_locally_is_refused() -> None:
    exe = env_python("legacy", "mxnet")
    code = """
import mxnet as mx
from hpcbench.frameworks.mxnet.kvstore import KVStoreError, create_kvstore
# What is guarded against: MXNet 1.9 hands out a store for 'horovod' (or any unknown name)
# without an error, and it is local: one worker, nothing exchanged.
kv = mx.kv.create("horovod")
assert (kv.num_workers, kv.rank) == (1, 0), (kv.type, kv.num_workers)
for kind in ("horovod", "local", "device"):
    try:
        create_kvstore(kind, 2)
    except KVStoreError as exc:
        print(kind, "refused:", exc)
    else:
        raise SystemExit(f"{kind} was not refused")
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "horovod refused: kvstore 'horovod' is refused: MXNet 1.9 returns a local store" in res.stdout
    assert "use backend 'horovod' (horovod.mxnet)" in res.stdout
