"""PyTorch's parallel layouts on real ranks: sharded (FSDP2, ZeRO 2 and 3, hybrid), tensor
parallel (Megatron's split) and both, against plain data parallelism as the truth.

The truths: a sharded layout trains exactly what DDP trains on as many data ranks (the same
losses, every rank's, and the same weights); a tensor-parallel layout trains what DDP trains
on its data ranks alone (2 ranks here), up to the order of summation; every collective's
bytes are what the layout must move, from the model's parameter count and activation
shape alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hpcbench.analysis import pipeline
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.spec import Point
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo
from tests.conftest import run_sweep

BATCH, SEQ = 4, 32
LAYOUTS: dict[str, tuple[int, dict[str, int | str]]] = {  # label: (ranks, parallel)
    "dp2": (2, {}),
    "dp4": (4, {}),
    "fsdp4": (4, {"fsdp": 4}),
    "hsdp zero2": (4, {"fsdp": 2, "zero": 2}),
    "tp2": (4, {"tp": 2}),
    "tp2 fsdp2": (4, {"tp": 2, "fsdp": 2}),
    "pp2 1f1b": (4, {"pp": 2, "microbatches": 4}),
    "pp2 gpipe": (4, {"pp": 2, "microbatches": 2, "schedule": "gpipe"}),
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PointData]:
    tmp = tmp_path_factory.mktemp("layouts")
    cells = [{"ranks_per_node": ranks, "parallel": parallel} for ranks, parallel in LAYOUTS.values()]
    spec = {
        "name": "layouts",
        "executor": "local",
        "matrix": {"cell": cells},
        "fixed": {
            "framework": "torch",
            "backend": "gloo",
            "model": "gpt_tiny",
            "seq_len": SEQ,
            "batch_size": BATCH,
            "iterations": 3,
            "warmup": 1,
            "optimizer": "adamw",
            "lr": 0.003,
            "threads": 1,
        },
    }

    def write(text: str) -> Path:
        path = tmp / "spec.yaml"
        path.write_text(text)
        return path

    points = run_sweep(write, tmp / "sweep", yaml.safe_dump(spec))
    found = {label: p for label in LAYOUTS for p in points if _matches(p.point, *LAYOUTS[label])}
    assert sorted(found) == sorted(LAYOUTS)
    return found


def _matches(point: Point, ranks: int, parallel: dict[str, int | str]) -> bool:
    return point.ranks == ranks and dict(point.parallel) == parallel


def _losses(p: PointData) -> np.ndarray:
    return np.asarray(p.iterations["loss"], dtype=np.float64)


def _checksums(p: PointData) -> np.ndarray:
    return np.asarray(p.eval["param_checksum"], dtype=np.float64)


def _per_iteration(p: PointData, op: str, axis: str, rank: int = 0) -> tuple[int, int]:
    """(messages, bytes) of one rank's `op` on `axis` in each iteration (the same in each)."""
    comm = p.comm
    mine = comm[(comm["rank"] == rank) & (comm["op"] == op.encode()) & (comm["axis"] == axis.encode())]
    counts = {
        int(i): (int((mine["iteration"] == i).sum()), int(mine["bytes"][mine["iteration"] == i].sum()))
        for i in range(p.iterations.shape[1])
    }
    assert len(set(counts.values())) == 1, counts
    return counts[0]


def test_sharded_layouts_train_exactly_what_data_parallelism_trains(layouts: dict[str, PointData]) -> None:
    ddp = layouts["dp4"]
    for label in ("fsdp4", "hsdp zero2"):
        p = layouts[label]
        assert p.complete
        np.testing.assert_allclose(_losses(p), _losses(ddp), rtol=1e-5, err_msg=label)
        np.testing.assert_allclose(_checksums(p), _checksums(ddp), rtol=1e-7, err_msg=label)  # float32 weights
        assert p.provenance["torch_exchange"] == "fsdp"


def test_tensor_parallel_layouts_train_what_their_data_ranks_train(layouts: dict[str, PointData]) -> None:
    reference = layouts["dp2"]  # the same two data ranks, each rank the whole model
    for label in ("tp2", "tp2 fsdp2"):
        p = layouts[label]
        loss = _losses(p)
        # peers of a tensor-parallel group read one batch and agree on its loss
        np.testing.assert_array_equal(loss[0::2], loss[1::2])
        np.testing.assert_allclose(loss[0::2], _losses(reference), rtol=2e-4, err_msg=label)
        np.testing.assert_allclose(_checksums(p), _checksums(reference)[0], rtol=1e-6, err_msg=label)
    # the first iteration starts from the same weights on the same data: the same loss to rounding
    assert _losses(layouts["tp2"])[0, 0] == pytest.approx(_losses(reference)[0, 0], rel=1e-6)


def test_pipelines_train_what_their_data_ranks_train(layouts: dict[str, PointData]) -> None:
    """Two stages, each of two replicas, against DDP on those two data ranks: the last stage's
    losses (the other stage records none: it computes no loss) and the weights, the head's
    tied copy kept equal to the embedding table."""
    reference = layouts["dp2"]
    for label in ("pp2 1f1b", "pp2 gpipe"):
        p = layouts[label]
        loss = _losses(p)
        assert np.isnan(loss[:2]).all(), label  # stage 0: ranks 0 and 1 (pp is the outermost axis)
        np.testing.assert_allclose(loss[2:], _losses(reference), rtol=2e-4, err_msg=label)
        np.testing.assert_allclose(_checksums(p), _checksums(reference)[0], rtol=1e-6, err_msg=label)
        np.testing.assert_allclose(p.eval["loss"], np.tile(reference.eval["loss"], 2), rtol=2e-4, err_msg=label)


def test_every_collective_moves_the_bytes_the_layout_must(layouts: dict[str, PointData]) -> None:
    model = zoo.model("gpt_tiny")
    params = 4 * zoo.count_parameters(model)  # fp32 bytes
    blocks = [layer for layer in model.layers if isinstance(layer, zoo.Block)]
    width = zoo.output_shape(model.layers[0], (SEQ,))[-1]
    activation = 4 * BATCH * SEQ * width
    units = len(blocks) + 1  # FSDP units: each block, and the root holding the rest

    assert _per_iteration(layouts["dp4"], "allreduce", "dp")[1] == params
    # ZeRO 3: every unit gathered for forward and again for backward; its gradients scattered once
    assert _per_iteration(layouts["fsdp4"], "allgather", "fsdp") == (2 * units, 2 * params)
    assert _per_iteration(layouts["fsdp4"], "reducescatter", "fsdp") == (units, params)
    # ZeRO 2: gathered once; hybrid: each unit's reduced half all-reduced over the replicas
    hsdp = layouts["hsdp zero2"]
    assert _per_iteration(hsdp, "allgather", "fsdp") == (units, params)
    assert _per_iteration(hsdp, "reducescatter", "fsdp") == (units, params)
    assert _per_iteration(hsdp, "allreduce", "dp") == (units, params // 2)
    # Megatron: per block two all-reduces of the activations forward, two of their gradients backward
    assert _per_iteration(layouts["tp2"], "allreduce", "tp") == (4 * len(blocks), 4 * len(blocks) * activation)
    assert set(layouts["tp2"].comm["axis"].tolist()) == {b"tp", b"dp"}
    # a pipeline: each micro-batch's activations sent forward, their gradients back; the tied
    # table's gradient summed over the ends; each stage's gradients all-reduced over dp in one message
    table = next(layer for layer in model.layers if isinstance(layer, zoo.Embedding))
    for label, micro in (("pp2 1f1b", 4), ("pp2 gpipe", 2)):
        p = layouts[label]
        for rank, op in ((0, "send"), (0, "recv"), (2, "send"), (2, "recv")):
            assert _per_iteration(p, op, "pp", rank) == (micro, activation), (label, rank, op)
        assert _per_iteration(p, "allreduce", "pp") == (1, 4 * table.vocab * table.dim)
        stage_bytes = [_per_iteration(p, "allreduce", "dp", rank)[1] for rank in (0, 2)]
        assert sum(stage_bytes) == params + 4 * table.vocab * table.dim  # the head's copy too


@pytest.fixture(scope="module")
def analysed(layouts: dict[str, PointData]) -> pd.DataFrame:
    """The sweep's layouts measured beside the layout model (analysis/layouts_measured.py)."""
    return pipeline.analyse(layouts["dp4"].path.parent, use_cache=False).layouts


def test_every_layout_is_ranked_measured_beside_predicted(
    layouts: dict[str, PointData], analysed: pd.DataFrame
) -> None:
    """One row per layout of the 4 ranks (dp2, 2 ranks and plain data parallelism, is a group
    of one layout: not listed), each predicted from the model calibrated on dp4 alone."""
    four = sorted(p.point_id for p in layouts.values() if p.point.ranks == 4)
    table = analysed
    assert sorted(table["point"]) == four
    assert np.isfinite(table["predicted_t_iter_s"].astype(float)).all()
    assert np.isfinite(table["measured_t_iter_s"].astype(float)).all()
    ranks = list(range(1, len(four) + 1))
    assert sorted(table["measured_rank"]) == ranks and sorted(table["predicted_rank"]) == ranks
    calibration = table[table["calibration"].astype(bool)]
    assert list(calibration["point"]) == [layouts["dp4"].point_id]
    assert (table["cal_point"] == layouts["dp4"].point_id).all()
    # the calibration: dp4's own forward + backward as the compute, a link fitted on its messages
    assert table["cal_compute_s"].iloc[0] > 0 and table["cal_beta_s_per_byte"].iloc[0] > 0
    assert (table["status"] == "measured").all()


def test_layouts_a_framework_or_model_cannot_run_are_refused_naming_the_split() -> None:
    torch = FRAMEWORKS.get("torch")

    def problems(framework: str, model: str, parallel: dict[str, int], ranks: int = 4) -> list[tuple[str, str, str]]:
        point = Point(
            framework=framework,
            backend="gloo",
            model=model,
            ranks_per_node=ranks,
            parallel=tuple(sorted(parallel.items())),
        )
        return list(FRAMEWORKS.get(framework).check_point(point))

    assert problems("torch", "gpt_tiny", {"tp": 2, "fsdp": 2}) == []
    (field, what, _), *_ = problems("torch", "gpt_tiny", {"tp": 2, "fsdp": 4})
    assert field == "parallel" and "fsdp 4 * tp 2 = 8 does not divide the point's 4 ranks" in what
    (field, what, _), *_ = problems("torch", "lenet", {"tp": 2})
    assert field == "parallel.tp" and "no transformer blocks" in what
    (field, what, _), *_ = problems("torch", "gpt_tiny", {"pp": 2, "fsdp": 2})
    assert field == "parallel.fsdp" and "not sharded" in what
    (field, what, _), *_ = problems("torch", "gpt_tiny", {"pp": 4})
    assert field == "parallel.pp" and "more stages than gpt_tiny's 2 blocks" in what
    assert torch.layouts == ("fsdp", "tp", "pp")
    mxnet = FRAMEWORKS.get("mxnet")
    point = Point(
        framework="mxnet", backend=mxnet.backends[0], model="lenet", ranks_per_node=4, parallel=(("fsdp", 4),)
    )
    assert any(field == "parallel.fsdp" for field, _, _ in mxnet.check_point(point))
