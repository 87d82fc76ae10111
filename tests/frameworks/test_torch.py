"""PyTorch through every backend on real ranks: DDP over gloo, MPI (mpi4py), Horovod."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from hpcbench.analysis.model import fit
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan import envs
from hpcbench.store import schema
from hpcbench.store.reader import PointData
from hpcbench.store.traits import Traits
from hpcbench.testing.datasets import make_mnist
from hpcbench.workloads import zoo as models
from tests.conftest import run_module, run_sweep, skip_unless_required, spec_text

pytestmark = pytest.mark.mpi


def check_exchange(data: PointData) -> None:
    """Every rank sent the model's gradients once per iteration and ended with the same weights."""
    spec = models.model(data.point.model)
    grad_bytes = 4 * models.count_parameters(spec)
    comm = data.comm
    for rank in range(data.point.ranks):
        for i in range(data.iterations.shape[1]):
            mine = comm[(comm["rank"] == rank) & (comm["iteration"] == i)]
            assert int(mine["bytes"].sum()) == grad_bytes, (data.point.backend, rank, i)
            assert (mine["t_end"] >= mine["t_start"]).all()
    assert set(comm["op"].tolist()) == {b"allreduce"}
    it = data.iterations
    for phase in ("data", "forward", "backward", "update"):
        assert (it[phase] > 0).all(), phase
    assert (it["comm_total"] > 0).all()
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(data.point.ranks))
    assert len(set(ev["param_checksum"].tolist())) == 1, "weights identical on every rank"
    assert (ev["total"] > 0).all() and (ev["test_time_s"] > 0).all()


def declared_traits(data: PointData) -> Traits:
    """The traits the point's backend declares, with its launcher's `mpi`."""
    launcher = LAUNCHERS.get(data.point.launcher)
    return FRAMEWORKS.get(data.point.framework).traits_of(data.point.backend).with_launcher(mpi=launcher.mpi)


def recorded_traits(data: PointData) -> Traits:
    """The traits as the ranks wrote them into the file (not as the reader fills them in for
    files written before they were recorded)."""
    with h5py.File(data.path, "r") as f:
        raw = f[schema.PROVENANCE].attrs["traits"]
    return Traits.from_mapping(json.loads(raw.decode() if isinstance(raw, bytes) else raw))


def test_gloo_and_mpi_exchange_every_gradient_and_agree(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = spec_text("torch", {"backend": ["gloo", "mpi"]}, ranks_per_node=2, model="cifar10_quick")
    points = run_sweep(write_spec, tmp_path / "sweep", text)
    assert sorted(p.point.backend for p in points) == ["gloo", "mpi"]
    for data in points:
        check_exchange(data)
        # The ranks' output (stdout and stderr) is clean: no deprecated DDP argument, say.
        log = (tmp_path / "sweep" / "logs" / f"{data.point.id}.log").read_text()
        assert "FutureWarning" not in log, (data.point.backend, log[-3000:])
    # The same model, data and averaging: both backends end with the same weights.
    gloo, mpi = (p.eval["param_checksum"][0] for p in sorted(points, key=lambda p: p.point.backend))
    assert gloo == pytest.approx(mpi, rel=1e-5)
    # DDP sends buckets; the MPI exchange one message per parameter tensor.
    by_backend = {p.point.backend: p.comm for p in points}
    assert len(set(by_backend["mpi"]["name"].tolist())) == 10  # 5 layers x (weight, bias)
    # Where a message's end is seen: DDP's callback, when the backend completed the bucket; the
    # MPI exchange's wait once backward is over, so no end comes before its rank's backward ended.
    assert {p.point.backend: p.provenance["comm_end"] for p in points} == {"gloo": "completion", "mpi": "wait"}
    # Each point file carries its backend's declared traits: DDP's buckets, MPI's exchange.
    for data in points:
        assert recorded_traits(data) == data.traits == declared_traits(data), data.point.backend
    assert by_traits(points) == {"gloo": ("buckets", False), "mpi": ("per_tensor", True)}
    comm, began = by_backend["mpi"], fit.wait_starts(next(p for p in points if p.point.backend == "mpi").iterations)
    assert (comm["t_end"] >= began[comm["rank"], comm["iteration"]] - 1e-6).all()


def by_traits(points: list[PointData]) -> dict[str, tuple[str, bool]]:
    return {p.point.backend: (p.traits.grouping, p.traits.mpi_exchange) for p in points}


def test_the_launchers_part_of_the_traits_is_whether_it_starts_mpi_ranks(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    text = spec_text("traits", {"launcher": ["mpirun", "torchrun"]}, ranks_per_node=2, iterations=2, warmup=1)
    points = run_sweep(write_spec, tmp_path / "sweep", text)
    for data in points:
        assert recorded_traits(data) == data.traits == declared_traits(data), data.point.launcher
        assert data.traits.grouping == "buckets" and data.traits.sleeping_wait and data.traits.momentum == 0.9
    assert {p.point.launcher: p.traits.launcher_mpi for p in points} == {"mpirun": True, "torchrun": False}


def test_a_separable_task_trains_past_90_percent(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = spec_text("acc", {"ranks_per_node": [2]}, model="mlp", iterations=40, warmup=0, lr=0.05, batch_size=32)
    (data,) = run_sweep(write_spec, tmp_path / "sweep", text)
    ev = data.eval
    accuracy = ev["correct"].sum() / ev["total"].sum()
    assert accuracy > 0.9, accuracy
    assert data.iterations["loss"][:, -1].mean() < data.iterations["loss"][:, 0].mean()


def test_mnist_files_train_for_whole_epochs_with_a_test_after_each(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    make_mnist(tmp_path / "mnist", n_train=96, n_test=32)
    text = spec_text(
        "mnist", {"ranks_per_node": [2]}, dataset="mnist", data_dir=str(tmp_path / "mnist"), epochs=2, batch_size=8
    )
    (data,) = run_sweep(write_spec, tmp_path / "sweep", text)
    steps = 96 // 2 // 8  # each rank's shard, in batches
    assert data.iterations.shape == (2, 1 + 2 * steps)  # one warm-up iteration, then two epochs
    ev = np.sort(data.eval, order=["epoch", "rank"])
    assert ev["epoch"].tolist() == [1, 1, 2, 2]
    assert ev["iteration"].tolist() == [1 + steps] * 2 + [1 + 2 * steps] * 2
    assert ev["total"].tolist() == [16] * 4  # every rank tests its half of the 32 held-out images
    assert (ev["train_time_s"][2:] > ev["train_time_s"][:2]).all()


def test_models_that_do_not_fit_the_data_are_refused_before_anything_runs(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    text = spec_text("bad", model="alexnet", dataset="mnist", data_dir=str(tmp_path))
    res = run_module("hpcbench.sweep", str(write_spec(text)), "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert "model alexnet on input (1, 28, 28)" in res.stderr and "too small" in res.stderr
    assert not (tmp_path / "out").exists()
    res = run_module("hpcbench.sweep", str(write_spec(spec_text("bad", dataset="cifar10"))), "--dry-run")
    assert res.returncode == 2 and "data_dir" in res.stderr


def modern_env() -> None:
    try:
        envs.python("modern")
    except Exception as exc:
        skip_unless_required(f"needs the modern environment: {exc}")


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_horovod_exchanges_every_gradient_on_every_rank(
    write_spec: Callable[..., Path], tmp_path: Path, launcher: str
) -> None:
    modern_env()
    text = spec_text("hvd", {"launcher": [launcher]}, ranks_per_node=2, backend="horovod", env="modern")
    (data,) = run_sweep(write_spec, tmp_path / "sweep", text)
    check_exchange(data)
    assert data.provenance["horovod"] == "0.28.1"
    assert data.provenance["torch_exchange"] == "horovod"
    assert data.provenance["comm_end"] == "wait"
    assert recorded_traits(data) == declared_traits(data)
    assert data.traits.grouping == "fusion" and data.traits.background_thread
    assert data.traits.launcher_mpi == (launcher == "mpirun")


def test_transformers_train_on_two_ranks_with_their_figures(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """The tiny decoders and the masked-LM on the text every Python ships, two real ranks:
    DDP in fp32 and in bf16 (autocast: the gradients still travel in fp32), the MPI exchange;
    the loss falls, the ranks agree, every gradient byte is sent; the recorded FLOPs are
    PyTorch's own count and the workload's figures follow from the measured throughput."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hpcbench.analysis import workload
    from hpcbench.frameworks.base import model_for
    from hpcbench.frameworks.torch import layers as torch_layers
    from tests.frameworks.cells import check_learns_tokens, check_messages, check_weights_agree

    cells = [
        {"model": "gpt_tiny", "backend": "gloo", "precision": "fp32"},
        {"model": "llama_tiny", "backend": "gloo", "precision": "bf16"},
        {"model": "bert_tiny", "backend": "mpi", "precision": "fp32"},
    ]
    spec = yaml.safe_load(
        spec_text(
            "transformers",
            {"cell": cells},
            ranks_per_node=2,
            dataset="text",
            seq_len=32,
            batch_size=8,
            iterations=30,
            warmup=2,
            optimizer="adamw",
            lr=0.003,
            threads=1,
        )
    )
    del spec["fixed"]["model"]  # the cells name theirs
    text = yaml.safe_dump(spec)  # fmt: skip
    points = {p.point.model: p for p in run_sweep(write_spec, tmp_path / "sweep", text)}
    assert sorted(points) == ["bert_tiny", "gpt_tiny", "llama_tiny"]
    for data in points.values():
        check_messages(data, itemsize=4)
        check_weights_agree(data)
        check_learns_tokens(data)
        prov, model = data.provenance, model_for(data.point)
        assert prov["attention"] == "torch.nn.functional.scaled_dot_product_attention"
        assert prov["torch_autocast"] == ("bfloat16" if data.point.precision == "bf16" else "off")
        assert prov["tokens_per_sample"] == 32 and prov["parameters"] == models.count_parameters(model)
        with torch.device("meta"):
            net = torch_layers.build(model)
        with FlopCounterMode(display=False) as counter:
            net(torch.zeros((1, 32), dtype=torch.int64, device="meta")).sum().backward()
        assert prov["model_flops_per_sample"] == counter.get_total_flops()
        figures = workload.row(data, 100.0)  # at 100 samples/s, on one CPU (one node)
        assert figures["tokens_per_s"] == 3200 and figures["tokens_per_s_device"] == 3200
        assert figures["tflops_device"] == pytest.approx(100 * counter.get_total_flops() / 1e12)
        assert 0 < figures["peak_host_gib"] < 8 and np.isnan(figures["peak_device_gib"])
        assert 1 < figures["perplexity"] < 256  # learnt: below a uniform byte's
