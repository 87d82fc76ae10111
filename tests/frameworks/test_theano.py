"""Theano 1.0.5 (the `legacy` environment) and PyTensor (`modern`) through the one `theano`
adapter on real ranks: compiled forward, backward and update functions, one mpi4py
all-reduce per gradient.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name the environment, so their ranks run there; their point files are read back here. The
first compile of a graph takes a minute or more on a busy machine (cached afterwards).
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
from tests.conftest import REQUIRE_ENVS, ROOT, env_python, run_sweep, spec_text

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
TIMED = ("data", "forward", "backward", "comm", "update")  # no h2d: numpy goes into the functions
LIBRARIES = [pytest.param("legacy", "theano", id="theano"), pytest.param("modern", "pytensor", id="pytensor")]
VERSIONS = {"theano": "1.0.5", "pytensor": "3.0.7"}


def run_in(exe: Path, code: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ)
    )


def library_python(env: str, library: str) -> Path:
    """Environment `env`'s interpreter if `library` imports there the way the adapter imports
    it (a plain `import theano` fails without its flags: see `library.py`), with mpi4py;
    else skip, or fail with HPCBENCH_REQUIRE_ENVS."""
    exe = env_python(env, "mpi4py")
    res = run_in(exe, "from hpcbench.frameworks.theano import library; print(library.load().name)", 240)
    found = res.stdout.strip().splitlines()[-1:] == [library]
    if res.returncode != 0 or not found:
        why = f"environment {env!r} does not use {library}: {(res.stdout + res.stderr).strip()[-300:]}"
        if REQUIRE_ENVS:
            pytest.fail(f"{why} (HPCBENCH_REQUIRE_ENVS is set)")
        pytest.skip(f"needs {library} in the {env} environment (bash envs/build.sh {env}): {why}")
    return exe


def check_cell(data: PointData) -> None:
    """Every phase on every rank; per rank and iteration one message per weight tensor,
    together exactly the model's gradient bytes, inside the iteration's backward..comm
    window; the task was learnt and the ranks' weights agree."""
    point = data.point
    assert data.complete
    it = data.iterations
    assert it.shape == (point.ranks, ITERATIONS + WARMUP)
    for phase in TIMED:
        assert (it[phase] > 0).all(), phase
    assert (it["h2d"] == 0).all()
    assert (it["comm_total"] > 0).all()
    phases = sum(it[p] for p in (*TIMED, "h2d"))
    assert (phases <= it["t_end"] - it["t_start"] + 1e-9).all()

    grad_bytes = 4 * models.count_parameters(models.model(point.model))
    comm = data.comm
    assert set(comm["op"].tolist()) == {b"allreduce"}
    assert len(set(comm["name"].tolist())) == 6  # mlp: 3 dense layers x (kernel, bias)
    for rank in range(point.ranks):
        for i in range(it.shape[1]):
            mine = comm[(comm["rank"] == rank) & (comm["iteration"] == i)]
            assert len(mine) == 6 and int(mine["bytes"].sum()) == grad_bytes, (rank, i)
            assert (mine["t_end"] >= mine["t_start"]).all()
            row = it[rank, i]
            backward_begins = row["t_start"] + row["data"] + row["h2d"] + row["forward"]
            comm_ends = backward_begins + row["backward"] + row["comm"]
            assert (mine["t_start"] >= backward_begins - 1e-6).all(), (rank, i)
            assert (mine["t_end"] <= comm_ends + 1e-6).all(), (rank, i)
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(point.ranks))
    assert len(set(ev["param_checksum"].tolist())) == 1, "weights identical on every rank"
    accuracy = ev["correct"].sum() / ev["total"].sum()
    assert accuracy > 0.9, accuracy
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()


@pytest.mark.timeout(900)  # a first compile (nothing cached yet) on a busy machine
@pytest.mark.parametrize(("env", "library"), LIBRARIES)
def test_compiled_functions_exchange_every_gradient_and_ranks_agree(
    write_spec: Callable[..., Path], tmp_path: Path, env: str, library: str
) -> None:
    library_python(env, library)
    text = spec_text(
        f"{library}", {"ranks_per_node": [2]}, framework="theano", backend="mpi", env=env, model="mlp",
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    (data,) = run_sweep(write_spec, tmp_path / "out", text, timeout=880)
    check_cell(data)
    prov = data.provenance
    assert prov["theano_library"] == library and prov[library] == VERSIONS[library]
    assert prov[f"{library}_floatx"] == "float32"


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("env", "library"), LIBRARIES)
def test_graphs_have_the_model_trees_outputs_and_the_split_backward_the_full_gradient(env: str, library: str) -> None:
    """Every supported model's graph gives the zoo's output shape; for LeNet (convolutions,
    pools, dense layers) the layer-by-layer backward from the forward's saved outputs gives
    the gradient of the whole loss. PyTensor compiles in FAST_COMPILE mode (no Numba)."""
    exe = library_python(env, library)
    code = """
import numpy as np
from hpcbench.frameworks.jax import weights
from hpcbench.frameworks.theano import layers, library
from hpcbench.workloads import zoo
lib = library.load(); T = lib.tensor
# PyTensor: no Numba compile; Theano: its default (CorrMM has only a C implementation, cached)
mode = "FAST_COMPILE" if lib.name == "pytensor" else None
fn = lambda inputs, outputs, **kw: lib.module.function(inputs, outputs, mode=mode, **kw)
rng = np.random.default_rng(0)
for name in weights.SUPPORTED:
    m = zoo.model(name)
    steps = weights.steps(m)
    ws = [lib.module.shared(w, name=n) for n, w in weights.initial(m, 0)]
    x, y = T.tensor4("x", dtype="float32"), T.lvector("y")
    outs = layers.forward(lib, steps, ws, x)
    xs = rng.standard_normal((4, *m.input)).astype(np.float32)
    ys = np.arange(4) % max(m.classes, 1)
    shape = fn([x], outs[-1])(xs).shape
    agree = "-"
    if name == "lenet":
        cost = layers.loss(lib, m.task, outs[-1], x, y)
        forward = fn([x, y], [cost, *outs])
        saved = [o.type() for o in outs]
        last = lib.module.grad(layers.loss(lib, m.task, saved[-1], x, y), saved[-1])
        grads = layers.backward(lib, steps, ws, [x, *saved[:-1]], last)
        backward = fn([x, *saved, y], grads, on_unused_input="ignore")
        full = fn([x, y], lib.module.grad(cost, ws))(xs, ys)
        _, *acts = forward(xs, ys)
        split = backward(xs, *acts, ys)
        agree = str(all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(split, full)))
    print(name, sum(w.get_value().size for w in ws), zoo.count_parameters(m), tuple(shape[1:]) == zoo.shapes(m), agree)
"""
    res = run_in(exe, code)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == ["lenet", "mlp", "autoencoder", "cifar10_quick"]
    for name, built, expected, shape_ok, agree in rows:
        assert int(built) == int(expected), name
        assert shape_ok == "True", name
        assert agree == ("True" if name == "lenet" else "-"), name


def test_points_the_adapter_cannot_run_are_refused_at_planning() -> None:
    # The adapter module imports without Theano or PyTensor: its checks run wherever a sweep is planned.
    cls = FRAMEWORKS.get("theano")
    assert cls.backends == ("mpi",)
    assert set(cls.models) == {"lenet", "mlp", "autoencoder", "cifar10_quick"}

    def problems(**fields: object) -> list[str]:
        point = Point(**{"framework": "theano", "backend": "mpi", "ranks_per_node": 2, **fields})  # type: ignore[arg-type]
        return [f"{field}: {what}" for field, what, _ in cls.check_point(point)]

    assert problems() == []
    assert problems(model="cifar10_quick", launcher="srun") == []
    assert any(p.startswith("device") for p in problems(device="cuda"))
    assert any(p.startswith("launcher") for p in problems(launcher="torchrun"))
    assert any(p.startswith("model") for p in problems(model="alexnet"))  # Dropout
    assert any(p.startswith("extra") for p in problems(extra=(("library", "theano"),)))
