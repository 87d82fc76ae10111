"""JAX on real ranks: gradients averaged by `lax.pmean` across `jax.distributed` processes
(one all-reduce per tensor, or one fused), in the `modern` environment.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: modern`, so their ranks run there; their point files are read back here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.frameworks import FRAMEWORKS
from hpcbench.spec import Point
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, spec_text

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
PHASES = ("data", "h2d", "forward", "backward", "comm", "update")


def run_in(exe: Path, code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def check_cell(data: PointData) -> None:
    """Every phase on every rank; per rank and iteration the messages carry exactly the
    model's gradient bytes, inside the iteration's backward..comm window; the task was
    learnt and the ranks' weights agree."""
    point = data.point
    assert data.complete
    it = data.iterations
    assert it.shape == (point.ranks, ITERATIONS + WARMUP)
    for phase in PHASES:
        assert (it[phase] > 0).all(), (point.backend, phase)
    assert (it["comm_total"] > 0).all()
    phases = sum(it[p] for p in PHASES)
    assert (phases <= it["t_end"] - it["t_start"] + 1e-9).all()

    grad_bytes = 4 * models.count_parameters(models.model(point.model))
    comm = data.comm
    assert set(comm["op"].tolist()) == {b"allreduce"}
    for rank in range(point.ranks):
        for i in range(it.shape[1]):
            mine = comm[(comm["rank"] == rank) & (comm["iteration"] == i)]
            assert int(mine["bytes"].sum()) == grad_bytes, (point.backend, rank, i)
            assert (mine["t_end"] >= mine["t_start"]).all()
            row = it[rank, i]
            backward_begins = row["t_start"] + row["data"] + row["h2d"] + row["forward"]
            comm_ends = backward_begins + row["backward"] + row["comm"]
            assert (mine["t_start"] >= backward_begins - 1e-6).all(), (point.backend, rank, i)
            assert (mine["t_end"] <= comm_ends + 1e-6).all(), (point.backend, rank, i)
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(point.ranks))
    assert len(set(ev["param_checksum"].tolist())) == 1, "weights identical on every rank"
    accuracy = ev["correct"].sum() / ev["total"].sum()
    assert accuracy > 0.9, (point.backend, accuracy)
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()
    prov = data.provenance
    assert prov["jax"] == "0.10.2" and prov["jax_devices"] == str(point.ranks)
    assert prov["jax_exchange"] == point.backend


def test_pmean_per_tensor_and_fused_exchange_every_gradient(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "jax")
    text = spec_text(
        "jax", {"backend": ["pmean", "pmean_fused"]}, framework="jax", env="modern", ranks_per_node=2, model="mlp",
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    points = {p.point.backend: p for p in run_sweep(write_spec, tmp_path / "out", text)}
    assert sorted(points) == ["pmean", "pmean_fused"]
    for data in points.values():
        check_cell(data)
    # One message per weight tensor (mlp: 3 dense layers x (kernel, bias)), or one for all.
    per_tensor, fused = points["pmean"].comm, points["pmean_fused"].comm
    assert len(set(per_tensor["name"].tolist())) == 6
    assert set(fused["name"].tolist()) == {b"all"}
    assert len(fused) == 2 * (ITERATIONS + WARMUP)
    # The same data, weights and averages: both exchanges end with the same weights.
    a, b = (points[k].eval["param_checksum"][0] for k in ("pmean", "pmean_fused"))
    assert a == pytest.approx(b, rel=1e-5)


def test_jax_models_have_the_parameters_and_outputs_of_the_model_trees() -> None:
    exe = env_python("modern", "jax")
    code = """
import numpy as np, jax
from hpcbench.workloads import zoo
from hpcbench.frameworks.jax import layers, weights
for name in weights.SUPPORTED:
    m = zoo.model(name)
    named = weights.initial(m, 0)
    out = layers.apply(weights.steps(m), [w for _, w in named], np.zeros((2, *m.input), np.float32))
    print(name, sum(w.size for _, w in named), zoo.count_parameters(m), tuple(out.shape[1:]) == zoo.shapes(m))
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == ["lenet", "mlp", "autoencoder", "cifar10_quick"]
    for name, built, expected, shape_ok in rows:
        assert int(built) == int(expected), name
        assert shape_ok == "True", name


def test_points_the_adapter_cannot_run_are_refused_at_planning() -> None:
    # The adapter module imports without JAX: its checks run wherever a sweep is planned.
    cls = FRAMEWORKS.get("jax")
    assert set(cls.backends) == {"pmean", "pmean_fused"}
    assert set(cls.models) == {"lenet", "mlp", "autoencoder", "cifar10_quick"}

    def problems(**fields: object) -> list[str]:
        point = Point(**{"framework": "jax", "backend": "pmean", "ranks_per_node": 2, **fields})  # type: ignore[arg-type]
        return [f"{field}: {what}" for field, what, _ in cls.check_point(point)]

    assert problems() == []
    assert problems(backend="pmean_fused", model="cifar10_quick", launcher="srun") == []
    assert any(p.startswith("device") for p in problems(device="cuda"))
    assert any(p.startswith("launcher") for p in problems(launcher="torchrun"))
    assert any(p.startswith("model") for p in problems(model="resnet50"))  # BatchNorm, Residual
    assert any(p.startswith("backend") for p in problems(backend="gloo"))
    assert any(p.startswith("extra") for p in problems(extra=(("fused", True),)))
