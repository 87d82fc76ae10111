"""TensorFlow 2 (Keras 3) through every backend on real ranks, in the `modern` environment:
MultiWorkerMirroredStrategy, parameter servers (real server processes) and Horovod.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: modern`, so their ranks run there (TensorFlow exists only in `modern`); their
point files are read back here. Tests skip when the environment is not
built, unless HPCBENCH_REQUIRE_ENVS is set (CI): then they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import pytest

from hpcbench.plan.launch import check_point
from hpcbench.spec import Point
from hpcbench.store.reader import PointData
from hpcbench.testing.mpi import MPI_ENV
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, spec_text
from tests.frameworks import cells

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 20, 1
RANKS = 2
ENV = {**MPI_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}  # for what runs in the environment directly


def spec(backend: str, matrix: dict[str, list[object]] | None = None, **fixed: object) -> str:
    fields: dict[str, object] = dict(
        framework="tensorflow", backend=backend, env="modern", ranks_per_node=RANKS, model="mlp", batch_size=32,
        iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    fields.update(fixed)
    return spec_text(f"tf-{backend}", matrix or {"backend": [backend]}, **fields)


def check_phases(data: PointData) -> None:
    """Every rank wrote every iteration, with every phase of the loop."""
    point = data.point
    cells.check_phases(data, point.iterations + point.warmup, cells.PHASES)
    it = data.iterations
    assert np.isfinite(it["loss"]).all()
    assert data.provenance["tensorflow"] == "2.21.0"
    assert data.provenance["keras"].startswith("3.")
    assert data.provenance["tf_intra_op_threads"] == "1"


def check_messages(data: PointData, ops: tuple[str, ...]) -> None:
    """Per rank, iteration and op, the messages carry exactly the model's gradient bytes,
    and they lie inside the iteration: after forward, by the end of the comm phase; an
    iteration's comm_total is the sum of its message durations."""
    cells.check_messages(data, ops)
    comm, it = data.comm, data.iterations
    # comm_total is the sum of the iteration's message durations
    for rank in range(data.point.ranks):
        mine = comm[comm["rank"] == rank]
        per_iter = np.bincount(mine["iteration"], weights=mine["t_end"] - mine["t_start"], minlength=it.shape[1])
        assert per_iter == pytest.approx(it["comm_total"][rank], abs=2e-6)


def check_learnt(data: PointData) -> float:
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(data.point.ranks))
    assert (ev["test_time_s"] > 0).all()
    accuracy = float(ev["correct"].sum() / ev["total"].sum())
    assert accuracy > 0.9, (data.point.backend, accuracy)
    loss = data.iterations["loss"]
    assert loss[:, -5:].mean() < loss[:, :5].mean()
    return accuracy


# --------------------------------------------------------------------------------------


def test_keras_models_have_the_parameter_counts_of_the_trees() -> None:
    """Every model of the zoo: the image models and the tiny transformers built, with their
    output shapes; every transformer (the published sizes too, up to Llama's 1.2 billion)
    counted from its layers built on deferred variables, no weight allocated."""
    exe = env_python("modern", "tensorflow")
    code = (
        "import json; from hpcbench.workloads import zoo\n"
        "from hpcbench.frameworks.tensorflow import blocks, layers as m\n"
        "tiny = ('gpt_tiny', 'llama_tiny', 'bert_tiny', 'vit_tiny')\n"
        "print(json.dumps({'built': {n: [m.trainable_count(k := m.build(zoo.model(n))), list(k.output_shape[1:])]"
        " for n in zoo.IMAGE_NAMES + tiny},"
        " 'abstract': {n: blocks.abstract_parameters(zoo.model(n)) for n in zoo.TRANSFORMER_NAMES}}))"
    )
    res = subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, **ENV}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    built, abstract = counts["built"], counts["abstract"]
    assert sorted(built) == sorted([*models.IMAGE_NAMES, "gpt_tiny", "llama_tiny", "bert_tiny", "vit_tiny"])
    for name, (count, out_shape) in built.items():
        tree = models.model(name)
        assert count == models.count_parameters(tree), name
        assert tuple(out_shape) == models.shapes(tree), name
    assert sorted(abstract) == sorted(models.TRANSFORMER_NAMES)
    for name, count in abstract.items():
        assert count == models.count_parameters(models.model(name)), name
    assert abstract["gpt2_124m"] == 124_439_808 and abstract["llama_1b"] == 1_235_814_400


def test_precisions_and_compile_modes_are_refused_where_they_cannot_run() -> None:
    """At planning: tf32 is CUDA's; fp16 needs the loss scaling the parameter servers do not
    run; a compile mode other than XLA's; every transformer is a model of the framework."""

    def said(**fields: Any) -> list[tuple[str, str]]:
        point = Point(**{"framework": "tensorflow", "backend": "multiworker", "ranks_per_node": 2, **fields})
        return [(field, what) for field, what, _ in check_point(point)]

    for name in models.TRANSFORMER_NAMES:
        assert said(model=name) == [], name
    for precision in ("fp32", "bf16", "fp16"):
        assert said(model="gpt_tiny", precision=precision, compile="xla") == [], precision
        assert said(backend="horovod", model="lenet", precision=precision) == [], precision
    assert said(model="gpt_tiny", dataset="text", seq_len=32, precision="bf16") == []
    assert said(backend="ps", model="gpt_tiny", precision="bf16", compile="xla") == []
    ((field, what),) = said(model="gpt_tiny", precision="tf32")
    assert field == "precision" and "CUDA" in what
    assert said(model="gpt_tiny", precision="tf32", device="cuda") == []
    ((field, what),) = said(backend="ps", model="gpt_tiny", precision="fp16")
    assert field == "precision" and "LossScaleOptimizer" in what
    ((field, what),) = said(model="gpt_tiny", compile="inductor")
    assert field == "compile" and "'inductor'" in what


def test_gpt_learns_text_in_fp32_and_bf16(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """The tiny decoder on byte-level text, on two ranks (the strategy's all-reduce), in
    float32 and in Keras' mixed_bfloat16: the loss falls, the gradients travel in float32
    (4 bytes a parameter: the master weights stay float32), the ranks agree."""
    env_python("modern", "tensorflow")
    text = spec(
        "multiworker", {"precision": ["fp32", "bf16"]}, model="gpt_tiny", dataset="text", seq_len=32, batch_size=8,
        iterations=40, warmup=2, optimizer="adam", lr=3e-3,
    )  # fmt: skip
    points = {str(p.point.precision): p for p in run_sweep(write_spec, tmp_path / "sweep", text)}
    assert sorted(points) == ["bf16", "fp32"]
    for precision, data in points.items():
        cells.check_phases(data, 42, cells.PHASES)
        cells.check_messages(data, ("allreduce",), per_op=1, itemsize=4)
        cells.check_weights_agree(data)
        cells.check_learns_tokens(data)
        assert data.iterations["loss"][:, -5:].mean() < 0.75 * data.iterations["loss"][:, :5].mean()
        prov = data.provenance
        assert prov["precision"] == precision
        assert prov["dtype_policy"] == {"fp32": "float32", "bf16": "mixed_bfloat16"}[precision]
        assert prov["attention"].startswith("keras.ops.dot_product_attention")
        assert prov["compile"] == "none"


def test_multiworker_exchanges_every_gradient_and_ranks_agree(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "tensorflow")
    (data,) = run_sweep(write_spec, tmp_path / "sweep", spec("multiworker"))
    check_phases(data)
    check_messages(data, ("allreduce",))
    # default packing: the whole gradient in one all-reduce per iteration
    assert set(data.comm["name"].tolist()) == {b"pack0"}
    cells.check_weights_agree(data)
    check_learnt(data)
    assert data.provenance["tf_strategy"] == "CollectiveAllReduceStrategy"  # MultiWorkerMirroredStrategy


def test_multiworker_packs_and_a_model_without_classes(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "tensorflow")
    text = spec("multiworker", {"model": ["lenet", "autoencoder"]}, extra={"bytes_per_pack": 40_000}, iterations=6)
    points = {p.point.model: p for p in run_sweep(write_spec, tmp_path / "sweep", text)}
    assert sorted(points) == ["autoencoder", "lenet"]
    for data in points.values():
        check_phases(data)
        check_messages(data, ("allreduce",))
        cells.check_weights_agree(data)
        # several packs per iteration, the last layers' gradients first
        per_iteration = np.bincount(data.comm["iteration"][data.comm["rank"] == 0])
        assert (per_iteration > 1).all(), per_iteration
    first = points["lenet"].comm[0]
    assert first["name"] in (b"dense2/bias", b"pack0")  # starts with the output layer
    # The autoencoder is not a classifier: its test reports the reconstruction loss only.
    ev = points["autoencoder"].eval
    assert (ev["total"] == 0).all() and (ev["correct"] == 0).all()
    assert np.isfinite(ev["loss"]).all() and (ev["loss"] > 0).all()


def test_horovod_exchanges_every_gradient_and_ranks_agree(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "tensorflow", "horovod.tensorflow")
    (data,) = run_sweep(write_spec, tmp_path / "sweep", spec("horovod"))
    check_phases(data)
    check_messages(data, ("allreduce",))
    assert set(data.comm["name"].tolist()) == {b"pack0"}  # one grouped (fused) all-reduce per step
    cells.check_weights_agree(data)
    check_learnt(data)
    assert data.provenance["horovod"] == "0.28.1"


def test_horovod_bookkeeping_comm_over_gloo() -> None:
    """The store's collectives over Horovod's object collectives, with no MPI in the ranks
    (horovodrun's Gloo controller): what a job started that way uses."""
    exe = env_python("modern", "tensorflow", "horovod.tensorflow")
    code = (
        "import horovod.tensorflow as hvd\n"
        "from hpcbench.frameworks._horovod import HorovodComm\n"
        "hvd.init(); c = HorovodComm(hvd); c.barrier()\n"
        "assert c.mpi_comm is None and not hvd.mpi_enabled()\n"
        "b = c.bcast({'from': c.rank} if c.rank == 1 else None, root=1)\n"
        "g = c.gather(('r', c.rank), root=0)\n"
        "print('HC', c.rank, c.size, b, g, c.allgather(c.rank * 10), flush=True)\n"
    )
    env = {**os.environ, **ENV, "PATH": f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(
        [str(exe.parent / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2", str(exe), "-c", code],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "HC 0 2 {'from': 1} [('r', 0), ('r', 1)] [0, 10]" in res.stdout
    assert "HC 1 2 {'from': 1} None [0, 10]" in res.stdout


def leftover_servers() -> list[int]:
    """Parameter-server processes still running (their ranks must have ended them)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "hpcbench.frameworks.tensorflow.ps_server" in cmdline:
            found.append(proc.pid)
    return found


def test_parameter_servers_async_and_sync(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "tensorflow")
    before = leftover_servers()
    text = spec("ps", {"extra": [{"sync": False}, {"sync": True, "servers": 2}]})
    out = tmp_path / "sweep"
    points = {p.point.as_dict()["extra"].get("sync"): p for p in run_sweep(write_spec, out, text)}
    assert sorted(points) == [False, True]
    total = ITERATIONS + WARMUP
    for sync, data in points.items():
        check_phases(data)
        # every rank pushed every gradient and pulled every weight, once per iteration each
        check_messages(data, ("push", "pull"))
        check_learnt(data)  # every rank's copy, pulled from the shared weights, learnt the task
        log = (out / "logs" / f"{data.point.id}.log").read_text()
        assert data.provenance["ps_mode"] == ("sync" if sync else "async")
        assert len(data.provenance["ps_cluster"]["ps"]) == (2 if sync else 1)
        if sync:
            # one optimizer step per iteration on the servers; every rank then pulled the same version
            assert f"server version {total} (optimizer steps applied)" in log
            cells.check_weights_agree(data)
        else:
            # Asynchronous: ranks' copies differ (each pulls whatever version the servers hold),
            # so instead: every push of every rank was applied to the one shared copy.
            assert f"server version {RANKS * total} (pushes applied)" in log
            assert "staleness mean" in log
    assert leftover_servers() == before, "the ranks ended their parameter servers"
