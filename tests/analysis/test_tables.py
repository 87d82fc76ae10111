"""A sweep of point files written by the real writer, with contents known by construction,
read back into the three tables, the derived tables and the predictions."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import pipeline, stats, tables
from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.testing.arrays import (
    ALPHA,
    BATCH,
    BETA,
    MIB,
    eval_rows,
    hand_schedule,
    iterations,
    model_point,
    resource_rows,
)
from hpcbench.testing.fabricate import write_point_file


@pytest.fixture(scope="module")
def model_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    directory = tmp_path_factory.mktemp("model")
    t_iter = {n: model_point(directory, n)[1] for n in (1, 2, 4, 8)}
    return directory, t_iter


def test_predictions_match_a_sweep_that_follows_the_model(model_sweep: tuple[Path, dict[int, float]]) -> None:
    directory, t_iter = model_sweep
    analysis = pipeline.analyse(directory)
    pred = analysis.predictions.set_index("ranks")
    rows: dict[Any, dict[Any, Any]] = pred.to_dict("index")
    assert sorted(pred.index) == [1, 2, 4, 8]
    for n in (1, 2, 4, 8):
        assert pred.loc[n, "measured_t_iter_s"] == pytest.approx(t_iter[n])
        assert pred.loc[n, "predicted_t_iter_s"] == pytest.approx(t_iter[n], rel=1e-6)
        assert abs(rows[n]["rel_error"]) < 1e-6
        assert pred.loc[n, "predicted_efficiency"] == pytest.approx(pred.loc[n, "measured_efficiency"], rel=1e-6)
        assert pred.loc[n, "pred_comm_total_s"] == pytest.approx(hand_schedule(n)[1], rel=1e-6)
    # fitted on N = 1 (phases) and N = 2 (messages); 4 and 8 are out of sample
    assert pred["calibration"].to_dict() == {1: True, 2: True, 4: False, 8: False}
    assert pred.loc[8, "alpha_s"] == pytest.approx(ALPHA)
    assert pred.loc[8, "beta_s_per_byte"] == pytest.approx(BETA)
    # without overlap every message is exposed: the prediction is slower than measured
    exposed, total, _, _ = hand_schedule(8)
    assert pred.loc[8, "predicted_no_overlap_s"] == pytest.approx(t_iter[8] - exposed + total, rel=1e-6)
    assert rows[8]["rel_error_no_overlap"] > 0


def test_commbench_link_replaces_the_message_fit(model_sweep: tuple[Path, dict[int, float]]) -> None:
    from hpcbench.analysis.model.iteration import LinkCost

    analysis = pipeline.analyse(model_sweep[0], link=LinkCost(2 * ALPHA, BETA))
    row = analysis.predictions.set_index("ranks").loc[8]
    assert row["alpha_s"] == pytest.approx(2 * ALPHA)
    assert row["comm_source"] == "commbench"
    assert float(row["rel_error"]) > 0  # twice the latency: slower than measured


# ------------------------------------------------------------------------------------
# Resources, accuracy, repeats: another sweep


@pytest.fixture(scope="module")
def mixed_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mixed")
    two = Point(framework="torch", backend="gloo", model="lenet", ranks_per_node=2, batch_size=BATCH)
    res = resource_rows([(0, 50, 10, 1, 100 * MIB), (0, 60, 20, 3, 300 * MIB), (1, 40, 30, 2, 200 * MIB)])
    evals = eval_rows(
        [
            (0, 1, 10.0, 1.0, 40, 50), (1, 1, 11.0, 1.5, 30, 50),  # 70 %
            (0, 2, 20.0, 1.0, 45, 50), (1, 2, 21.0, 1.2, 47, 50),  # 92 %
            (0, 3, 30.0, 1.1, 44, 50), (1, 3, 31.0, 0.9, 46, 50),  # 90 %
        ]
    )  # fmt: skip
    write_point_file(directory / f"{two.id}.h5", two, iterations(2, 12, warmup=2, forward=0.05, backward=0.05),
                     resources=res, evals=evals)  # fmt: skip
    for seed, step in ((1, 0.10), (2, 0.11), (3, 0.12)):
        p = Point(framework="torch", backend="gloo", model="lenet", batch_size=BATCH, seed=seed)
        write_point_file(directory / f"{p.id}.h5", p, iterations(1, 12, warmup=2, forward=step))
    shaky = Point(framework="torch", backend="gloo", model="mlp", batch_size=BATCH)
    it = iterations(1, 14, warmup=2, forward=0.1)
    it["t_end"][0, 5] += 0.3  # one iteration four times as long
    write_point_file(directory / f"{shaky.id}.h5", shaky, it)
    failed = Point(framework="torch", backend="gloo", model="mlp", batch_size=BATCH, seed=9)
    write_point_file(directory / f"{failed.id}.h5", failed, iterations(1, 12), status="failed")
    return directory


def test_resource_columns_as_seed_002_reports_them(mixed_sweep: Path) -> None:
    analysis = pipeline.analyse(mixed_sweep)
    row = analysis.stats[analysis.stats["ranks"] == 2].iloc[0]
    assert row["cpu_user"] == pytest.approx(50.0)
    assert row["cpu_system"] == pytest.approx(20.0)
    assert row["cpu_iowait"] == pytest.approx(2.0)
    assert row["cpu_total"] == pytest.approx(72.0)
    assert row["mem_avg_mib"] == pytest.approx(200.0)  # rank 0's mean 200, rank 1's 200
    assert row["mem_max_mib"] == pytest.approx(300.0)
    assert math.isnan(row["gpu_util"])  # no GPU sampled: absent, not zero
    single = analysis.stats[analysis.stats["ranks"] == 1].iloc[0]
    assert math.isnan(single["cpu_user"])


def test_accuracy_test_time_and_time_to_accuracy(mixed_sweep: Path) -> None:
    analysis = pipeline.analyse(mixed_sweep, target_accuracy=0.9)
    row = analysis.stats[analysis.stats["ranks"] == 2].iloc[0]
    assert row["evaluations"] == 3
    assert row["epochs"] == 3
    assert row["accuracy"] == pytest.approx(0.90)  # last evaluation: (44 + 46) / 100
    assert row["train_time_s"] == pytest.approx(31.0)  # slowest rank
    assert row["test_time_s"] == pytest.approx(1.1)  # slowest rank of the last evaluation
    assert row["best_accuracy"] == pytest.approx(0.92)
    assert row["time_to_best_s"] == pytest.approx(21.0)
    assert row["time_to_target_s"] == pytest.approx(21.0)  # 0.9 first reached at epoch 2
    evals = analysis.evaluations[analysis.evaluations["point"] == row["point"]]
    assert evals["accuracy"].tolist() == pytest.approx([0.70, 0.92, 0.90])
    assert evals["test_time_s"].tolist() == pytest.approx([1.5, 1.2, 1.1])
    never = pipeline.analyse(mixed_sweep, target_accuracy=0.95).stats
    assert math.isnan(never[never["ranks"] == 2].iloc[0]["time_to_target_s"])
    # without evaluations, training time is the wall time of all iterations
    seed1 = analysis.stats[(analysis.stats["seed"] == 1)].iloc[0]
    assert seed1["train_time_s"] == pytest.approx(11 * 1.0 + 0.10)
    assert math.isnan(seed1["accuracy"])


def test_repeats_give_mean_and_confidence_interval(mixed_sweep: Path) -> None:
    analysis = pipeline.analyse(mixed_sweep)
    rep = analysis.repeats[analysis.repeats["repeats"] == 3].iloc[0]
    values = [BATCH / 0.10, BATCH / 0.11, BATCH / 0.12]
    assert rep["throughput_mean"] == pytest.approx(statistics.mean(values))
    assert rep["throughput_ci95"] == pytest.approx(4.303 * statistics.stdev(values) / math.sqrt(3))
    assert rep["throughput_cv"] == pytest.approx(statistics.stdev(values) / statistics.mean(values))
    assert rep["t_iter_s_mean"] == pytest.approx(0.11)
    seeds = analysis.points[analysis.points["config"] == rep["config"]]["seed"]
    assert sorted(seeds) == [1, 2, 3]
    # the 2-rank point's weak-scaling baseline is the mean of the three one-rank repeats
    two = analysis.stats[analysis.stats["ranks"] == 2].iloc[0]
    assert two["speedup"] == pytest.approx((2 * BATCH / 0.10) / statistics.mean(values))
    assert two["scaling"] == "weak"


def test_unstable_numbers_get_notes_with_advice(mixed_sweep: Path) -> None:
    analysis = pipeline.analyse(mixed_sweep)
    outliers = [n for n in analysis.notes if "outliers" in n]
    assert len(outliers) == 1  # the mlp point: max 0.4 is 200 % above the mean
    assert "rerun" in outliers[0]
    assert any("skipped" in w and "failed" in w for w in analysis.warnings)


def test_t975_and_ci() -> None:
    assert stats.t975(1) == pytest.approx(12.706)
    assert stats.t975(30) == pytest.approx(2.042)
    assert stats.t975(60) == pytest.approx(2.000, abs=2e-3)  # Student's t, 60 degrees of freedom: 2.000
    assert stats.t975(1000) == pytest.approx(1.962, abs=1e-3)
    mean, half = stats.mean_ci([1.0, 2.0, 3.0, float("nan")])
    assert mean == pytest.approx(2.0)
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(stats.mean_ci([5.0])[1])


def test_three_tables_shapes(mixed_sweep: Path) -> None:
    analysis = pipeline.analyse(mixed_sweep)
    assert len(analysis.points) == len(analysis.stats) == 5  # the failed file is skipped
    assert {"point", "config", "framework", "seed", "ranks", "file"} <= set(analysis.points.columns)
    samples = analysis.samples()
    assert len(samples) == 2 * 12 + 3 * 12 + 14
    two = analysis.stats[analysis.stats["ranks"] == 2].iloc[0]["point"]
    mine = samples[samples["point"] == two]
    assert mine["rank"].tolist() == [0] * 12 + [1] * 12
    assert mine["iteration"].tolist() == list(range(12)) * 2
    assert mine["duration"].to_numpy() == pytest.approx(np.full(24, 0.1))
    assert int(mine["warmup"].sum()) == 4


def test_summary_columns_still_there(mixed_sweep: Path) -> None:
    from hpcbench.analysis.metrics import SUMMARY_COLUMNS

    analysis = pipeline.analyse(mixed_sweep)
    assert set(SUMMARY_COLUMNS) <= set(analysis.stats.columns)


def test_bad_inputs(tmp_path: Path, mixed_sweep: Path) -> None:
    with pytest.raises(HpcbenchError, match="no such sweep directory"):
        pipeline.analyse(tmp_path / "nope")
    with pytest.raises(HpcbenchError, match="no complete point files"):
        pipeline.analyse(tmp_path)
    with pytest.raises(HpcbenchError, match="not a fraction"):
        pipeline.analyse(mixed_sweep, target_accuracy=90.0)


def test_empty_frames_are_handled() -> None:
    assert stats.repeats(pd.DataFrame()).empty


def test_points_alike_but_for_their_environment_are_told_apart(tmp_path: Path) -> None:
    """Theano 1.0.5 and PyTensor both run `theano/mpi`: the environment is a column of the
    summary, of `analyze`'s table and of the report's tables once a point names one."""
    from hpcbench.analysis import metrics
    from hpcbench.analysis.report import html as report
    from hpcbench.cli.analyze import format_table

    plain = tmp_path / "plain"
    plain.mkdir()
    for env in ("legacy", "modern"):
        point = Point(framework="theano", backend="mpi", model="lenet", ranks_per_node=2, batch_size=8, env=env)
        write_point_file(
            tmp_path / f"{point.id}.h5", point, iterations(2, 6, forward=0.01 if env == "legacy" else 0.02)
        )
    point = Point(framework="torch", backend="gloo", model="lenet", ranks_per_node=2, batch_size=8)
    write_point_file(plain / f"{point.id}.h5", point, iterations(2, 6, forward=0.01))

    analysis = pipeline.analyse(tmp_path)
    assert sorted(analysis.stats["env"]) == ["legacy", "modern"]
    lines = format_table(
        metrics.summary([(p.point, p.point_id, p.iterations) for p in tables.load(tmp_path).points])
    ).splitlines()
    assert lines[0].split()[:4] == ["point", "framework", "backend", "env"]
    assert {line.split()[3] for line in lines[1:]} == {"legacy", "modern"}
    scaling = next(s for s in report.sections(analysis) if s.title == "Scaling")
    assert [c.key for c in scaling.columns][:4] == ["point", "framework", "backend", "env"]

    alone = pipeline.analyse(plain)  # no point names an environment: no empty column
    assert "env" not in format_table(
        metrics.summary([(p.point, p.point_id, p.iterations) for p in tables.load(plain).points])
    )
    assert "env" not in [c.key for c in next(s for s in report.sections(alone) if s.title == "Scaling").columns]
