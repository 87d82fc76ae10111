"""The layouts a sweep measured beside the layout model (analysis/layouts_measured.py).

Truths stated here, not computed by the code under test: with a link that costs nothing, the
layout model's t_iter is the compute split over tp × pp plus the pipeline's fill and drain
((m + p − 1) slots of C / (t · p · m)); a ring all-reduce of M bytes over p ranks that took
α_m + β_m·M is the link α = α_m / 2(p − 1), β = β_m · p / 2(p − 1); the calibration's compute
is the data-parallel point's forward + backward and its rest t_iter − forward − backward −
exchange; ranks order samples/s, the most first."""

from __future__ import annotations

import io
import math
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import layouts_measured as lm
from hpcbench.analysis import pipeline
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.analysis.report import html as report
from hpcbench.analysis.report.layouts import drawn
from hpcbench.cli.analyze import cmd_summary
from hpcbench.spec import Point
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import Manifest
from hpcbench.testing.arrays import comm_rows, iterations
from hpcbench.testing.fabricate import write_point_file

BATCH, SEQ = 8, 64
C, REST = 0.040, 0.005  # the calibration's compute and rest (s)
FREE = LinkCost(0.0, 0.0)


def _point(parallel: dict[str, int | str], **fields: object) -> Point:
    values: dict[str, object] = dict(framework="torch", backend="gloo", model="gpt_tiny", ranks_per_node=4,
                                     batch_size=BATCH, seq_len=SEQ, optimizer="adamw")  # fmt: skip
    values.update(fields)
    return Point(parallel=tuple(sorted(parallel.items())), **values)  # type: ignore[arg-type]


def _measured(point: Point, t_iter: float) -> lm.Measured:
    samples = BATCH * point.data_ranks / t_iter
    return lm.Measured(point.id, point, t_iter, samples, samples * SEQ)


DP, TP2, PP2 = _point({}), _point({"tp": 2}), _point({"pp": 2, "microbatches": 4})


def test_free_link_predictions_are_the_split_compute_and_the_ranks_order_samples_per_second() -> None:
    cal = lm.Calibration(DP.id, C, REST, FREE)
    table = lm.group_rows([_measured(DP, 0.050), _measured(TP2, 0.020), _measured(PP2, 0.0375)], cal)
    by = table.set_index("layout")
    assert list(by.index) == ["dp4", "dp2 tp2", "pp2 dp2 mb4 1f1b"]
    dp, tp, pp = (by.loc[label] for label in by.index)
    assert dp["predicted_t_iter_s"] == pytest.approx(C + REST)  # 45 ms
    assert tp["predicted_t_iter_s"] == pytest.approx(C / 2 + REST)  # 25 ms
    assert pp["predicted_t_iter_s"] == pytest.approx(5 * C / (2 * 4) + REST)  # (4 + 2 − 1) slots of C/8: 30 ms
    assert [dp["rel_error"], tp["rel_error"], pp["rel_error"]] == pytest.approx([-0.10, 0.25, -0.20])
    assert bool(dp["calibration"]) and not bool(tp["calibration"]) and not bool(pp["calibration"])
    # samples/s measured: dp 640, tp 800, pp 426.7; predicted: dp 711, tp 640, pp 533
    assert [tp["measured_rank"], dp["measured_rank"], pp["measured_rank"]] == [1, 2, 3]
    assert [dp["predicted_rank"], tp["predicted_rank"], pp["predicted_rank"]] == [1, 2, 3]
    assert dp["predicted_samples_per_s"] == pytest.approx(BATCH * 4 / (C + REST))
    assert tp["predicted_tokens_per_s"] == pytest.approx(BATCH * 2 / (C / 2 + REST) * SEQ)
    assert table["predicted_memory_gib"].gt(0).all()
    (line,) = lm.headlines(table)
    assert "equals measured: no" in line and "worst held-out error +25.0% (dp2 tp2)" in line
    assert DP.id in line


def test_a_group_without_a_data_parallel_point_is_ranked_but_not_predicted() -> None:
    table = lm.group_rows([_measured(TP2, 0.020), _measured(PP2, 0.0375)], None, "no data-parallel point: none")
    assert table["predicted_t_iter_s"].isna().all() and table["predicted_rank"].isna().all()
    assert sorted(table["measured_rank"]) == [1, 2]
    assert (table["note"] == "no data-parallel point: none").all()
    assert lm.headlines(table) == []


def test_equal_rates_still_rank_as_a_permutation() -> None:
    cal = lm.Calibration(DP.id, C, REST, FREE)
    fsdp = _point({"fsdp": 4})  # the same predicted t_iter as dp4 on a free link, the same data ranks
    table = lm.group_rows([_measured(DP, 0.05), _measured(fsdp, 0.05)], cal)
    assert sorted(table["measured_rank"]) == [1, 2] and sorted(table["predicted_rank"]) == [1, 2]
    assert "equals measured: yes" in lm.headlines(table)[0]


@pytest.mark.parametrize("where", ["manifest", "point file"])
def test_points_out_of_memory_are_listed_with_their_predicted_memory_and_not_ranked(tmp_path: Path, where: str) -> None:
    oom = _point({"tp": 4})
    manifest = Manifest(tmp_path, "layouts", "local")
    for point in (DP, TP2, oom):
        manifest.add(point)
    if where == "manifest":
        manifest.entries[oom.id].state = "out of memory"  # the manifest's state of such a point
    else:  # the status the executor gives its point file
        with h5py.File(tmp_path / manifest.entries[oom.id].result, "w") as f:
            f.attrs["status"] = "out_of_memory"
    manifest.save()
    lost = lm.out_of_memory_points(tmp_path, [DP.id, TP2.id])
    assert [p.id for p in lost] == [oom.id]
    measured = lm.group_rows([_measured(DP, 0.05), _measured(TP2, 0.02)], lm.Calibration(DP.id, C, REST, FREE))
    table = lm.with_out_of_memory(measured, lost)
    row = table.set_index("point").loc[oom.id]
    assert row["status"] == lm.OOM_SHOWN and math.isnan(row["measured_rank"]) and math.isnan(row["predicted_rank"])
    assert row["predicted_t_iter_s"] == pytest.approx(C / 4 + REST)  # from the group's calibration columns
    assert row["predicted_memory_gib"] > 0
    assert sorted(table["measured_rank"].dropna()) == [1, 2]
    assert "1 out of memory" in lm.headlines(table)[0]


# ------------------------------------------------------------------------------------------
# Point files written through the real writer


ITERS, WARMUP, MB = 6, 2, 1_000_000
ALPHA_M, BETA_M = 1e-3, 1e-9  # each all-reduce took 1 ms + 1 ns per byte
PHASES = {"data": 0.001, "forward": 0.010, "backward": 0.020, "comm": 0.005, "update": 0.003, "extra": 0.001}


def _write(tmp: Path, point: Point, messages: bool) -> None:
    its = iterations(4, ITERS, warmup=WARMUP, period=1.0, batch=BATCH, **PHASES)
    rows = []
    if messages:  # two sizes per iteration, one after the other: α and β can be told apart
        for r in range(4):
            for i in range(ITERS):
                t0 = i * 1.0 + 0.5
                rows.append((r, i, 1 * MB, t0, t0 + ALPHA_M + BETA_M * MB))
                rows.append((r, i, 3 * MB, t0 + 0.1, t0 + 0.1 + ALPHA_M + 3 * BETA_M * MB))
    comm = comm_rows(rows) if rows else None
    write_point_file(tmp / f"{point.id}.h5", point, its, comm=comm)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("layouts_measured")
    fields = {"iterations": ITERS - WARMUP, "warmup": WARMUP}
    _write(tmp, _point({}, **fields), messages=True)
    _write(tmp, _point({"tp": 2}, **fields), messages=False)
    _write(tmp, _point({"fsdp": 4}, **fields), messages=False)
    return tmp


def test_the_calibration_is_the_data_parallel_points_compute_rest_and_ring_link(sweep: Path) -> None:
    data = read_point(next(p for p in sweep.glob("*.h5") if read_point(p).point.layout.plain))
    t_iter = sum(PHASES.values())
    row = {"forward_s": 0.010, "backward_s": 0.020, "comm_s": 0.005, "t_iter_s": t_iter}
    cal = lm.calibrate(data, row)
    assert cal.compute_s == pytest.approx(0.030)
    assert cal.rest_s == pytest.approx(t_iter - 0.035)  # data, update and no phase
    assert cal.link.alpha == pytest.approx(ALPHA_M / (2 * 3), rel=1e-6)
    assert cal.link.beta == pytest.approx(BETA_M * 4 / (2 * 3), rel=1e-6)


def test_the_analysis_the_report_and_analyze_show_every_layout(sweep: Path) -> None:
    analysis = pipeline.analyse(sweep, use_cache=False)
    table = analysis.layouts
    assert sorted(table["layout"]) == ["dp2 tp2", "dp4", "fsdp4"]
    assert np.isfinite(table["predicted_t_iter_s"].astype(float)).all()
    assert table["calibration"].astype(bool).sum() == 1
    assert sorted(table["measured_rank"]) == [1, 2, 3] and sorted(table["predicted_rank"]) == [1, 2, 3]
    assert any(line.startswith("Layouts of torch/gloo gpt_tiny") for line in analysis.headlines)
    paths = report.write_report(analysis)
    figure = pd.read_csv(sweep / "figure_layouts_measured_vs_predicted.csv")
    assert list(figure["measured_ms"]) == sorted(figure["measured_ms"]) and len(figure) == 3
    assert (sweep / "layouts.csv") in paths and len(pd.read_csv(sweep / "layouts.csv")) == 3
    page = (sweep / "report.html").read_text()
    assert "Parallel layouts: measured beside predicted" in page and "Layouts: measured vs predicted" in page
    assert drawn(table)["layout"].tolist() == figure["layout"].tolist()
    out = io.StringIO()
    assert cmd_summary(sweep, out, use_cache=False) == 0
    text = out.getvalue()
    assert "layouts of torch/gloo gpt_tiny 1x4 b=8" in text and "calibration" in text
    assert "predicted ranking by samples/s equals measured" in text
