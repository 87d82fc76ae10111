"""One rank driving several devices (`devices_per_rank`), on the CPU's logical devices:
TensorFlow's `MirroredStrategy` and JAX's `pmap` over host devices (`modern` environment),
MXNet's contexts cpu(0), cpu(1) under its dist_sync kvstore (`legacy`).

Two ranks of two devices train as four ranks of one (JAX, MXNet), and as one rank of four devices
(TensorFlow: three processes rather than six, whose start-up is most of the test's time): a
rank of D devices reads what its devices would read as ranks of their own
(frameworks/replicas.py), so the points see the same global batches; their losses agree
iteration by iteration and their weights at the end, to what the order of the sums allows.
A rank records the samples it really processed (batch_size per device) and exchanges the
model's gradient bytes once per iteration, not once per device. Planning refuses the field
where a framework or backend drives one device, and with a layout that splits the model.

Sweeps run through the real sweep CLI, as a user runs them (their ranks in `env: modern`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcbench.errors import SpecError
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.spec import Point, load_sweep
from hpcbench.store.reader import PointData
from tests.conftest import env_python, run_module, run_sweep, spec_text
from tests.frameworks.cells import PHASES, check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

# 9 iterations: the 9th sees the first batch again (synthetic data cycles through 8 per rank)
BATCH, ITERATIONS, WARMUP = 8, 8, 1


def sweep(
    write_spec: Callable[..., Path],
    out: Path,
    framework: str,
    backend: str,
    other: tuple[int, int],
    env: str = "modern",
) -> tuple[PointData, PointData]:
    """mlp trained on 2 ranks x 2 devices and on `other` (ranks, devices per rank; 4 devices
    too, so the same global batches): their point files in that order."""
    stack = [{"ranks_per_node": 2, "devices_per_rank": 2}, {"ranks_per_node": other[0], "devices_per_rank": other[1]}]
    text = spec_text(
        f"{framework}_devices", {"stack": stack}, framework=framework, backend=backend, env=env, model="mlp",
        batch_size=BATCH, iterations=ITERATIONS, warmup=WARMUP, threads=1, lr=0.05,
    )  # fmt: skip
    points = {p.point.devices_per_rank: p for p in run_sweep(write_spec, out, text)}
    assert sorted(points) == sorted({2, other[1]})
    return points[2], points[other[1]]


def check_alike(
    two: PointData, other: PointData, per_op: int | None = None, ops: tuple[str, ...] = ("allreduce",)
) -> None:
    """`two` (2 ranks x 2 devices) trained as `other` (4 devices too) did, exchanging once per rank."""
    n = ITERATIONS + WARMUP
    for data in (two, other):
        if ops == ("allreduce",):
            check_phases(data, n, PHASES)
        else:  # parameter servers update inside the exchange: no update phase
            check_phases(data, n, PHASES[:-1], ("update",))
        check_messages(data, ops, per_op)  # per rank, iteration and op: the model's gradient bytes, once
        check_weights_agree(data)
        # a batch per device: the samples the rank processed in an iteration
        assert (data.iterations["samples"] == data.point.devices_per_rank * BATCH).all()
    assert two.point.ranks == 2 and other.point.ranks * other.point.devices_per_rank == 4
    assert (two.iterations["samples"] == 2 * BATCH).all()
    # The same global batches: the mean loss over ranks, iteration by iteration, and the weights.
    losses = [d.iterations["loss"].astype(np.float64).mean(axis=0) for d in (two, other)]
    assert np.isfinite(losses[0]).all()
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert losses[0][8] < losses[0][0], "trained: the first batch, seen again, has a lower loss"
    sums = [float(d.eval["param_checksum"][0]) for d in (two, other)]
    assert sums[0] == pytest.approx(sums[1], rel=1e-5)


def test_tensorflow_two_ranks_of_two_devices_train_as_one_rank_of_four(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    env_python("modern", "tensorflow")
    two, one = sweep(write_spec, tmp_path / "out", "tensorflow", "multiworker", (1, 4))
    check_alike(two, one, per_op=1)  # the strategy's one pack
    for data, devices in ((two, 2), (one, 4)):
        replicas = data.provenance["tf_replicas"]
        assert replicas.startswith("MirroredStrategy over ") and replicas.count("device:CPU:") == devices


def test_jax_two_ranks_of_two_devices_train_as_four_ranks(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "jax")
    two, four = sweep(write_spec, tmp_path / "out", "jax", "pmean", (4, 1))
    check_alike(two, four, per_op=6)  # one message per tensor: mlp's 3 x (kernel, bias)
    assert (two.provenance["jax_local_devices"], two.provenance["jax_devices"]) == ("2", "4")
    assert (four.provenance["jax_local_devices"], four.provenance["jax_devices"]) == ("1", "4")


@pytest.mark.parametrize(
    ("stack", "needle"),
    [
        ({"framework": "torch", "backend": "gloo"}, "fixed.devices_per_rank: torch gloo drives one device per rank"),
        ({"framework": "tensorflow", "backend": "ps"}, "tensorflow ps drives one device per rank"),
        ({"framework": "jax", "backend": "pmean", "devices_per_rank": 0}, "devices_per_rank: 0 is too small"),
        ({"framework": "tensorflow", "backend": "multiworker", "compile": "xla"}, "compile: xla with several devices"),
    ],
)
def test_planning_refuses_devices_per_rank_where_a_rank_drives_one_device(
    write_spec: Callable[..., Path], tmp_path: Path, stack: dict[str, Any], needle: str
) -> None:
    """Exit 2, one line naming the field and the framework (or what is allowed), nothing created."""
    fixed: dict[str, Any] = {"model": "mlp", "devices_per_rank": 2, **stack}
    out = tmp_path / "out"
    res = run_module("hpcbench.sweep", str(write_spec(spec_text("refused", **fixed))), "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stderr
    assert "(allowed: 1" in lines[0] or "(allowed: integers >= 1" in lines[0] or "(allowed: compile unset" in lines[0]
    assert not out.exists()


def test_the_field_keeps_old_ids_shows_in_labels_and_refuses_a_split_model() -> None:
    """devices_per_rank 1 (the default) is left out of the id, as before the field existed;
    more is in the id and the label; a layout that splits the model over ranks is refused."""
    plain = Point(framework="jax", backend="pmean", model="mlp", ranks_per_node=2)
    assert Point(framework="jax", backend="pmean", model="mlp", ranks_per_node=2, devices_per_rank=1).id == plain.id
    fields = {k: v for k, v in plain.as_dict().items() if k != "devices_per_rank"}  # as before the field
    canonical = {k: v for k, v in sorted(fields.items()) if v is not None and v not in ((), {})}
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()
    assert plain.id == hashlib.sha256(blob).hexdigest()[:12]
    two = Point.from_json(Point(framework="jax", backend="pmean", model="mlp", devices_per_rank=2).to_json())
    assert two.devices_per_rank == 2 and two.rank_batch == 2 * two.batch_size
    assert two.id != Point(framework="jax", backend="pmean", model="mlp").id
    assert two.label() == "jax/pmean mlp 1x1 b=32 2 dev/rank"
    split = Point(framework="tensorflow", backend="multiworker", model="mlp", ranks_per_node=2, devices_per_rank=2,
                  parallel=(("fsdp", 2),))  # fmt: skip
    problems = list(FRAMEWORKS.get("tensorflow").check_point(split))
    assert ("devices_per_rank", "fsdp2 splits the model over ranks; several devices per rank replicate it",
            "1 with this parallel layout, or parallel unset (data parallelism)") in problems  # fmt: skip
    assert list(FRAMEWORKS.get("tensorflow").check_point(dataclasses.replace(split, parallel=()))) == []
    several = {cls.name: cls.several_devices for cls in FRAMEWORKS}
    assert {name: backends for name, backends in several.items() if backends} == {
        "tensorflow": ("multiworker", "horovod"), "jax": ("pmean", "pmean_fused"), "mxnet": ("dist_sync", "dist_async"),
    }  # fmt: skip
    assert all(set(backends) <= set(FRAMEWORKS.get(name).backends) for name, backends in several.items())


def test_gpus_per_node_counts_the_devices_of_the_ranks_of_a_node() -> None:
    """gpus_per_node = ranks_per_node * devices_per_rank: 8 GPUs of ranks driving 2 each are
    4 ranks; alone, or with one device a rank, it is ranks_per_node as before; a count the
    devices per rank does not divide is refused, naming the field."""
    fixed = "framework: jax, backend: pmean, model: mlp"
    sweep = load_sweep(f"name: g\nmatrix: {{devices_per_rank: [1, 2]}}\nfixed: {{{fixed}, gpus_per_node: 8}}\n")
    assert [(p.ranks_per_node, p.devices_per_rank) for p in sweep.points] == [(8, 1), (4, 2)]
    with pytest.raises(SpecError) as refused:
        load_sweep(f"name: g\nfixed: {{{fixed}, gpus_per_node: 6, devices_per_rank: 4}}\n")
    assert str(refused.value).startswith("fixed.gpus_per_node: 6 devices a node do not split into ranks")


def test_mxnet_two_ranks_of_two_contexts_train_as_four_ranks(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """MXNet's dist_sync kvstore: a rank's contexts cpu(0), cpu(1), their gradients summed by
    the kvstore as it pushes (once per parameter), the pulled weights written to both."""
    env_python("legacy", "mxnet")
    two, four = sweep(write_spec, tmp_path / "out", "mxnet", "dist_sync", (4, 1), env="legacy")
    check_alike(two, four, per_op=6, ops=("push", "pull"))  # mlp: 3 x (weight, bias), a push and a pull each
    assert two.provenance["mxnet_contexts"] == "cpu(0), cpu(1)" and four.provenance["mxnet_contexts"] == "cpu(0)"
