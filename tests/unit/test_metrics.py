"""hpcbench.analysis.metrics against numbers worked out by hand from the definitions in docs/metrics-and-model.md.

The arrays are built by hand: 3 ranks x 5 iterations, iteration 0 a warm-up (flagged on
rank 0 only: a column is warm-up if any rank says so) with absurd times that must not
leak into any metric.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import metrics
from hpcbench.spec import Point
from hpcbench.store.schema import COMM_DTYPE, ITERATION_DTYPE

N_RANKS = 3
BATCH = 8

# iteration time t_end - t_start, [rank][iteration]
DURATION = [
    [5.00, 0.10, 0.30, 0.13, 0.11],
    [7.00, 0.12, 0.15, 0.14, 0.19],
    [6.00, 0.11, 0.18, 0.16, 0.12],
]
# compute time c = data + h2d + forward + backward + update, [rank][iteration]
COMPUTE = [
    [4.00, 0.06, 0.10, 0.05, 0.09],
    [0.10, 0.08, 0.10, 0.10, 0.09],
    [0.10, 0.07, 0.10, 0.09, 0.06],
]
OVERLAPPED = 0.02  # comm_total = comm + this
TIMED = range(1, 5)


def comm_of(r: int, i: int) -> float:
    """Waiting in communication: half of what compute leaves of the iteration."""
    return (DURATION[r][i] - COMPUTE[r][i]) / 2


def build(
    duration: list[list[float]],
    compute: list[list[float]],
    warmup_flags: list[list[bool]],
    comm: list[list[float]] | None = None,
    comm_total: list[list[float]] | None = None,
) -> np.ndarray:
    n_ranks, n_iter = len(duration), len(duration[0])
    a = np.zeros((n_ranks, n_iter), dtype=ITERATION_DTYPE)
    for r in range(n_ranks):
        for i in range(n_iter):
            start = 100.0 + 10.0 * i + 0.003 * r  # ranks' clocks not quite aligned
            c = compute[r][i]
            a[r, i]["t_start"] = start
            a[r, i]["t_end"] = start + duration[r][i]
            a[r, i]["data"] = 0.1 * c
            a[r, i]["h2d"] = 0.2 * c
            a[r, i]["forward"] = 0.25 * c
            a[r, i]["backward"] = 0.35 * c
            a[r, i]["update"] = 0.1 * c
            a[r, i]["comm"] = comm[r][i] if comm else 0.0
            a[r, i]["comm_total"] = comm_total[r][i] if comm_total else 0.0
            a[r, i]["samples"] = BATCH
            a[r, i]["loss"] = 1.0 / (i + 1)
            a[r, i]["warmup"] = warmup_flags[r][i]
    return a


def example() -> np.ndarray:
    flags = [[i == 0 and r == 0 for i in range(5)] for r in range(N_RANKS)]
    comm = [[comm_of(r, i) for i in range(5)] for r in range(N_RANKS)]
    comm_total = [[comm_of(r, i) + OVERLAPPED for i in range(5)] for r in range(N_RANKS)]
    return build(DURATION, COMPUTE, flags, comm, comm_total)


def uniform(n_ranks: int, step: float, n_timed: int = 12, n_warmup: int = 2) -> np.ndarray:
    n = n_warmup + n_timed
    duration = [[step] * n for _ in range(n_ranks)]
    compute = [[step / 2] * n for _ in range(n_ranks)]
    flags = [[i < n_warmup for i in range(n)] for _ in range(n_ranks)]
    return build(duration, compute, flags)


# Hand computations from the definitions (plain Python, not the code under test).
STEP_MEAN = [statistics.mean(DURATION[r][i] for r in range(N_RANKS)) for i in TIMED]  # .11 .21 .1433 .14
T_ITER = statistics.median(STEP_MEAN)  # (0.14 + 0.1433) / 2
LIF_I = [
    max(COMPUTE[r][i] for r in range(N_RANKS)) / statistics.mean(COMPUTE[r][i] for r in range(N_RANKS)) for i in TIMED
]


def test_hand_numbers_are_what_the_comments_say() -> None:
    assert pytest.approx((0.14 + 0.43 / 3) / 2) == T_ITER
    assert pytest.approx([8 / 7, 1.0, 1.25, 1.125]) == LIF_I


def test_timed_drops_columns_flagged_on_any_rank() -> None:
    t = metrics.timed(example())
    assert t.shape == (3, 4)
    assert not t["warmup"].any()
    assert t["loss"][0].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 4, 1 / 5])


def test_step_times_are_the_ranks_mean_per_iteration() -> None:
    assert metrics.step_times(example()).tolist() == pytest.approx(STEP_MEAN)


def test_t_iter_is_median_of_mean_over_ranks() -> None:
    t = metrics.t_iter(example())
    assert t == pytest.approx((0.14 + 0.43 / 3) / 2)
    # not rank 0's median, not the mean of the step times, not the median of the maxima
    assert t != pytest.approx(statistics.median(DURATION[0][i] for i in TIMED))
    assert t != pytest.approx(statistics.mean(STEP_MEAN))
    assert t != pytest.approx(statistics.median(max(DURATION[r][i] for r in range(N_RANKS)) for i in TIMED))


def test_t_iter_of_offset_ranks_is_their_period() -> None:
    """Two ranks in step through an exchange but released from it 20 ms apart, by turns: each
    iteration's longest window is 120 ms, while both ranks train one iteration per 100 ms of
    wall time. t_iter is the period; the slowest rank's windows would add up to 20 % more
    than the wall time."""
    n = 12
    a = np.zeros((2, n), dtype=ITERATION_DTYPE)
    for r in range(2):
        t = 0.0
        for i in range(n):
            d = 0.08 if (i + r) % 2 else 0.12
            a[r, i]["t_start"], a[r, i]["t_end"] = t, t + d
            t += d
    wall = a["t_end"][:, -1] - a["t_start"][:, 0]
    assert wall == pytest.approx([0.1 * n, 0.1 * n])
    assert metrics.t_iter(a) == pytest.approx(0.1)
    assert float(np.median((a["t_end"] - a["t_start"]).max(axis=0))) == pytest.approx(0.12)


def test_t_iter_of_only_warmup_iterations_is_nan() -> None:
    a = example()
    a["warmup"][:] = True
    assert math.isnan(metrics.t_iter(a))


def test_throughput_is_n_times_b_over_t_iter() -> None:
    assert metrics.throughput(3, 8, 0.175) == pytest.approx(24 / 0.175)
    assert metrics.throughput(1, 32, 0.5) == pytest.approx(64.0)


def test_load_imbalance_uses_compute_without_comm() -> None:
    lif, excess = metrics.load_imbalance(example())
    assert lif == pytest.approx(statistics.mean(LIF_I))
    assert excess == pytest.approx(statistics.mean(x - 1 for x in LIF_I))
    assert excess == pytest.approx(lif - 1)
    # including comm (c + comm) would have given another number: the example is sensitive to it
    with_comm = [
        max(COMPUTE[r][i] + comm_of(r, i) for r in range(N_RANKS))
        / statistics.mean(COMPUTE[r][i] + comm_of(r, i) for r in range(N_RANKS))
        for i in TIMED
    ]
    assert statistics.mean(with_comm) != pytest.approx(lif)


def test_balanced_point_has_lif_one() -> None:
    lif, excess = metrics.load_imbalance(uniform(4, 0.1))
    assert lif == pytest.approx(1.0)
    assert excess == pytest.approx(0.0)


def test_compute_time_sums_the_five_compute_phases() -> None:
    c = metrics.compute_time(example())
    assert c.shape == (3, 4)
    for r in range(N_RANKS):
        assert c[r].tolist() == pytest.approx([COMPUTE[r][i] for i in TIMED])


def test_point_row_matches_the_hand_computation() -> None:
    point = Point(ranks_per_node=3, batch_size=BATCH, iterations=4, warmup=1)
    row = metrics.point_row(point, "abc", example())
    comm_mean = statistics.mean(comm_of(r, i) for r in range(N_RANKS) for i in TIMED)
    comm_total_mean = comm_mean + OVERLAPPED
    assert row["point"] == "abc"
    assert row["ranks"] == 3
    assert row["timed_iterations"] == 4
    assert row["t_iter_s"] == pytest.approx(T_ITER)
    assert row["throughput"] == pytest.approx(N_RANKS * BATCH / T_ITER)
    assert row["lif"] == pytest.approx(statistics.mean(LIF_I))
    assert row["comm_s"] == pytest.approx(comm_mean)
    assert row["comm_total_s"] == pytest.approx(comm_total_mean)
    assert row["comm_share"] == pytest.approx(comm_total_mean / T_ITER)
    assert math.isnan(row["overlap"])  # type: ignore[arg-type]  # no messages: none in flight to hide
    mean_compute = statistics.mean(COMPUTE[r][i] for r in range(N_RANKS) for i in TIMED)
    assert row["forward_s"] == pytest.approx(0.25 * mean_compute)
    assert row["data_s"] == pytest.approx(0.1 * mean_compute)
    assert row["cv"] == pytest.approx(statistics.pstdev(STEP_MEAN) / statistics.mean(STEP_MEAN))


def test_overlap_without_any_communication_is_nan() -> None:
    row = metrics.point_row(Point(), "p", uniform(1, 0.1))
    assert math.isnan(row["overlap"])  # type: ignore[arg-type]
    assert row["comm_share"] == 0.0


def messages(rows: list[tuple[int, int, float, float]]) -> np.ndarray:
    """(rank, iteration, t_start, t_end) -> message records of 1 kB all-reduces."""
    out = np.zeros(len(rows), dtype=COMM_DTYPE)
    for k, (rank, it, t0, t1) in enumerate(rows):
        out[k] = (rank, it, b"allreduce", str(k).encode(), b"dp", b"float32", 1024, t0, t1)
    return out


def test_fully_hidden_half_hidden_and_fully_exposed_communication() -> None:
    # 2 ranks x 4 iterations of 100 ms (1 warm-up); compute 50 ms, of it data .1, h2d .2,
    # forward .25, backward .35, update .1: backward ends 45 ms in
    n = 4
    duration = [[0.1] * n, [0.1] * n]
    compute = [[0.05] * n, [0.05] * n]
    flags = [[i == 0 for i in range(n)], [i == 0 for i in range(n)]]
    a = build(duration, compute, flags, comm=[[0.03] * n] * 2, comm_total=[[0.03] * n] * 2)
    end = 0.05 * (0.1 + 0.2 + 0.25 + 0.35)

    def row(lo: float, hi: float) -> dict[str, object]:
        starts = a["t_start"]
        rows = [(r, i, starts[r, i] + lo, starts[r, i] + hi) for r in range(2) for i in range(n)]
        return metrics.point_row(Point(), "p", a, messages(rows))

    assert row(0.0, end)["overlap"] == pytest.approx(1.0)  # ended as backward did
    assert row(end - 0.01, end + 0.01)["overlap"] == pytest.approx(0.5)
    exposed = row(end, end + 0.03)
    assert exposed["overlap"] == pytest.approx(0.0)
    assert exposed["comm_share"] == pytest.approx(0.3)


def test_overlap_counts_concurrent_messages_once_and_ignores_the_comm_phases_other_waits() -> None:
    # 10 messages of 20 ms in flight together, all after backward: nothing hidden, though their
    # summed 200 ms dwarf a comm phase of 30 ms (1 - comm / comm_total would say 85 % hidden)
    n = 3
    a = build([[0.1] * n], [[0.05] * n], [[i == 0 for i in range(n)]], comm=[[0.03] * n], comm_total=[[0.2] * n])
    end = 0.05 * (0.1 + 0.2 + 0.25 + 0.35)
    rows = [(0, i, a["t_start"][0, i] + end + 0.001 * k, a["t_start"][0, i] + end + 0.02) for i in range(n)
            for k in range(10)]  # fmt: skip
    row = metrics.point_row(Point(), "p", a, messages(rows))
    assert row["overlap"] == pytest.approx(0.0)
    # a comm phase longer than the messages (waiting for a slower rank): never below 0
    a["comm"] = 0.09
    assert metrics.point_row(Point(), "p", a, messages(rows))["overlap"] == pytest.approx(0.0)


# --------------------------------------------------------------------------------------
# summary(): speedup and efficiency


def _by_ranks(table: pd.DataFrame) -> dict[int, pd.Series]:
    return {int(row["ranks"]): row for _, row in table.iterrows()}


def test_weak_scaling_uses_the_one_rank_point_with_the_same_batch() -> None:
    one = Point(ranks_per_node=1, batch_size=8)
    four = Point(nodes=2, ranks_per_node=2, batch_size=8)
    table = metrics.summary([(four, "four", uniform(4, 0.125)), (one, "one", uniform(1, 0.1))])
    rows = _by_ranks(table)
    x1, x4 = 1 * 8 / 0.1, 4 * 8 / 0.125
    assert rows[1]["throughput"] == pytest.approx(x1)
    assert rows[4]["throughput"] == pytest.approx(x4)
    assert rows[4]["speedup"] == pytest.approx(x4 / x1)  # 3.2
    assert rows[4]["efficiency"] == pytest.approx(x4 / (4 * x1))  # 0.8
    assert rows[4]["scaling"] == "weak"
    assert rows[1]["speedup"] == pytest.approx(1.0)
    assert rows[1]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["scaling"] == "baseline"
    assert table["ranks"].tolist() == [1, 4]  # sorted by scale


def test_strong_scaling_uses_the_one_rank_point_with_the_global_batch() -> None:
    one = Point(ranks_per_node=1, batch_size=24)
    three = Point(ranks_per_node=3, batch_size=8)
    table = metrics.summary([(one, "one", uniform(1, 0.25)), (three, "three", uniform(3, 0.12))])
    rows = _by_ranks(table)
    x1, x3 = 24 / 0.25, 3 * 8 / 0.12
    assert rows[3]["speedup"] == pytest.approx(x3 / x1)
    assert rows[3]["efficiency"] == pytest.approx(x3 / (3 * x1))
    assert rows[3]["scaling"] == "strong"


def test_weak_is_preferred_when_both_baselines_exist() -> None:
    points = [
        (Point(batch_size=8), "w", uniform(1, 0.1)),
        (Point(batch_size=16), "s", uniform(1, 0.15)),
        (Point(ranks_per_node=2, batch_size=8), "two", uniform(2, 0.1)),
    ]
    table = metrics.summary(points)
    row = table[table["point"] == "two"].iloc[0]
    assert row["scaling"] == "weak"
    assert row["speedup"] == pytest.approx((2 * 8 / 0.1) / (8 / 0.1))


def test_no_baseline_gives_nan() -> None:
    # a one-rank point of another model is no baseline
    points = [
        (Point(model="mlp", batch_size=8), "mlp1", uniform(1, 0.1)),
        (Point(model="lenet", ranks_per_node=2, batch_size=8), "lenet2", uniform(2, 0.1)),
    ]
    table = metrics.summary(points)
    row = table[table["point"] == "lenet2"].iloc[0]
    assert math.isnan(row["speedup"])
    assert math.isnan(row["efficiency"])
    assert row["scaling"] == ""


def test_baseline_must_match_every_non_scale_field() -> None:
    points = [
        (Point(batch_size=8, lr=0.1), "lr", uniform(1, 0.1)),
        (Point(ranks_per_node=2, batch_size=8), "two", uniform(2, 0.1)),
    ]
    table = metrics.summary(points)
    assert math.isnan(table[table["point"] == "two"].iloc[0]["speedup"])


def test_summary_of_nothing_has_the_columns() -> None:
    table = metrics.summary([])
    assert len(table) == 0
    assert {"speedup", "efficiency", "lif", "lif_excess", "comm_share", "overlap"} <= set(table.columns)


# --------------------------------------------------------------------------------------
# warnings_for


def _row(point: str, timed: int, cv: float) -> dict[str, object]:
    return {"point": point, "timed_iterations": timed, "cv": cv}


def test_steady_point_has_no_notes() -> None:
    table = metrics.summary([(Point(), "steady", uniform(2, 0.1, n_timed=12))])
    assert table.iloc[0]["cv"] == pytest.approx(0.0)
    assert metrics.warnings_for(table) == []


def test_few_timed_iterations_get_a_note() -> None:
    table = metrics.summary([(Point(), "short", uniform(2, 0.1, n_timed=4))])
    notes = metrics.warnings_for(table)
    assert len(notes) == 1
    assert "short" in notes[0]
    assert "4 timed iterations" in notes[0]


def test_variable_iteration_times_get_a_note() -> None:
    n = 12
    duration = [[0.1 if i % 2 else 0.2 for i in range(n)], [0.1 if i % 2 else 0.2 for i in range(n)]]
    a = build(duration, [[0.05] * n] * 2, [[False] * n] * 2)
    table = metrics.summary([(Point(), "shaky", a)])
    assert table.iloc[0]["cv"] == pytest.approx(statistics.pstdev([0.1, 0.2] * 6) / 0.15)
    notes = metrics.warnings_for(table)
    assert len(notes) == 1
    assert "shaky" in notes[0]
    assert "CV" in notes[0]


@pytest.mark.parametrize(
    ("timed", "cv", "n_notes"),
    [(10, 0.0999, 0), (10, 0.10, 1), (9, 0.0, 1), (9, 0.5, 2), (100, float("nan"), 0), (1, float("nan"), 1)],
)
def test_warning_thresholds(timed: int, cv: float, n_notes: int) -> None:
    table = pd.DataFrame([_row("p", timed, cv)])
    assert len(metrics.warnings_for(table)) == n_notes


def test_point_row_of_iterations_that_took_no_time_is_nan_not_an_error() -> None:
    # A clock that did not advance (t_end == t_start) must give NaN metrics, as the model does.
    its = np.zeros((2, 3), dtype=ITERATION_DTYPE)
    row = metrics.point_row(Point(), "p", its)
    assert row["t_iter_s"] == 0.0
    assert math.isnan(float(row["comm_share"]))  # type: ignore[arg-type]
    assert math.isnan(float(row["throughput"]))  # type: ignore[arg-type]
