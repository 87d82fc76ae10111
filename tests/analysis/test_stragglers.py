"""Straggler attribution, the what-if replay, slow hosts and exposed communication, on point
files with hand-worked answers (written through the real writer, read back by the real reader)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import metrics, pipeline
from hpcbench.analysis.stragglers import exposure, timed, whatif
from hpcbench.analysis.stragglers import find as stragglers
from hpcbench.analysis.stragglers.timed import SAMPLE_ITERATIONS, timed_columns
from hpcbench.spec import Point
from hpcbench.store.reader import read_point
from hpcbench.store.schema import COMM_DTYPE
from hpcbench.testing.arrays import comm_rows, iterations, sched_rows
from hpcbench.testing.fabricate import write_point_file
from tests.conftest import run_module

BASE = {"data": 0.002, "h2d": 0.001, "forward": 0.010, "backward": 0.020, "update": 0.003}  # 36 ms of compute
E = 0.004  # transfer time of the exchange


def num(frame: pd.DataFrame, row: object, column: str) -> float:
    """A number of a table (typed for mypy)."""
    return float(np.asarray(frame.loc[row, column]))  # type: ignore[index]


def word(frame: pd.DataFrame, row: object, column: str) -> str:
    return str(frame.loc[row, column])  # type: ignore[index]


def synchronous(n_ranks: int, n_iters: int, slow: dict[int, dict[str, float]], seed: int = 0) -> np.ndarray:
    """A synchronous run: rank r's phases BASE (times slow[r][phase]) with ±1 % noise; every rank
    waits in the exchange for the last one, which then takes E; a step = max compute + E."""
    rng = np.random.default_rng(seed)
    a = iterations(n_ranks, n_iters)
    compute = np.zeros((n_ranks, n_iters))
    for phase, seconds in BASE.items():
        factor = np.array([slow.get(r, {}).get(phase, 1.0) for r in range(n_ranks)])[:, None]
        values = seconds * factor * (1.0 + 0.01 * rng.random((n_ranks, n_iters)))
        a[phase] = values
        compute += values
    step = compute.max(axis=0) + E
    a["comm"] = step - compute
    a["comm_total"] = a["comm"]
    a["t_start"] = np.concatenate(([0.0], np.cumsum(step)[:-1]))[None, :]
    a["t_end"] = a["t_start"] + step
    return a


def fabricated(tmp_path: Path, a: np.ndarray, hosts: list[str] | None = None, **fields: object) -> Path:
    point = Point(framework="torch", backend="gloo", ranks_per_node=a.shape[0], **fields)  # type: ignore[arg-type]
    return write_point_file(tmp_path / f"{point.id}.h5", point, a, hostnames=hosts)


def test_a_known_straggler_is_named_with_its_phase_cost_and_what_if(tmp_path: Path) -> None:
    a = synchronous(5, 400, {3: {"forward": 3.0}})  # rank 3: forward 30 ms instead of 10 ms
    ps = stragglers.attribute(read_point(fabricated(tmp_path, a)))
    by = ps.rows.set_index(["rank", "phase"])
    assert num(by, (3, "forward"), "excess_s") == pytest.approx(0.020, rel=0.02)
    assert abs(num(by, (3, "backward"), "excess_s")) < 0.0005
    assert num(by, (3, "compute"), "slowest_share") == 1.0
    assert word(by, (3, "compute"), "through") == "forward"
    assert num(by, (0, "compute"), "slowest_share") == 0.0 and num(by, (0, "compute"), "cost_pct") == 0.0
    # the exchange: rank 3 waits ~20 ms less than the median rank (which waits for it)
    assert num(by, (3, "comm"), "excess_s") == pytest.approx(-0.020, rel=0.05)
    # truth: a step is max compute + E; without the straggler, ~36.4 ms + E instead of ~56.4 ms + E
    t_with = float(np.median(metrics.step_times(a)))
    b = synchronous(5, 400, {})
    t_without = float(np.median(metrics.step_times(b)))
    cost = num(by, (3, "compute"), "cost_pct")
    assert cost == pytest.approx(100 * (1 - t_without / t_with), rel=0.02)
    assert num(by, (3, "compute"), "whatif_t_iter_s") == pytest.approx(t_without, rel=0.01)
    scenarios = ps.whatif.set_index("scenario")
    assert num(scenarios, "all ranks at median speed", "t_iter_s") == pytest.approx(t_without, rel=0.01)
    assert num(scenarios, "communication hidden", "t_iter_s") == pytest.approx(t_with - E, rel=1e-6)
    assert num(scenarios, "measured", "throughput") == pytest.approx(5 * Point().batch_size / t_with)
    assert "rank 3 on host node0" in stragglers.headline([ps])


def test_a_straggler_whose_loop_waited_for_a_cpu_is_said_to_have_lost_its_cores(tmp_path: Path) -> None:
    a = synchronous(5, 40, {3: {"forward": 3.0}})
    t_open, t_close = float(a["t_start"][0, 0]) - 0.01, float(a["t_end"][0, -1]) + 0.01
    waits = [0.05, 0.02, 0.08, 0.55, 0.04]  # rank 3's loop waited 55 % of its runnable time
    samples = np.concatenate([sched_rows(1, t_open, t_close, wait=w) for w in waits])
    samples["rank"] = np.repeat(np.arange(5), 2)
    point = Point(framework="torch", backend="gloo", ranks_per_node=5)
    ps = stragglers.attribute(read_point(write_point_file(tmp_path / "p.h5", point, a, resources=samples)))
    assert ps.ranks["cpu_wait"].to_numpy() == pytest.approx(waits, rel=1e-6)
    assert num(ps.rows.set_index(["rank", "phase"]), (3, "compute"), "cpu_wait") == pytest.approx(0.55, rel=1e-6)
    line = stragglers.headline([ps])
    assert "rank 3 on host node0" in line
    assert "its training loop waited 55% of its runnable time for a CPU (the median rank's 5%)" in line
    # without the scheduler's account (files before schema 5) the line says nothing of it
    old = stragglers.attribute(read_point(fabricated(tmp_path, a)))
    assert "waited" not in stragglers.headline([old]) and np.isnan(old.ranks["cpu_wait"]).all()


def test_two_stragglers_each_cost_only_what_the_other_leaves(tmp_path: Path) -> None:
    # rank 1 backward x2 (+20 ms), rank 2 backward x1.5 (+10 ms): without rank 1 the step is set by rank 2
    a = synchronous(6, 300, {1: {"backward": 2.0}, 2: {"backward": 1.5}})
    ps = stragglers.attribute(read_point(fabricated(tmp_path, a)))
    r = ps.ranks.set_index("rank")
    t = ps.t_iter_s
    assert num(r, 1, "cost_pct") == pytest.approx(100 * 0.010 / t, rel=0.05)  # 56 -> 46 ms
    assert num(r, 2, "cost_pct") == 0.0  # never the slowest
    assert ps.whatif.set_index("scenario").loc["all ranks at median speed", "t_iter_s"] == pytest.approx(
        t - 0.020, rel=0.02
    )


def test_asynchronous_ranks_do_not_wait_for_the_straggler(tmp_path: Path) -> None:
    a = synchronous(4, 200, {0: {"update": 5.0}})
    own = np.asarray(sum(a[p] for p in BASE)) + E  # asynchronous: every rank runs at its own pace
    a["comm"] = E
    a["t_end"] = a["t_start"] + own
    point = Point(framework="mxnet", backend="dist_async", ranks_per_node=4)
    path = write_point_file(tmp_path / f"{point.id}.h5", point, a)
    sync = Point(framework="mxnet", backend="dist_sync", ranks_per_node=4)
    sync_path = write_point_file(tmp_path / f"{sync.id}.h5", sync, a)
    assert whatif.asynchronous(read_point(path)) and not whatif.asynchronous(read_point(sync_path))
    ps = stragglers.attribute(read_point(path))
    others = float(np.median(own[1:].max(axis=0)))
    assert ps.ranks.set_index("rank").loc[0, "whatif_t_iter_s"] == pytest.approx(others, rel=0.01)


def test_hosts_ranked_by_how_often_and_how_much_they_were_slowest(tmp_path: Path) -> None:
    hosts = ["c1", "c1", "c2", "c2", "c3", "c3"]
    runs = [synchronous(6, 100, {4: {"forward": 2.0}}, seed=1), synchronous(6, 100, {5: {"forward": 3.0}}, seed=2),
            synchronous(6, 100, {0: {"backward": 1.5}}, seed=3)]  # fmt: skip
    points = [read_point(fabricated(tmp_path, a, hosts, batch_size=8 * (k + 1))) for k, a in enumerate(runs)]
    table = stragglers.analyse(points).hosts
    whole = table[table["local_rank"] == ""].set_index("host")
    assert num(whole, "c3", "points") == 3 and num(whole, "c3", "slowest_points") == 2
    assert num(whole, "c1", "slowest_points") == 1 and num(whole, "c2", "slowest_points") == 0
    # compute excess when slowest: forward +10 ms and +20 ms over 36 ms: median +41.7 %
    assert num(whole, "c3", "median_excess_pct") == pytest.approx(100 * 0.015 / 0.036, rel=0.03)
    assert table.iloc[0]["host"] == "c3"  # ranked first
    assert word(whole, "c3", "evidence").count("%") == 2


def test_exposed_and_union_of_messages_against_the_end_of_backward(tmp_path: Path) -> None:
    # one rank, iteration 1 timed: backward ends at 0.5 s; messages [0.1, 0.3] (hidden),
    # [0.2, 0.6] and [0.55, 0.7] (exposed 0.1 and 0.15): in flight 0.6 s, exposed 0.2 s
    a = iterations(2, 2, warmup=1, forward=0.2, backward=0.3, comm=0.2, update=0.0, period=1.0)
    a["t_end"] = a["t_start"] + 1.0
    rows = [(0, 1, 100, 1.1, 1.3), (1, 1, 100, 1.1, 1.2), (0, 1, 200, 1.55, 1.7), (0, 1, 300, 1.2, 1.6),
            (0, 0, 50, 0.0, 0.9)]  # fmt: skip # rank 0, iteration 0 is warm-up: left out
    msgs = comm_rows(rows)
    msgs["name"] = [b"a", b"a", b"c", b"b", b"a"]
    got = exposure.of(a, msgs)
    assert got.union_s == pytest.approx((0.6 + 0.1) / 2)  # mean over the two ranks
    assert got.exposed_s == pytest.approx(0.2 / 2)
    buckets = got.buckets.set_index("bucket")
    assert num(buckets, "a", "messages") == 2 and num(buckets, "a", "hidden_share") == 1.0
    assert num(buckets, "b", "exposed_mean_s") == pytest.approx(0.1)
    assert num(buckets, "c", "exposed_mean_s") == pytest.approx(0.15) and num(buckets, "c", "exposed_share") == 1.0
    # out of (rank, iteration) order, in any order: the same
    shuffled = msgs[np.random.default_rng(0).permutation(len(msgs))]
    again = exposure.of(a, shuffled)
    assert (again.union_s, again.exposed_s) == pytest.approx((got.union_s, got.exposed_s))


def test_overlapping_per_parameter_messages_sum_past_t_iter_but_their_union_does_not() -> None:
    # 30 messages of 20 ms each, all in flight together in a 100 ms iteration after backward
    n, t_iter = 30, 0.1
    a = iterations(1, 3, warmup=1, backward=0.05, comm=0.05, period=t_iter)
    rows = [(0, i, 4, i * t_iter + 0.05 + 0.001 * k, i * t_iter + 0.07 + 0.001 * k) for i in (1, 2) for k in range(n)]
    a["comm_total"] = 0.02 * n
    msgs = comm_rows(rows)
    row = metrics.point_row(Point(), "p", a, msgs)
    assert row["comm_share"] == pytest.approx(6.0)  # summed: 600 %
    assert row["comm_union_share"] == pytest.approx(0.049 / t_iter)  # [50, 99] ms in flight
    assert row["comm_exposed_share"] == pytest.approx(0.049 / t_iter)  # all of it after backward
    assert np.isnan(np.asarray(metrics.point_row(Point(), "p", a)["comm_union_share"], dtype=float))


def test_chunks_never_split_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    a = iterations(3, 50, warmup=2, backward=0.01, comm=0.01, period=0.1)
    rows = [(r, i, 8, i * 0.1 + 0.005 + 0.002 * k, i * 0.1 + 0.015 + 0.002 * k) for r in range(3) for i in range(50)
            for k in range(5)]  # fmt: skip
    msgs = comm_rows(rows)
    whole = exposure.of(a, msgs)
    monkeypatch.setattr(exposure, "CHUNK", 7)  # chunk edges fall inside groups
    small = exposure.of(a, msgs)
    assert small.union_s == pytest.approx(whole.union_s) == pytest.approx(0.018)
    assert small.exposed_s == pytest.approx(whole.exposed_s) == pytest.approx(0.013)
    pd.testing.assert_frame_equal(small.buckets, whole.buckets)


def test_long_points_are_measured_on_evenly_spaced_iterations(tmp_path: Path) -> None:
    # 2 ranks x 5,001 iterations (1 warm-up): 5,000 timed, so every 3rd one (1,667 <= 2,000);
    # each iteration a hidden message [0.01, 0.02] and an exposed one [0.05, 0.08] (backward ends at 0.04)
    n = 5001
    a = iterations(2, n, warmup=1, forward=0.02, backward=0.02, comm=0.03, update=0.0, period=0.1)
    rows = [(r, i, 8, i * 0.1 + lo, i * 0.1 + hi) for r in range(2) for i in range(n) for lo, hi in
            ((0.01, 0.02), (0.05, 0.08))]  # fmt: skip
    msgs = comm_rows(rows)
    msgs["name"] = np.tile([b"hidden", b"exposed"], len(rows) // 2)
    sample = timed_columns(a, SAMPLE_ITERATIONS)
    assert len(sample) == 1667 and sample[0] == 1 and set(np.diff(sample)) == {3}
    chosen = exposure.messages_of(msgs, sample)
    assert len(chosen) == 2 * 2 * len(sample) and set(chosen["iteration"]) == set(sample.tolist())
    got = exposure.of(a, msgs)
    assert got.union_s == pytest.approx(0.04) and got.exposed_s == pytest.approx(0.03)
    buckets = got.buckets.set_index("bucket")
    assert num(buckets, "hidden", "messages") == 2 * len(sample)  # the sample's messages, not all 10,000
    assert num(buckets, "hidden", "hidden_share") == 1.0 and num(buckets, "exposed", "exposed_share") == 1.0
    # the attribution on the same sample still names an injected straggler
    slow = synchronous(4, n, {1: {"backward": 1.5}})
    slow["warmup"][:, 0] = 1
    ps = stragglers.attribute(read_point(fabricated(tmp_path, slow)))
    assert int(ps.ranks["slowest_share"].to_numpy().argmax()) == 1
    assert ps.ranks["slowest_iterations"].sum() == len(timed_columns(slow, SAMPLE_ITERATIONS))


def test_the_messages_of_long_points_are_measured_on_fewer_iterations_within_the_stated_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the benchmark point: 1,998 sampled iterations of 1,024 messages; every 3rd keeps 666 >= 500 iterations
    assert timed.message_stride(1998, 1024.0) == 3 and timed.message_stride(2000, 2.0) == 1
    # 8 ranks x 2,001 iterations (1 warm-up), one message each, handed over 10 ms before backward
    # ends and exposed for a time drawn uniformly from [0, 40 ms]: the truth is the mean over all
    # 2,000 timed iterations; a budget of 4,000 messages leaves every 4th iteration (500 >= 250)
    monkeypatch.setattr(timed, "MESSAGE_BUDGET", 4000)
    monkeypatch.setattr(timed, "MESSAGE_ITERATIONS", 250)
    n_ranks, n = 8, 2001
    a = iterations(n_ranks, n, warmup=1, forward=0.02, backward=0.02, comm=0.04, period=0.1)
    exposed = 0.04 * np.random.default_rng(7).random((n_ranks, n))
    msgs = np.zeros(n_ranks * n, dtype=COMM_DTYPE)
    msgs["rank"], msgs["iteration"] = np.repeat(np.arange(n_ranks), n), np.tile(np.arange(n), n_ranks)
    msgs["op"], msgs["name"], msgs["bytes"] = b"allreduce", b"0", 8
    msgs["t_start"] = (a["t_start"] + 0.03).reshape(-1)
    msgs["t_end"] = (a["t_start"] + 0.04 + exposed).reshape(-1)
    got = exposure.of(a, msgs)
    assert num(got.buckets.set_index("bucket"), "0", "messages") == n_ranks * 500
    assert got.sample is not None and got.sample.columns.size == 2000  # the attribution keeps them all
    truth = float(exposed[:, 1:].mean())
    # docs/stragglers.md: one standard error is the per-iteration standard deviation / sqrt(iterations)
    bound = 3 * float(exposed[:, 1:].mean(axis=0).std()) / np.sqrt(500)
    assert abs(got.exposed_s - truth) <= bound and abs(got.union_s - (0.01 + truth)) <= bound
    assert abs(got.exposed_s - truth) > 0  # an estimate from the sample, not the whole run
    monkeypatch.setattr(timed, "MESSAGE_BUDGET", 1 << 19)  # within the budget: every message
    whole = exposure.of(a, msgs)
    assert whole.exposed_s == pytest.approx(truth) and whole.union_s == pytest.approx(0.01 + truth)


def test_ideal_timeline_runs_every_rank_at_median_speed(tmp_path: Path) -> None:
    a = synchronous(4, 60, {2: {"backward": 2.0}})
    ideal = whatif.ideal_iterations(a)
    b = synchronous(4, 60, {})
    assert float(np.median(metrics.step_times(ideal))) == pytest.approx(
        float(np.median(metrics.step_times(b))), rel=0.01
    )
    assert (np.diff(ideal["t_start"][0]) > 0).all()  # iterations follow one another
    np.testing.assert_allclose(ideal["t_start"][:, 1:], ideal["t_end"][:, :-1], atol=1e-12)
    path = fabricated(tmp_path, a)
    out = tmp_path / "ideal.json"
    res = run_module("hpcbench.analyze", "trace", str(path), "--ideal", "-o", str(out))
    assert res.returncode == 0, res.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name")
    assert names[-1] == "what-if: rank 3 (node0)" and len(names) == 8


def test_report_writes_the_tables_and_the_headline(tmp_path: Path) -> None:
    fabricated(tmp_path, synchronous(4, 100, {1: {"forward": 2.0}}))
    fabricated(tmp_path, synchronous(1, 100, {}))  # one rank: no straggler to find
    res = run_module("hpcbench.analyze", "report", str(tmp_path))
    assert res.returncode == 0, res.stderr
    table = pd.read_csv(tmp_path / "stragglers.csv")
    assert {"point", "rank", "host", "phase", "excess_s", "slowest_share", "cost_pct", "whatif_t_iter_s"} <= set(table)
    assert len(table) == 4 * len(stragglers.ROW_PHASES)  # the 4-rank point's; the 1-rank point has none
    # the tables hold the straggler the point was made with: rank 1's forward 10 ms over the
    # others' (each phase 0-1 % long, mean 0.5 %), slowest in every iteration, and a step of
    # about 46 + 4 ms that is about 36 + 4 ms without it: 20 % of the iteration
    by = table.set_index(["rank", "phase"])
    assert num(by, (1, "forward"), "excess_s") == pytest.approx(0.010, rel=0.03)
    assert num(by, (1, "compute"), "slowest_share") == 1.0 and word(by, (1, "compute"), "through") == "forward"
    assert num(by, (1, "compute"), "cost_pct") == pytest.approx(20.0, rel=0.03)
    assert num(by, (1, "compute"), "whatif_t_iter_s") == pytest.approx(0.036 + E, rel=0.02)
    for other in (0, 2, 3):
        assert num(by, (other, "compute"), "slowest_share") == 0.0 and num(by, (other, "compute"), "cost_pct") == 0.0
    hosts = pd.read_csv(tmp_path / "hosts.csv", keep_default_na=False)
    assert {"host", "points", "slowest_points", "median_excess_pct"} <= set(hosts)
    slowest = hosts.set_index("local_rank")["slowest_points"]
    assert slowest.to_dict() == {0: 0, 1: 1, 2: 0, 3: 0}  # node0's local rank 1, in its one point
    page = (tmp_path / "report.html").read_text()
    first = page.index('class="headline">Straggler: rank 1 on host node0 costs')
    assert first < page.index("<h2>")
    for title in ("Compute time per rank and iteration", "Cost of each rank", "Slow hosts across the sweep"):
        assert f'data-title="{title}"' in page
    stats = pipeline.analyse(tmp_path).stats
    assert {"comm_union_share", "comm_exposed_share"} <= set(stats)
    # the points record no messages: both shares are empty (docs/metrics-and-model.md), not 0 %
    assert stats["comm_union_share"].isna().all() and stats["comm_exposed_share"].isna().all()


def test_a_straggler_on_a_node_whose_hypervisor_stole_cpu_time_is_said_to_have_a_noisy_neighbour(
    tmp_path: Path,
) -> None:
    """Rank 3's node lost 10 % of its CPU time over the window (20 % over its second half),
    the others' 1 %: its loop waited no more than theirs (stolen time is in no account), and
    the line names the hypervisor."""
    a = synchronous(5, 40, {3: {"forward": 3.0}})
    t_open, t_close = float(a["t_start"][0, 0]) - 0.01, float(a["t_end"][0, -1]) + 0.01
    samples = sched_rows(5, t_open, t_close, wait=0.05)
    mid = samples[1::2].copy()  # a sample halfway: the window is tiled by two halves
    mid["t"] = (t_open + t_close) / 2
    samples["cpu_steal"][1::2] = [1.0, 1.0, 1.0, 20.0, 1.0]
    mid["cpu_steal"] = [1.0, 1.0, 1.0, 0.0, 1.0]
    point = Point(framework="torch", backend="gloo", ranks_per_node=5)
    rows = np.concatenate([samples, mid])
    ps = stragglers.attribute(read_point(write_point_file(tmp_path / "p.h5", point, a, resources=rows)))
    assert ps.ranks["cpu_steal"].to_numpy() == pytest.approx([1.0, 1.0, 1.0, 10.0, 1.0], rel=1e-6)
    line = stragglers.headline([ps])
    assert "rank 3 on host node0" in line and "waited" not in line
    assert (
        "the hypervisor gave 10 % of its node's CPU time to other virtual machines (the median rank's node: 1 %)"
        in (line)
    )
    # 4 points above the median rank's node is within what is not named
    rows["cpu_steal"][rows["cpu_steal"] == 20.0] = 10.0
    near = stragglers.attribute(read_point(write_point_file(tmp_path / "q.h5", point, a, resources=rows)))
    assert "hypervisor" not in stragglers.headline([near])


def _other_ranks_median(speed: np.ndarray, r: int) -> float:
    """The what-if's reference for rank r by its definition: the median of the other ranks'
    speeds, of an even number of them the slower of the two middle ones."""
    others = np.sort(np.delete(speed, r))
    return float(others[others.size // 2]) if others.size else float(speed[r])


@pytest.mark.parametrize("n_ranks", range(1, 10))
def test_each_rank_is_replayed_at_the_median_speed_of_the_other_ranks(n_ranks: int) -> None:
    rng = np.random.default_rng(n_ranks)
    for speed in (rng.random(n_ranks), rng.integers(1, 4, n_ranks).astype(float)):  # ties too
        factor = whatif.speed_factors(speed)
        by_definition = [min(1.0, _other_ranks_median(speed, r) / speed[r]) for r in range(n_ranks)]
        assert factor == pytest.approx(by_definition, rel=1e-12)
        if n_ranks % 2:  # an odd count: the median of the others is the median rank's, as before
            assert factor == pytest.approx(np.minimum(1.0, np.median(speed) / speed), rel=1e-12)


def test_two_ranks_without_the_straggler_run_at_the_other_ranks_time(tmp_path: Path) -> None:
    # rank 1's backward lasts 70 ms instead of 20 ms: 50 ms slower per iteration. Without it the
    # run is rank 0's (its compute + E); the median of both ranks (their mean) would get halfway.
    a = synchronous(2, 400, {1: {"backward": 3.5}})
    compute = np.asarray(sum(a[p] for p in BASE))
    assert float(np.median(compute[1] - compute[0])) == pytest.approx(0.050, rel=0.02)
    other = float(np.median(compute[0] + E))  # the other rank's iteration time
    t_with = float(np.median(metrics.step_times(a)))
    ps = stragglers.attribute(read_point(fabricated(tmp_path, a)))
    ranks = ps.ranks.set_index("rank")
    assert num(ranks, 1, "whatif_t_iter_s") == pytest.approx(other, rel=0.005)
    assert num(ranks, 1, "cost_pct") == pytest.approx(100 * (1 - other / t_with), rel=0.01)
    assert num(ranks, 0, "cost_pct") == 0.0
    scenarios = ps.whatif.set_index("scenario")
    assert num(scenarios, "all ranks at median speed", "t_iter_s") == pytest.approx(other, rel=0.005)
    assert word(scenarios, stragglers.ONE_RANK, "rank") == "1"
    assert "ms with it at the other rank's speed)" in stragglers.headline([ps])
    # the ideal timeline too: every iteration as long as the other rank's
    assert float(np.median(metrics.step_times(whatif.ideal_iterations(a)))) == pytest.approx(other, rel=0.005)


def test_four_ranks_with_two_stragglers_are_replayed_at_the_others_speed(tmp_path: Path) -> None:
    # ranks 2 and 3 slower by 30 and 50 ms: the median of the others of rank 2 or 3 is a rank at
    # the base speed (the mean of the two middle ranks, a base one and rank 2, was 15 ms slower);
    # without rank 3 alone the run is set by rank 2
    a = synchronous(4, 300, {2: {"backward": 2.5}, 3: {"backward": 3.5}})
    compute = np.asarray(sum(a[p] for p in BASE))
    base = float(np.median(compute[:2].max(axis=0) + E))  # the run without either straggler
    ps = stragglers.attribute(read_point(fabricated(tmp_path, a)))
    scenarios = ps.whatif.set_index("scenario")
    assert num(scenarios, "all ranks at median speed", "t_iter_s") == pytest.approx(base, rel=0.01)
    without_3 = float(np.median(compute[:3].max(axis=0) + E))  # rank 3 gone: rank 2 sets the step
    assert num(ps.ranks.set_index("rank"), 3, "whatif_t_iter_s") == pytest.approx(without_3, rel=0.01)
    assert "ms with it at the median speed of the other ranks)" in stragglers.headline([ps])
