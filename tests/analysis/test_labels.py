"""Labels tell points apart wherever several are shown (hpcbench.spec.labels): in `compare`, in
the report's tables and figures; and an accuracy on synthetic data reads as what it is (chance,
after a short run), not as a model's accuracy. Point files are fabricated; nothing runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcbench.analysis import accuracy, pipeline
from hpcbench.analysis import compare as cmp
from hpcbench.analysis.report import figures, html
from hpcbench.executors import catalog
from hpcbench.plan.launch import parse_sweep
from hpcbench.spec import Point, differing, labels
from hpcbench.sweepdir.manifest import DONE, Manifest
from hpcbench.testing.arrays import eval_rows, iterations
from hpcbench.testing.fabricate import write_point_file
from tests.conftest import run_module

PS = Point(framework="tensorflow", backend="ps", env="modern", ranks_per_node=2, batch_size=8)


def servers(n: int, **fields: object) -> Point:
    return Point(**{**PS.as_dict(), "extra": {"servers": n, "sync": False}, **fields})


def test_points_that_differ_only_in_extra_get_their_own_labels() -> None:
    one, two = servers(1), servers(2)
    found = labels([one, two])
    assert found == {
        one.id: "tensorflow/ps lenet 1x2 b=8 extra.servers=1",
        two.id: "tensorflow/ps lenet 1x2 b=8 extra.servers=2",
    }
    assert one.label() == two.label()  # what Point.label() alone would show


def test_a_label_of_its_own_stays_short_and_only_what_differs_is_named() -> None:
    a, b, c = servers(1), servers(2), servers(1, ranks_per_node=4)
    found = labels([a, b, c])
    assert found[c.id] == c.label()  # the only 1x4 point: nothing added
    assert found[a.id].endswith("extra.servers=1") and "sync" not in found[a.id]  # sync is equal


def test_unset_fields_launcher_and_seed_are_named() -> None:
    plain, srun, seeded = Point(), Point(launcher="srun"), Point(seed=3, env="modern")
    found = labels([plain, srun, seeded])
    assert found[plain.id] == "torch/gloo lenet 1x1 b=32 launcher=mpirun seed=0 env=unset"
    assert found[srun.id] == "torch/gloo lenet 1x1 b=32 launcher=srun seed=0 env=unset"
    assert found[seeded.id] == "torch/gloo lenet 1x1 b=32 launcher=mpirun seed=3 env=modern"
    assert len(set(found.values())) == 3
    assert differing([plain, seeded], ignore=("seed",))[seeded.id] == "env=modern"


def test_compare_labels_configurations_that_differ_only_in_extra(tmp_path: Path) -> None:
    for side in ("old", "new"):
        (tmp_path / side).mkdir()
        for n in (1, 2):
            p = servers(n)
            write_point_file(tmp_path / side / f"{p.id}.h5", p, iterations(2, 8, forward=0.01, batch=8))
    c = cmp.compare(tmp_path / "old", tmp_path / "new")
    shown = sorted(c.labels[row.key] for row in c.rows)
    assert shown == ["tensorflow/ps lenet 1x2 b=8 extra.servers=1", "tensorflow/ps lenet 1x2 b=8 extra.servers=2"]


SERVERS_SPEC = (
    "name: servers\nexecutor: local\nmatrix:\n  extra: [{servers: 1, sync: false}, {servers: 2, sync: false}]\n"
    "fixed: {framework: tensorflow, backend: ps, env: modern, ranks_per_node: 2, batch_size: 8}\n"
)


def test_status_tells_points_apart(tmp_path: Path) -> None:
    points = parse_sweep(SERVERS_SPEC, catalog()).points
    assert {p.id for p in points} == {servers(1).id, servers(2).id}
    (tmp_path / "spec.yaml").write_text(SERVERS_SPEC, encoding="utf-8")
    manifest = Manifest(tmp_path, "servers", "local")
    for p in points:
        manifest.add(p).state = DONE
    manifest.save()
    assert {e.label for e in Manifest.load(tmp_path).entries.values()} == {
        "tensorflow/ps lenet 1x2 b=8 extra.servers=1",
        "tensorflow/ps lenet 1x2 b=8 extra.servers=2",
    }
    res = run_module("hpcbench", "status", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "extra.servers=1" in res.stdout and "extra.servers=2" in res.stdout


@pytest.fixture(scope="module")
def synthetic_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two LeNet points on synthetic data that differ only in extra, one tested at chance
    (11 of 128 = 8.59 %), one well above it; and a point of its own on MNIST at 8.59 %."""
    root = tmp_path_factory.mktemp("labels")
    cases = [(servers(1), 11), (servers(2), 120), (Point(dataset="mnist", data_dir="/data", batch_size=8), 11)]
    for point, correct in cases:
        it = iterations(2, 8, warmup=2, forward=0.01, batch=8)
        evals = eval_rows([(r, 1, 0.5, 0.05, correct // 2 + (r * (correct % 2)), 64) for r in range(2)])
        write_point_file(root / f"{point.id}.h5", point, it, evals=evals)
    return root


def test_the_report_tells_points_apart_and_reads_synthetic_accuracy(synthetic_sweep: Path) -> None:
    analysis = pipeline.analyse(synthetic_sweep)
    text = html.render_markdown(analysis, [])
    assert "| differs in |" in text
    assert "extra.servers=1" in text and "extra.servers=2" in text
    assert "chance (8.59; synthetic data)" in text  # LeNet on synthetic data, at chance
    assert "93.75 (synthetic data; chance 10.00)" in text  # learnt the prototypes
    assert "| 8.59 |" in text  # on MNIST: a plain accuracy
    assert "Accuracy 8.59" not in text
    stats = html.labelled(analysis).set_index("point")
    one, two = servers(1).id, servers(2).id
    assert stats.loc[one, "differs"] == "extra.servers=1" and stats.loc[two, "series"] == "extra.servers=2"
    assert stats.loc[one, "chance"] == pytest.approx(0.1)
    bars = [figures.point_label(row) for _, row in html.labelled(analysis).iterrows()]
    assert len(set(bars)) == len(bars)  # a bar per point, each its own label
    lines = [name for name, _ in figures._series(html.labelled(analysis))]
    assert len(lines) == 3 and len(set(lines)) == 3


def test_chance_is_one_over_the_classes() -> None:
    assert accuracy.chance(Point()) == pytest.approx(0.1)
    assert accuracy.chance(Point(model="resnet50")) == pytest.approx(0.001)
    assert accuracy.chance(Point(model="autoencoder")) is None
    assert accuracy.at_chance(0.12, Point(), 128) and not accuracy.at_chance(0.5, Point(), 128)
    assert accuracy.reading(float("nan"), Point()) == ""
    assert np.isfinite(accuracy.chance(Point(dataset="cifar10", data_dir="/d", model="alexnet")) or np.nan)
