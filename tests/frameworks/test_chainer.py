"""Chainer 7.8 with ChainerMN on real ranks (the `naive` communicator: one MPI all-reduce per
parameter), in the `legacy` environment.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: legacy`, so their ranks run there (Chainer exists only in `legacy`); their point
files are read back here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, skip_unless_required, spec_text
from tests.frameworks.cells import check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
TENSORS = {"mlp": 6, "lenet": 10}  # weight tensors: (kernel, bias) of 3 and 5 layers
TIMED = ("data", "forward", "backward", "comm", "update")  # h2d: a copy to the GPU, 0 s on the CPU


def run_in(exe: Path, code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ)
    )


def legacy_chainer() -> Path:
    """The legacy environment's interpreter if Chainer imports there the way the adapter
    imports it (a plain `import chainer` fails there: see `import_chainer`); else skip, or
    fail with under CI (tests/conftest.py `skip_unless_required`)."""
    exe = env_python("legacy")
    res = run_in(exe, "from hpcbench.frameworks.chainer.adapter import import_chainer; import_chainer()", 120)
    if res.returncode != 0:
        why = f"environment 'legacy' cannot import chainer: {res.stderr.strip()[-300:]}"
        skip_unless_required(f"needs chainer in the legacy environment (bash envs/build.sh legacy): {why}")
    return exe


def check_cell(data: PointData) -> None:
    """Every phase on every rank; per rank and iteration the messages carry exactly the
    model's gradient bytes, one per parameter, inside the iteration's backward..comm window;
    the loss fell (the MLP learnt the task) and the ranks' weights agree."""
    point = data.point
    check_phases(data, ITERATIONS + WARMUP, TIMED, zero=("h2d",))
    check_messages(data, per_op=TENSORS[point.model])
    assert len(set(data.comm["name"].tolist())) == TENSORS[point.model]
    check_weights_agree(data)
    ev, it = data.eval, data.iterations
    if point.model == "mlp":  # LeNet learns the task too, but needs more than 32 iterations
        accuracy = ev["correct"].sum() / ev["total"].sum()
        assert accuracy > 0.9, accuracy
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()
    prov = data.provenance
    assert prov["chainer"] == "7.8.1" and prov["chainermn_communicator"] == "NaiveCommunicator"


def test_naive_communicator_exchanges_every_gradient_and_ranks_agree(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    legacy_chainer()
    text = spec_text(
        "chainer", {"model": ["mlp", "lenet"]}, framework="chainer", backend="naive", env="legacy", ranks_per_node=2,
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    out = tmp_path / "out"
    points = run_sweep(write_spec, out, text)
    assert sorted(p.point.model for p in points) == ["lenet", "mlp"]
    for data in points:
        check_cell(data)
        # Chainer's import-time warnings (pkg_resources, distutils) stay out of the ranks' log.
        log = (out / "logs" / f"{data.point_id}.log").read_text()
        assert "Warning" not in log, log[-3000:]


def test_chainer_models_have_the_parameters_of_the_model_trees() -> None:
    exe = legacy_chainer()
    code = """
import numpy as np
from hpcbench.frameworks.chainer.adapter import import_chainer
chainer = import_chainer()
from hpcbench.workloads import zoo
from hpcbench.frameworks.chainer import layers
small = ("lenet", "mlp", "autoencoder", "cifar10_quick", "googlenet")
for name in zoo.IMAGE_NAMES:
    m = zoo.model(name)
    net = layers.build(m)
    shape_ok = "-"
    if name in small:  # the forward pass of the others takes too long on a busy CPU
        with chainer.using_config("train", False), chainer.no_backprop_mode():
            out = net(np.zeros((1, *m.input), np.float32))
        shape_ok = str(tuple(out.shape[1:]) == zoo.shapes(m))
    print(name, layers.count_parameters(net), zoo.count_parameters(m), shape_ok)
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == list(models.IMAGE_NAMES)
    for name, built, expected, shape_ok in rows:
        assert int(built) == int(expected), name
        assert shape_ok in ("True", "-"), name
    assert sum(r[3] == "True" for r in rows) == 5
