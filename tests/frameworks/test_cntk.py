"""CNTK 2.7 on real ranks, in the `cntk` environment: CNTK (Python 3.6, a process beside each
rank) computes forward, backward and the update; the rank all-reduces every gradient tensor
over MPI (mpi4py), each message timed.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: cntk`, so their ranks run there; their point files are read back here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.analysis import resources
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, skip_unless_required, spec_text
from tests.frameworks.cells import check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
TENSORS = {"mlp": 6, "lenet": 10}  # weight tensors: (kernel, bias) of 3 and 5 layers
TIMED = ("data", "forward", "backward", "comm", "update")  # no h2d: CPU only


def run_in(exe: Path, code: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **env}
    )


def cntk_env() -> Path:
    """The cntk environment's interpreter if its CNTK process starts (the adapter's own check);
    else skip, or fail with under CI (tests/conftest.py `skip_unless_required`)."""
    exe = env_python("cntk", "mpi4py")
    res = run_in(exe, "from hpcbench.frameworks.cntk.adapter import CntkFramework as F; print(F.unavailable('mpi'))")
    if res.returncode != 0 or res.stdout.strip().splitlines()[-1:] != ["None"]:
        why = f"environment 'cntk' cannot run CNTK: {(res.stdout + res.stderr).strip()[-300:]}"
        skip_unless_required(f"needs CNTK in the cntk environment (bash envs/build.sh cntk): {why}")
    return exe


def check_cell(data: PointData) -> None:
    """Every phase on every rank; per rank and iteration one message per weight tensor,
    together exactly the model's gradient bytes, inside the iteration's backward..comm
    window; the ranks' weights agree and the loss fell."""
    tensors = TENSORS[data.point.model]
    check_phases(data, ITERATIONS + WARMUP, TIMED, zero=("h2d",))
    check_messages(data, per_op=tensors)
    assert len(set(data.comm["name"].tolist())) == tensors
    check_weights_agree(data)
    it = data.iterations
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()
    prov = data.provenance
    assert prov["cntk"] == "2.7" and prov["cntk_exchange"] == "mpi4py Allreduce per tensor"


@pytest.mark.timeout(600)
def test_two_ranks_exchange_every_gradient_agree_and_learn(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    cntk_env()
    text = spec_text(
        "cntk", {"model": ["mlp", "lenet"]}, framework="cntk", backend="mpi", env="cntk", ranks_per_node=2,
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    points = run_sweep(write_spec, tmp_path / "out", text, timeout=580)
    assert sorted(p.point.model for p in points) == ["lenet", "mlp"]
    for data in points:
        check_cell(data)
        # each rank's CNTK process is its child, computing through the whole window: the job's own
        helper = resources.of_point(data)["helper_cpus"]
        print(f"{data.point.model}: helper_cpus {helper:.2f}")
        assert helper > 0.1, helper
        if data.point.model == "mlp":  # LeNet learns the task too, but needs more than 32 iterations
            ev = data.eval
            accuracy = ev["correct"].sum() / ev["total"].sum()
            assert accuracy > 0.9, accuracy


@pytest.mark.timeout(600)
def test_cntk_networks_have_the_parameters_and_outputs_of_the_model_trees() -> None:
    """Every zoo model built by CNTK: its parameter count and output shape are the zoo's."""
    exe = cntk_env()
    code = """
import math
from hpcbench.frameworks.cntk import bridge
from hpcbench.workloads import zoo
child = bridge.Child(bridge.interpreter())
try:
    for name in zoo.IMAGE_NAMES:
        m = zoo.model(name)
        reply = child.call("build", model=bridge.describe(m), optimizer="sgd", lr=0.1, seed=0, batch=8, momentum=0.9)
        built = sum(math.prod(shape) for _, shape in reply["params"])
        print(name, built, zoo.count_parameters(m), tuple(reply["output"]) == zoo.shapes(m))
finally:
    child.close()
"""
    res = run_in(exe, code, timeout=580)
    assert res.returncode == 0, res.stderr[-3000:]
    names = models.IMAGE_NAMES
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] and line.split()[0] in names]
    assert [r[0] for r in rows] == list(models.IMAGE_NAMES)
    for name, built, expected, shape_ok in rows:
        assert int(built) == int(expected), name
        assert shape_ok == "True", name


def test_an_sgd_step_is_the_rate_times_the_mean_gradient() -> None:
    """Known truth for the learner's convention (CNTK divides the rate by the sample count it
    is given): after one SGD step through the bridge, every weight moved by exactly
    -lr x the gradient CNTK reported for the batch's mean loss."""
    exe = cntk_env()
    code = """
import numpy as np
from hpcbench.frameworks.cntk import bridge
from hpcbench.workloads import zoo
m = zoo.model("mlp")
child = bridge.Child(bridge.interpreter())
try:
    reply = child.call("build", model=bridge.describe(m), optimizer="sgd", lr=0.5, seed=3, batch=16, momentum=0.9)
    sizes = tuple(int(np.prod(s)) for _, s in reply["params"])
    shared = bridge.Shared(bridge.Layout(sizes, 16, m.input), 0)
    child.call("attach", path=str(shared.path), batch=16)
    rng = np.random.default_rng(1)
    shared.put(rng.standard_normal((16, *m.input)).astype(np.float32), rng.integers(0, m.classes, 16))
    child.call("get"); before = shared.weights_flat.copy()
    loss = child.call("fwd", n=16)["loss"]
    child.call("bwd"); grads = shared.grads_flat.copy()
    child.call("upd"); child.call("get")
    moved = shared.weights_flat - before
    print(loss > 0, np.abs(grads).max() > 0, np.allclose(moved, -0.5 * grads, rtol=1e-4, atol=1e-7))
    shared.close()
finally:
    child.close()
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-3:] == ["True", "True", "True"], res.stdout


def test_the_build_says_when_it_has_no_python_36(tmp_path: Path) -> None:
    for named, said in (("/nonexistent/python3.6", "is not an executable"), ("python3", "is not Python 3.6")):
        res = subprocess.run(
            ["bash", str(ROOT / "envs" / "build.sh"), "cntk"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "HPCBENCH_PYTHON36": named, "HPCBENCH_ENVS_DIR": str(tmp_path)},
        )  # fmt: skip
        assert res.returncode != 0
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and said in errors[0] and "HPCBENCH_PYTHON36" in errors[0], res.stderr
    assert not (tmp_path / "cntk").exists()


def test_without_cntks_interpreter_the_framework_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = FRAMEWORKS.get("cntk")
    monkeypatch.setenv("HPCBENCH_CNTK_PYTHON", str(tmp_path / "missing"))
    why = cls.unavailable("mpi")
    assert why is not None and "envs/build.sh cntk" in why and "3.6" in why
