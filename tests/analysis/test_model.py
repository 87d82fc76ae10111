"""The performance model and the α–β fits against numbers worked out by hand (docs/metrics-and-model.md)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model import collectives, exchange, fit, predict
from hpcbench.analysis.model import iteration as model
from hpcbench.analysis.model.iteration import Layer, LinkCost, ModelError, PhaseTimes
from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.store import commfile
from hpcbench.store.reader import read_point
from hpcbench.store.traits import LEGACY, Traits
from hpcbench.testing.arrays import ALPHA, BETA, comm_rows, iterations, model_point
from hpcbench.testing.fabricate import write_point_file

# Three layers, 1..3 from the input; backward runs 3 -> 1.
TB = [0.3, 0.2, 0.1]  # tb[1], tb[2], tb[3]
TC = [0.25, 0.4, 0.05]  # tc[1], tc[2], tc[3]
# By hand:
#   τb[3] = 0;   τb[2] = τb[3] + tb[3] = 0.1;   τb[1] = τb[2] + tb[2] = 0.3
#   τc[3] = τb[3] + tb[3] = 0.1
#   τc[2] = max(τc[3] + tc[3], τb[2] + tb[2]) = max(0.15, 0.3) = 0.3
#   τc[1] = max(τc[2] + tc[2], τb[1] + tb[1]) = max(0.7, 0.6) = 0.7
#   non-overlapped = τc[1] + tc[1] − (τb[1] + tb[1]) = 0.7 + 0.25 − 0.6 = 0.35
HAND_TAU_B = [0.3, 0.1, 0.0]
HAND_TAU_C = [0.7, 0.3, 0.1]
HAND_EXPOSED = 0.35


def test_wfbp_recurrence_matches_the_hand_computation() -> None:
    schedule = model.wfbp(TB, TC)
    assert list(schedule.tau_b) == pytest.approx(HAND_TAU_B)
    assert list(schedule.tau_c) == pytest.approx(HAND_TAU_C)
    assert schedule.non_overlapped == pytest.approx(HAND_EXPOSED)


def test_wfbp_hides_all_but_the_first_layers_message_when_comm_is_short() -> None:
    # τc[3] = .1, τc[2] = max(.11, .3) = .3, τc[1] = max(.31, .6) = .6 -> exposed = .6 + .01 - .6
    assert model.wfbp(TB, [0.01, 0.01, 0.01]).non_overlapped == pytest.approx(0.01)


def test_wfbp_of_one_layer_exposes_its_whole_message() -> None:
    assert model.wfbp([0.2], [0.07]).non_overlapped == pytest.approx(0.07)
    assert model.wfbp([], []).non_overlapped == 0.0


def test_wfbp_needs_as_many_comm_times_as_layers() -> None:
    with pytest.raises(ModelError, match="3 backward times but 2"):
        model.wfbp(TB, TC[:2])


def test_collective_costs() -> None:
    link = LinkCost(alpha=1e-5, beta=1e-9, gamma=2e-10)
    n = 1e6
    # 2(p−1)α + 2n(p−1)/p·β + n(p−1)/p·γ with p = 4: 6e-5 + 1.5e-3 + 1.5e-4
    assert collectives.ring_allreduce(n, 4, link) == pytest.approx(1.71e-3)
    # 2 lg p·α + ...: 4e-5 + 1.5e-3 + 1.5e-4
    assert collectives.rabenseifner_allreduce(n, 4, link) == pytest.approx(1.69e-3)
    # lg p·α + n lg p·β + n lg p·γ: 2e-5 + 2e-3 + 4e-4
    assert collectives.recursive_doubling_allreduce(n, 4, link) == pytest.approx(2.42e-3)
    # (p−1)α + n(p−1)/p·β: 3e-5 + 7.5e-4
    assert collectives.ring_allgather(n, 4, link) == pytest.approx(7.8e-4)
    # lg p·α + n lg p·β: 2e-5 + 2e-3
    assert collectives.binomial_broadcast(n, 4, link) == pytest.approx(2.02e-3)
    assert collectives.ring_allreduce(n, 1, link) == 0.0
    with pytest.raises(ModelError, match="power of two"):
        collectives.rabenseifner_allreduce(n, 6, link)
    with pytest.raises(ModelError, match=">= 1"):
        collectives.ring_allreduce(n, 0, link)


def test_ring_message_cost_and_link_round_trip() -> None:
    link = LinkCost(3e-6, 2e-10)
    cost = collectives.ring_message_cost(8, link)
    assert cost.alpha == pytest.approx(2 * 7 * 3e-6)
    assert cost.beta == pytest.approx(2 * 7 / 8 * 2e-10)
    assert cost.time(1e6) == pytest.approx(collectives.ring_allreduce(1e6, 8, link))
    back = collectives.ring_link(cost, 8)
    assert back.alpha == pytest.approx(link.alpha)
    assert back.beta == pytest.approx(link.beta)


def test_bus_bandwidth_as_nccl_tests_defines_it() -> None:
    algbw, busbw = commfile.bus_bandwidth("allreduce", 8e6, 0.002, 4)
    assert algbw == pytest.approx(4e9)
    assert busbw == pytest.approx(4e9 * 2 * 3 / 4)
    assert commfile.bus_bandwidth("allgather", 8e6, 0.002, 4)[1] == pytest.approx(4e9 * 3 / 4)
    assert commfile.bus_bandwidth("broadcast", 8e6, 0.002, 4)[1] == pytest.approx(4e9)
    assert commfile.bus_bandwidth("alltoall", 8e6, 0.002, 4)[1] == pytest.approx(4e9 * 3 / 4)
    assert commfile.bus_bandwidth("send", 8e6, 0.002, 2)[1] == pytest.approx(4e9)
    with pytest.raises(HpcbenchError, match="unknown collective"):
        commfile.bus_bandwidth("scan", 1, 1, 2)


def test_tensor_fusion_cost() -> None:
    cost = model.MessageCost(1e-4, 1e-9)
    unfused, fused = collectives.fused_cost([1e6, 2e6, 3e6], cost, threshold=4e6)
    assert unfused == pytest.approx(3 * 1e-4 + 6e6 * 1e-9)
    assert fused == pytest.approx(2 * 1e-4 + 6e6 * 1e-9)  # ⌈6e6 / 4e6⌉ = 2 messages' latency


def _layers_for(tc: list[float], cost: model.MessageCost) -> list[Layer]:
    return [Layer((t - cost.alpha) / cost.beta, b) for t, b in zip(tc, TB, strict=True)]


def test_predict_iteration_with_and_without_overlap() -> None:
    link = LinkCost(alpha=1e-5, beta=1e-9)
    cost = collectives.ring_message_cost(4, link)
    layers = _layers_for(TC, cost)  # gradient sizes whose ring all-reduce over 4 ranks takes TC
    phases = PhaseTimes(data=0.05, h2d=0.02, forward=0.4, update=0.1)
    wfbp = model.predict_iteration(phases, layers, link, ranks=4, batch_size=32)
    assert wfbp.backward == pytest.approx(0.6)
    assert wfbp.comm_total == pytest.approx(0.7)
    assert wfbp.comm_exposed == pytest.approx(HAND_EXPOSED)
    # t_io + t_h2d + t_f + t_b + non-overlapped + t_u
    assert wfbp.t_iter == pytest.approx(0.05 + 0.02 + 0.4 + 0.6 + 0.35 + 0.1)
    assert wfbp.throughput == pytest.approx(4 * 32 / wfbp.t_iter)
    serial = model.predict_iteration(phases, layers, link, ranks=4, batch_size=32, overlap=False)
    assert serial.comm_exposed == pytest.approx(0.7)
    assert serial.t_iter == pytest.approx(0.05 + 0.02 + 0.4 + 0.6 + 0.7 + 0.1)
    single = model.predict_iteration(phases, layers, link, ranks=1, batch_size=32)
    assert single.comm_total == 0.0
    assert single.t_iter == pytest.approx(0.05 + 0.02 + 0.4 + 0.6 + 0.1)
    assert model.efficiency(wfbp, single) == pytest.approx(single.t_iter / wfbp.t_iter)


def test_prefetch_hides_io_shorter_than_compute_and_overhead_is_added() -> None:
    phases = PhaseTimes(data=0.3, h2d=0.1, forward=0.2, update=0.1)
    layers = [Layer(0.0, 0.2)]
    hidden = model.predict_iteration(phases, layers, LinkCost(0, 0), 1, prefetch=True, overhead=0.05)
    assert hidden.t_iter == pytest.approx(0.2 + 0.2 + 0.1 + 0.05)  # I/O (0.4) hides behind 0.55
    slow_io = PhaseTimes(data=0.9, h2d=0.1, forward=0.2, update=0.1)
    exposed = model.predict_iteration(slow_io, layers, LinkCost(0, 0), 1, prefetch=True)
    assert exposed.t_iter == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("phases", "layers", "ranks", "batch", "message"),
    [
        (PhaseTimes(forward=-1.0), [], 2, 1, "phase forward"),
        (PhaseTimes(data=math.nan), [], 2, 1, "phase data"),
        (PhaseTimes(), [Layer(10, -0.1)], 2, 1, "layer 1: backward time"),
        (PhaseTimes(), [Layer(0, 0.1), Layer(-5, 0.1)], 2, 1, "layer 2: gradient size"),
        (PhaseTimes(), [], 0, 1, "ranks must be >= 1"),
        (PhaseTimes(), [], 2, 0, "batch size must be >= 1"),
    ],
)
def test_bad_model_inputs_name_what_is_wrong(
    phases: PhaseTimes, layers: list[Layer], ranks: int, batch: int, message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        model.predict_iteration(phases, layers, LinkCost(1e-5, 1e-9), ranks, batch)


# --------------------------------------------------------------------------------------
# fits


def test_fit_alpha_beta_recovers_an_exact_line() -> None:
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    result = fit.fit_alpha_beta(sizes, 5e-5 + 2e-9 * sizes)
    assert result.alpha == pytest.approx(5e-5)
    assert result.beta == pytest.approx(2e-9)
    assert result.r2 == pytest.approx(1.0)
    assert result.n == 4


def test_fit_alpha_beta_least_squares_on_noise() -> None:
    sizes = np.array([1e3, 2e3, 3e3, 4e3])
    times = np.array([1.1, 2.0, 3.1, 3.8]) * 1e-3
    result = fit.fit_alpha_beta(sizes, times)
    slope, intercept = np.polyfit(sizes, times, 1)  # ordinary least squares, independently
    assert result.beta == pytest.approx(slope)
    assert result.alpha == pytest.approx(intercept)


def test_fit_keeps_alpha_and_beta_non_negative() -> None:
    sizes = np.array([1e3, 2e3, 3e3])
    result = fit.fit_alpha_beta(sizes, np.array([0.5e-3, 2.0e-3, 3.5e-3]))  # the line crosses below 0
    assert result.alpha == 0.0
    assert result.beta == pytest.approx(float(sizes @ [0.5e-3, 2.0e-3, 3.5e-3]) / float(sizes @ sizes))
    with pytest.raises(ModelError, match="no messages"):
        fit.fit_alpha_beta([], [])


def test_fit_ring_link_over_several_rank_counts() -> None:
    link = LinkCost(4e-6, 3e-10)
    ranks, sizes, times = [], [], []
    for p in (2, 4, 8):
        for m in (1e4, 1e5, 1e6):
            ranks.append(p)
            sizes.append(m)
            times.append(collectives.ring_allreduce(m, p, link))
    got = fit.fit_ring_link(ranks, sizes, times)
    assert got.alpha == pytest.approx(link.alpha)
    assert got.beta == pytest.approx(link.beta)
    with pytest.raises(ModelError, match=">= 2 ranks"):
        fit.fit_ring_link([1], [1e3], [1e-3])


def test_message_costs_take_service_time_and_the_shortest_rank() -> None:
    comm = comm_rows(
        [
            (0, 0, 100, 1.0, 1.3),  # rank 0, first message: 0.3
            (0, 0, 200, 1.1, 1.5),  # handed over while the first ran: served from 1.3 -> 0.2
            (1, 0, 100, 1.2, 1.3),  # rank 1 arrived late: 0.1
            (1, 0, 200, 1.25, 1.5),  # served from 1.3 -> 0.2
        ]
    )
    costs = fit.message_costs(comm)
    assert costs["seq"].tolist() == [0, 1]
    assert costs["bytes"].tolist() == [100, 200]
    assert costs["seconds"].tolist() == pytest.approx([0.1, 0.2])
    assert costs["op"].tolist() == ["allreduce", "allreduce"]
    assert fit.message_costs(comm, np.array([1])).empty  # iteration 0 left out


def test_message_ends_seen_in_a_wait_are_served_from_when_the_wait_began() -> None:
    # Two ranks whose backward ends at 1.5 s (iteration 0) and 11.5 s (iteration 1): there
    # they begin to wait for their messages, in the order they started them.
    it = iterations(2, 2, forward=0.5, backward=1.0, period=10.0)
    rows = []
    for rank in (0, 1):
        late = 0.01 * rank
        rows += [
            (rank, 0, 100, 0.6 + late, 1.6),  # handed over in backward, seen done 0.1 s into the wait
            (rank, 0, 200, 1.2 + late, 1.65 + late),  # then 0.05 s more (rank 1: 0.06)
            (rank, 1, 100, 10.6, 11.0),  # ended before the wait began: its whole span
            (rank, 1, 200, 11.2, 11.7),  # handed over in backward, done 0.2 s into the wait
        ]
    comm = comm_rows(rows)
    waits = fit.wait_starts(it)
    assert waits.tolist() == [[1.5, 11.5], [1.5, 11.5]]
    seen = fit.message_costs(comm, waits=waits)
    assert seen["seconds"].tolist() == pytest.approx([0.1, 0.05, 0.4, 0.2])
    # Taken as completions, the first message of iteration 0 lasts through the rest of backward.
    assert fit.message_costs(comm)["seconds"].tolist() == pytest.approx([0.99, 0.05, 0.4, 0.5])


def test_a_link_fitted_on_ends_seen_in_a_wait_is_the_transfer_not_the_rest_of_backward(tmp_path: Path) -> None:
    # Two ranks hand their two gradients over during backward; the library runs them one
    # after the other once backward is over (MPI's non-blocking all-reduce, progressed inside
    # the wait), each a ring all-reduce of 2 ranks: tc(M) = 2α + βM.
    forward, n_iters = 0.01, 12
    tb = (0.004, 0.006)  # backward of layer 1, layer 2
    sizes = (4e5, 1e6)  # their gradients' bytes
    it = iterations(2, n_iters, forward=forward, backward=sum(tb), batch=8)
    tc1, tc2 = (2 * ALPHA + BETA * size for size in sizes)
    rows = []
    for r in range(2):
        for i in range(n_iters):
            start = it["t_start"][r, i] + forward
            waits = start + sum(tb)
            rows.append((r, i, int(sizes[1]), start + tb[1], waits + tc2))  # the last layer's first
            rows.append((r, i, int(sizes[0]), waits, waits + tc2 + tc1))
    point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=2, batch_size=8)
    links = {}
    for seen in ("wait", "completion"):
        path = write_point_file(tmp_path / f"{seen}.h5", point, it, comm=comm_rows(rows), provenance={"comm_end": seen})
        links[seen], _ = predict.fit_link_from_points([read_point(path)])
    assert links["wait"].alpha == pytest.approx(ALPHA, rel=1e-6)
    assert links["wait"].beta == pytest.approx(BETA, rel=1e-6)
    # Taken as completions, the first message lasts through the rest of backward (4 ms more):
    # a 1 MB message comes out a third dearer than it is.
    dearer = collectives.ring_allreduce(sizes[1], 2, links["completion"]) / tc2
    assert dearer == pytest.approx(1.34, abs=0.01)


def test_layers_from_trace_reads_bucket_sizes_and_backward_gaps() -> None:
    it = iterations(1, 2, data=0.01, forward=0.1, backward=0.3, update=0.05)
    rows = []
    for i in range(2):
        start = it["t_start"][0, i] + 0.11  # backward starts after data + forward
        rows += [(0, i, 400, start + 0.1, start + 0.15), (0, i, 100, start + 0.3, start + 0.32)]
    layers = fit.layers_from_trace(it, comm_rows(rows), np.array([True, True]))
    # handed over first: layer L (400 bytes, 0.1 s of backward); then layer 1 (100 bytes, 0.2 s)
    assert [layer.grad_bytes for layer in layers] == [100, 400]
    assert [layer.backward_s for layer in layers] == pytest.approx([0.2, 0.1])
    (only,) = fit.layers_from_trace(it, comm_rows([]), np.array([True, True]))
    assert only.grad_bytes == 0.0
    assert only.backward_s == pytest.approx(0.3)


# --- the model reads the backend's traits from the point file, not its name ---------------
SLICE_WAIT = 0.75e-3  # half of Linux's slice on 2 CPUs: a sleeping ring's wait per step (contention.py)


def _gloo_sweep(directory: Path, traits: Traits | None) -> dict[int, float]:
    """torch `gloo` at 1, 2 and 4 single-thread ranks on 2 CPUs, following the model of a
    ring that sleeps while it waits (helpers.model_point); `traits`: recorded in each file's
    provenance in place of what the name `gloo` meant before traits were recorded."""
    directory.mkdir()
    truth = {n: model_point(directory, n, cpus=2, wait=SLICE_WAIT)[1] for n in (1, 2, 4)}
    for path in directory.glob("*.h5"):
        if traits is not None:
            with h5py.File(path, "r+") as f:
                f["provenance"].attrs["traits"] = traits.to_json()
    return truth


def test_a_point_is_predicted_by_its_recorded_traits_not_its_backends_name(tmp_path: Path) -> None:
    truth = _gloo_sweep(tmp_path / "legacy", None)
    legacy = pipeline.analyse(tmp_path / "legacy").predictions.set_index("ranks")
    # a file written before traits were recorded: `gloo`'s traits then, its ring sleeps
    assert read_point(next((tmp_path / "legacy").glob("*.h5"))).traits == LEGACY["gloo"]
    assert legacy.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    # the same traits recorded: the same predictions, to the last bit
    _gloo_sweep(tmp_path / "recorded", LEGACY["gloo"])
    recorded = pipeline.analyse(tmp_path / "recorded").predictions.set_index("ranks")
    for column in ("predicted_t_iter_s", "predicted_no_overlap_s", "alpha_s", "beta_s_per_byte"):
        assert recorded[column].tolist() == legacy[column].tolist(), column
    # the same name, recorded as a ring whose threads poll (sleeping_wait off): 4 ranks on 2
    # CPUs no longer wait half a slice at each of the ring's 2(p − 1) steps
    _gloo_sweep(tmp_path / "polls", replace(LEGACY["gloo"], sleeping_wait=False))
    polls = pipeline.analyse(tmp_path / "polls").predictions.set_index("ranks")
    assert polls.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4] - 6 * SLICE_WAIT, rel=1e-6)
    assert polls.loc[2, "predicted_t_iter_s"] == pytest.approx(legacy.loc[2, "predicted_t_iter_s"], rel=1e-9)
    # ... or as an exchange through MPI_Allreduce (mpi_exchange on): served once backward is
    # over, with or without wait-free back-propagation
    _gloo_sweep(tmp_path / "mpi", replace(LEGACY["gloo"], sleeping_wait=False, mpi_exchange=True))
    mpi = pipeline.analyse(tmp_path / "mpi").predictions.set_index("ranks")
    assert mpi["predicted_t_iter_s"].tolist() == mpi["predicted_no_overlap_s"].tolist()
    at_two = legacy["predicted_t_iter_s"].to_dict()[2]
    assert at_two < legacy["predicted_no_overlap_s"].to_dict()[2]
    assert mpi["predicted_t_iter_s"].to_dict()[2] > at_two


def test_a_backends_grouping_is_its_exchange() -> None:
    # the exchange a forecast schedules follows the recorded trait `grouping`, not a name
    assert exchange.exchange_of(LEGACY["gloo"]) is exchange.DDP
    assert exchange.exchange_of(LEGACY["horovod"]) is exchange.HOROVOD
    assert exchange.exchange_of(LEGACY["pmean_fused"]) is exchange.ONE_MESSAGE
    assert exchange.exchange_of(Traits()) is exchange.PER_TENSOR
    assert exchange.exchange_of(Traits(grouping="buckets", mpi_exchange=True)) is exchange.DDP
