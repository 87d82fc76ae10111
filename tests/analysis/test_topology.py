"""The model on the mission's axis, against numbers worked out by hand: collectives on nodes ×
ranks per node, how backends group gradients into messages, CPU contention, tensor costs,
and leave-one-scale-out on a sweep that follows the model exactly."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model import collectives as co
from hpcbench.analysis.model import exchange as ex
from hpcbench.analysis.model import iteration as model
from hpcbench.analysis.model import validate
from hpcbench.analysis.model.contention import (
    compute_scale,
    effective_cores_from_wait,
    exchange_wait,
    fit_effective_cores,
    fit_phi,
    rings_that_wait,
    scheduler_slice,
)
from hpcbench.analysis.placement import Placement
from hpcbench.cli.analyze import cmd_summary
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.testing.arrays import iterations, model_point, sched_rows
from hpcbench.testing.fabricate import write_point_file
from hpcbench.workloads import zoo
from hpcbench.workloads.costs import backward_order, tensor_costs

INTRA = co.LinkCost(alpha=1e-6, beta=1e-10)  # 10 GB/s, 1 µs
INTER = co.LinkCost(alpha=2e-5, beta=1e-9)  # 1 GB/s, 20 µs
N = 8e6  # bytes


def test_nodes_times_ranks_per_node_is_not_a_flat_count() -> None:
    wide = co.Topology(8, 1, INTRA, INTER)
    deep = co.Topology(2, 4, INTRA, INTER)
    one_node = co.Topology(1, 8, INTRA, INTER)
    # flat ring: 2(p−1)α + 2n(p−1)/p·β with the slowest hop's α, β
    assert co.allreduce(N, wide) == pytest.approx(14 * 2e-5 + 2 * N * 7 / 8 * 1e-9)
    assert co.allreduce(N, deep) == pytest.approx(co.allreduce(N, wide))  # same slowest hop, same p
    assert co.allreduce(N, one_node) == pytest.approx(14 * 1e-6 + 2 * N * 7 / 8 * 1e-10)
    # hierarchical: reduce-scatter in the node (k=4), ring of n/k over 2 nodes (4 flows on one NIC), all-gather
    rs = 3 * 1e-6 + N * 3 / 4 * 1e-10
    across = 2 * 1 * 2e-5 + 2 * (N / 4) * 1 / 2 * (1e-9 * 4)
    assert co.allreduce(N, deep, "hierarchical") == pytest.approx(rs + across + rs)
    assert co.allreduce(N, deep, "hierarchical") != pytest.approx(co.allreduce(N, wide, "hierarchical"))
    two_nics = co.Topology(2, 4, INTRA, INTER, nics_per_node=2)
    assert co.allreduce(N, two_nics, "hierarchical") < co.allreduce(N, deep, "hierarchical")
    assert co.allreduce(N, co.Topology(1, 1, INTRA, INTER)) == 0.0


def test_other_algorithms_and_bad_input() -> None:
    topo = co.Topology(4, 1, INTRA, INTER)
    assert co.allreduce(N, topo, "tree") == pytest.approx(2 * (2e-5 + N * 1e-9))
    assert co.allreduce(N, topo, "rabenseifner") == pytest.approx(4 * 2e-5 + 2 * N * 3 / 4 * 1e-9)
    with pytest.raises(co.ModelError, match="unknown all-reduce algorithm 'star'"):
        co.allreduce(N, topo, "star")
    with pytest.raises(co.ModelError, match="power of two"):
        co.allreduce(N, co.Topology(3, 1, INTRA, INTER), "rabenseifner")
    with pytest.raises(co.ModelError, match="0 nodes"):
        co.Topology(0, 1, INTRA, INTER)


def test_links_from_rate_and_from_published_fits() -> None:
    link = co.link_from_rate(10.0, 5.0)  # 10 Gbit/s = 1.25 GB/s
    assert link.beta == pytest.approx(8e-10)
    assert link.alpha == pytest.approx(5e-6)
    # a per-P fit t(n) = α_p + β_p·n at p = 8 gives back the ring it came from
    fit = co.ring_message_cost(8, link)
    back = co.link_from_collective_fit(8, fit.alpha, fit.beta)
    assert back.alpha == pytest.approx(link.alpha)
    assert back.beta == pytest.approx(link.beta)
    with pytest.raises(co.ModelError, match="bandwidth"):
        co.link_from_rate(0.0, 1.0)


def test_parameter_server_push_and_pull() -> None:
    link = co.LinkCost(1e-4, 1e-9)
    # synchronous: every worker's n bytes both ways through S servers' links: 2α + 2·W·n/S·β
    assert co.parameter_server(N, 4, 2, link) == pytest.approx(2e-4 + 2 * 4 * N / 2 * 1e-9)
    assert co.parameter_server(N, 4, 2, link, sync=False) == pytest.approx(2e-4 + 2 * N / 2 * 1e-9)


TENSORS = [model.Layer(b, t) for b, t in ((3e6, 0.001), (2e6, 0.002), (30e6, 0.003), (0.5e6, 0.001))]
# backward order: 0.5 MB ready at 1 ms, 30 MB at 4 ms, 2 MB at 6 ms, 3 MB at 7 ms


def cost(n: float) -> float:
    return 1e-4 + n * 1e-10


def test_per_tensor_exchange_is_the_wait_free_recurrence() -> None:
    s = ex.schedule(TENSORS, cost, ex.PER_TENSOR)
    tb = [layer.backward_s for layer in TENSORS]
    tc = [cost(layer.grad_bytes) for layer in TENSORS]
    assert s.exposed == pytest.approx(model.wfbp(tb, tc).non_overlapped)
    assert len(s.messages) == 4


def test_ddp_buckets_fill_in_backward_order_with_a_small_first_one() -> None:
    s = ex.schedule(TENSORS, cost, ex.Exchange(fusion_bytes=25e6, first_bucket_bytes=1e6))
    # first bucket: 0.5 MB (30 MB would pass 1 MB); then 30 MB alone (already >= 25 MB); then 2 + 3 MB
    assert [m.grad_bytes for m in s.messages] == [0.5e6, 30e6, 5e6]
    assert [m.ready for m in s.messages] == pytest.approx([0.001, 0.004, 0.007])
    assert s.messages[-1].end == pytest.approx(max(0.004 + cost(30e6), 0.007) + cost(5e6))


def test_horovod_fuses_what_is_ready_each_cycle() -> None:
    s = ex.schedule(TENSORS, cost, ex.Exchange(fusion_bytes=64e6, cycle_s=0.005))
    # cycles at 5 ms and 10 ms: 0.5 MB + 30 MB ready by 5 ms go together; 2 MB and 3 MB by 10 ms
    assert [m.grad_bytes for m in s.messages] == [30.5e6, 5e6]
    assert [m.start for m in s.messages] == pytest.approx([0.005, 0.010])
    assert s.exposed == pytest.approx(0.010 + cost(5e6) - 0.007)
    one = ex.schedule(TENSORS, cost, ex.ONE_MESSAGE)
    assert one.exposed == pytest.approx(cost(35.5e6))
    serial = ex.schedule(TENSORS, cost, ex.Exchange(overlap=False))
    assert serial.exposed == pytest.approx(sum(cost(layer.grad_bytes) for layer in TENSORS))


def test_contention_follows_the_cores_each_rank_has() -> None:
    one = Placement(ranks_per_host=1, threads=2, cores=2)
    two = Placement(2, 1, 2)
    four = Placement(4, 1, 2)
    assert not two.oversubscribed and four.oversubscribed
    assert four.oversubscription == 2.0
    assert compute_scale(two, four, phi=0.5) == pytest.approx(2.0)  # same threads: time-sharing only
    assert compute_scale(one, two, phi=0.5) == pytest.approx(2**0.5)  # half the threads
    # φ back from two measured placements whose compute follows the law with φ = 0.6
    assert fit_phi(one, two, 1.0, 2**0.6) == pytest.approx(0.6)
    assert fit_phi(two, four, 1.0, 2.0) is None  # same threads: cannot tell
    assert fit_phi(one, four, 1.0, 1.0) == 0.0  # faster than time-sharing allows: clipped


def test_effective_cores_from_one_rank_and_several() -> None:
    alone, two, four = Placement(1, 1, 2), Placement(2, 1, 2), Placement(4, 1, 2)
    # two single-thread ranks run 1.6x slower than one: the 2 CPUs are worth 1.25 cores
    assert fit_effective_cores(alone, two, 1.0, 1.6) == pytest.approx(1.25)
    assert fit_effective_cores(alone, four, 1.0, 3.2) == pytest.approx(1.25)
    assert fit_effective_cores(alone, two, 1.0, 1.03) is None  # no slowdown seen: the CPU count stands
    assert fit_effective_cores(alone, four, 1.0, 1.5) == 2.0  # less than time-sharing allows: clipped to C
    assert fit_effective_cores(alone, four, 1.0, 9.0) == 1.0  # more than one core's worth lost: clipped to 1
    assert fit_effective_cores(two, four, 1.0, 2.0) is None  # no single thread-load: cannot tell
    assert fit_effective_cores(Placement(1, 2, 2), four, 1.0, 2.0) is None  # other threads
    assert compute_scale(Placement(1, 1, 1.25), Placement(4, 1, 1.25), phi=0) == pytest.approx(3.2)
    # the scheduler's word instead: a loop that waited 37.5 % of its runnable time ran at 0.625 speed
    assert effective_cores_from_wait(two, 0.375) == pytest.approx(1.25)
    assert effective_cores_from_wait(four, 0.9) == 1.0  # clipped to one core
    assert effective_cores_from_wait(two, 0.03) == 2.0  # under 5 %: no contention seen, the CPU count measured
    assert effective_cores_from_wait(alone, 0.5) is None  # one thread-load cannot be slowed by sharing
    assert effective_cores_from_wait(two, math.nan) is None  # not measured


def test_an_oversubscribed_exchange_waits_half_the_kernels_slice_per_ring_step() -> None:
    # Linux's default slice: 0.75 ms x (1 + log2 CPUs), the CPUs capped at 8
    slices = [scheduler_slice(n) for n in (1, 2, 3, 4, 8, 64)]
    assert slices == pytest.approx([0.75e-3, 1.5e-3, 1.5e-3, 2.25e-3, 3e-3, 3e-3])
    # the backends' traits (store/traits.py): gloo's threads sleep while they wait, MPI's poll
    gloo, mpi = Traits(grouping="buckets", sleeping_wait=True), Traits(mpi_exchange=True)
    server = Traits(parameter_server=True, sleeping_wait=True)
    assert exchange_wait(Placement(4, 1, 2), gloo, 4) == pytest.approx(6 * 0.75e-3)  # 2(p − 1) steps
    assert exchange_wait(Placement(2, 1, 2), gloo, 2) == 0.0  # a CPU per thread: no wait
    assert exchange_wait(Placement(2, 3, 4), gloo, 2) == pytest.approx(2 * 1.125e-3)  # 6 threads on 4 CPUs
    assert exchange_wait(Placement(4, 1, 2), mpi, 4) == 0.0  # MPI polls: its ranks keep their CPUs
    assert exchange_wait(Placement(4, 1, 2), server, 4) == 0.0  # a parameter server is no ring
    # gloo's worker drains its queue after backward: the rings after the first find their peers
    # in the exchange; JAX runs each all-reduce as a program of its own: each waits
    pmean = Traits(sleeping_wait=True, waits_per_message=True)
    assert rings_that_wait(gloo, 10) == 1 and rings_that_wait(pmean, 10) == 10
    assert rings_that_wait(pmean, 0) == 1


# Half of Linux's default scheduler slice on 2 CPUs, by hand: 0.75 ms · (1 + log2 2) / 2
HALF_SLICE_2_CPUS = 0.75e-3


@pytest.mark.parametrize(("backend", "wait"), [("gloo", HALF_SLICE_2_CPUS), ("pmean", HALF_SLICE_2_CPUS), ("mpi", 0.0)])
def test_held_out_ring_on_time_shared_cores(tmp_path: Path, backend: str, wait: float) -> None:
    """Single-thread ranks on a 2-CPU host whose exchange follows the model: at 4 ranks compute
    and every hop take twice as long and, where the backend's threads sleep while they wait
    (gloo; MPI polls), the exchange waits half a slice at each of its first ring's steps (JAX's
    `pmean`, each of whose all-reduces is a program of its own: each ring's). Held
    out, 4 ranks are predicted from 1 and 2 (the wait added), and 2 ranks from 1 and 4 (the
    wait taken out of the link fitted on the oversubscribed point's messages): both exactly."""
    truth = {n: model_point(tmp_path, n, cpus=2, wait=wait, backend=backend)[1] for n in (1, 2, 4)}
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6)
    assert bool(held.loc[4, "oversubscribed"]) and not bool(held.loc[2, "oversubscribed"])
    # without the wait, 4 ranks' 6 hops per message would be 4.5 ms short each: not within 1e-6
    if wait:
        (tmp_path / "no-wait").mkdir()
        rings = 2 if backend == "pmean" else 1
        assert truth[4] - model_point(tmp_path / "no-wait", 4, cpus=2)[1] == pytest.approx(rings * 6 * wait)


def test_tensor_costs_add_up_to_the_zoo() -> None:
    for name in zoo.NAMES:
        m = zoo.model(name)
        costs = tensor_costs(m)
        assert sum(c.parameters for c in costs) == zoo.count_parameters(m)
        assert backward_order(m)[0] == costs[-1]
    # ResNet-50 v1.5: about 4.1 × 10^9 multiply-adds per 224×224 image
    flops = sum(c.flops for c in tensor_costs(zoo.model("resnet50")))
    assert 2 * 4.0e9 < flops < 2 * 4.2e9
    lenet = tensor_costs(zoo.model("lenet"))
    assert lenet[0].grad_bytes == 4 * lenet[0].parameters


# --- leave one scale out on a sweep whose points follow the contention law exactly ------------
FORWARD, BACKWARD, UPDATE = 0.010, 0.020, 0.002
PHI = 0.5
# The contention law with φ = 0.5, worked out by hand from the 1-rank point (2 threads on 2 cores):
# 2 ranks of 1 thread still have a core each, their compute (2/1)^φ = √2 as long; 4 ranks of 1
# thread time-share the 2 cores (2x) on top of that: 2√2.
CONTENDED = {1: 1.0, 2: 2**0.5, 4: 2 * 2**0.5}


def contended_point(directory: Path, ranks: int) -> float:
    """A 1-node point on a 2-core host, threads = cores // ranks (at least 1), compute scaled by
    the contention law from the 1-rank point (CONTENDED); no communication (the exchange is not
    the test)."""
    threads = max(1, 2 // ranks)
    scale = CONTENDED[ranks]
    it = iterations(ranks, 12, warmup=2, forward=FORWARD * scale, backward=BACKWARD * scale, update=UPDATE * scale)
    point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=ranks, batch_size=8)
    provenance = {"cpu_count": 2, "environment": {"OMP_NUM_THREADS": str(threads)}}
    write_point_file(directory / f"{point.id}.h5", point, it, hostnames=["h"] * ranks, provenance=provenance)
    return (FORWARD + BACKWARD + UPDATE) * scale


def test_held_out_error_is_zero_on_a_sweep_that_follows_the_model(tmp_path: Path) -> None:
    truth = {n: contended_point(tmp_path, n) for n in (1, 2, 4)}
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    # 4 ranks held out: φ fitted on 1 and 2 ranks (2 and 1 threads), 2x oversubscription predicted
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    assert bool(held.loc[4, "oversubscribed"])
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
    for n in (2, 4):
        assert abs(float(held["resid_compute_s"][n])) < 1e-9
    # the report's first line says how well the model did, the second which points were oversubscribed
    assert analysis.headlines[0].startswith("Model held-out error (leave one scale out): torch/gloo median")
    assert "Oversubscribed:" in analysis.headlines[1] and "(4 ranks)" in analysis.headlines[1]
    summary = validate.summary(analysis.held_out)
    assert summary["points"].tolist() == [3]
    assert math.isfinite(float(summary["max_abs_error"].iloc[0]))


def runtime_pool_point(directory: Path, ranks: int, said: bool) -> float:
    """A rank whose framework computes on a thread per CPU of its 2-CPU host whatever the
    point's `threads: 1` says (JAX's CPU runtime): 2 thread-loads per rank share the 2 CPUs,
    so its compute grows as the ranks. `said`: the provenance's `compute_threads` says 2.
    The truth: t_iter."""
    scale = max(1.0, 2 * ranks / 2)
    it = iterations(ranks, 12, warmup=2, forward=FORWARD * scale, backward=BACKWARD * scale, update=UPDATE * scale)
    point = Point(framework="jax", backend="pmean", model="mlp", ranks_per_node=ranks, batch_size=8, threads=1)
    provenance: dict[str, object] = {"cpu_count": 2, **({"compute_threads": 2} if said else {})}
    write_point_file(directory / f"{point.id}.h5", point, it, hostnames=["h"] * ranks, provenance=provenance)
    return (FORWARD + BACKWARD + UPDATE) * scale


@pytest.mark.parametrize("said", [True, False])
def test_the_threads_a_framework_says_it_computes_on_are_the_ones_counted(tmp_path: Path, said: bool) -> None:
    truth = {n: runtime_pool_point(tmp_path, n, said) for n in (1, 2, 4)}
    held = pipeline.analyse(tmp_path).held_out.set_index("ranks")
    if said:  # 2 threads per rank counted: 2 ranks are 2x oversubscribed, 1 rank is not
        for n in (1, 2, 4):
            assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
        assert held["oversubscribed"].tolist() == [False, True, True]
    else:  # 1 thread per rank counted (the point's `threads`): 2 ranks fit 2 CPUs, and
        # 1 rank is predicted as slow as 2: what JAX's one rank held out missed by before
        assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
        assert held["oversubscribed"].tolist() == [False, False, True]


def test_the_calibration_point_is_the_mean_of_its_repeats(tmp_path: Path) -> None:
    # one rank run twice (seeds 0 and 1), 10 % faster and 10 % slower than its true compute;
    # two ranks (no exchange, no contention) compute the true time: the repeats' mean predicts it
    truth = FORWARD + BACKWARD + UPDATE
    for ranks, seed, scale in ((1, 0, 0.9), (1, 1, 1.1), (2, 0, 1.0)):
        it = iterations(ranks, 12, warmup=2, forward=FORWARD * scale, backward=BACKWARD * scale, update=UPDATE * scale)
        point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=ranks, batch_size=8, seed=seed)
        write_point_file(tmp_path / f"{point.id}.h5", point, it)
    pred = pipeline.analyse(tmp_path).predictions.set_index(["ranks", "seed"])
    assert pred.loc[(2, 0), "predicted_t_iter_s"] == pytest.approx(truth, rel=1e-6)
    assert bool(pred.loc[(1, 0), "calibration"]) and bool(pred.loc[(1, 1), "calibration"])
    assert pred.loc[(1, 0), "rel_error"] == pytest.approx(1 / 0.9 - 1, rel=1e-6)  # each repeat against the mean


def test_a_held_out_point_says_how_far_its_repeats_lay_apart(tmp_path: Path) -> None:
    # four ranks run twice (seeds 0 and 1), 20 % faster and 20 % slower than the compute that
    # one and two ranks measured (no exchange, no contention): each held-out four-rank row
    # misses by its own deviation, carries the repeats' spread (0.4 of their mean) and says so
    truth = FORWARD + BACKWARD + UPDATE
    for ranks, seed, scale in ((1, 0, 1.0), (2, 0, 1.0), (4, 0, 0.8), (4, 1, 1.2)):
        it = iterations(ranks, 12, warmup=2, forward=FORWARD * scale, backward=BACKWARD * scale, update=UPDATE * scale)
        point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=ranks, batch_size=8, seed=seed)
        write_point_file(tmp_path / f"{point.id}.h5", point, it)
    analysis = pipeline.analyse(tmp_path)
    assert len(analysis.held_out) == 4
    four = analysis.held_out[analysis.held_out["ranks"] == 4]
    assert four["predicted_t_iter_s"].tolist() == pytest.approx([truth, truth], rel=1e-6)
    assert sorted(four["rel_error"].tolist()) == pytest.approx([1 / 1.2 - 1, 1 / 0.8 - 1], rel=1e-6)
    assert four["repeat_spread"].tolist() == pytest.approx([0.4, 0.4], rel=1e-6)
    for note in four["note"]:
        assert "its 2 repeats at this scale differ by 40% of their mean (run-to-run variation)" in note
    others = analysis.held_out[analysis.held_out["ranks"] < 4]
    assert others["repeat_spread"].isna().all() and not others["note"].str.contains("repeats").any()
    assert (
        "held-out points whose repeats at their scale differ by 20% or more (run-to-run variation"
        in (analysis.headlines[0])
    )
    assert analysis.headlines[0].rstrip(".").endswith(": 2")


def test_one_ranks_own_exchange_is_predicted_at_one_rank_only(tmp_path: Path) -> None:
    # A backend's all-reduce over one rank sends nothing but still takes 1 ms (its hooks, its
    # buckets' copies): the one-rank calibration point is predicted with it, exactly, and the
    # ranks that exchange messages as before (their link was fitted on those messages).
    (tmp_path / "alone").mkdir()
    (tmp_path / "none").mkdir()
    truth = {n: model_point(tmp_path / "alone", n, alone=1e-3)[1] for n in (1, 2, 4)}
    without = {n: model_point(tmp_path / "none", n)[1] for n in (1, 2, 4)}
    assert truth[1] == pytest.approx(without[1] + 1e-3) and truth[4] == without[4]
    pred = pipeline.analyse(tmp_path / "alone").predictions.set_index("ranks")
    for n in (1, 2, 4):
        assert pred.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    assert pred.loc[1, "pred_comm_exposed_s"] == pytest.approx(1e-3, rel=1e-6)
    # the efficiency predicted against one rank that exchanges, as the measured one is
    assert pred.loc[4, "predicted_efficiency"] == pytest.approx(pred.loc[4, "measured_efficiency"], rel=1e-6)
    # held out, 2 and 4 ranks do not carry it; 1 rank, predicted from 2 and 4, cannot know it
    held = pipeline.analyse(tmp_path / "alone").held_out.set_index("ranks")
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(without[1], rel=1e-6)


def host_of_125_cores(
    directory: Path, runnable: float | None = None, cores: float = 1.25, others: bool = False, steal4: float = 0.0
) -> dict[int, float]:
    """Single-thread ranks on a 2-CPU host worth `cores` cores (1.25: sibling hardware threads,
    say): compute grows by max(1, k / cores), not max(1, k / 2). With `runnable`, the point files
    hold what the scheduler saw: each loop waited 1 - 1 / slowdown of its runnable time
    (2 ranks: 37.5 %, 4 ranks: 68.75 %), runnable for that share of the time (the compute's
    share is 1). With `others`, the host is worth less because other processes hold 2 - `cores`
    of its CPUs: the ranks run on what is left. `steal4`: the hypervisor's steal (%) while the
    4-rank point ran. The truth: t_iter per rank count."""
    truth = {}
    for n in (1, 2, 4):
        scale = max(1.0, n / cores)
        it = iterations(n, 12, warmup=2, forward=FORWARD * scale, backward=BACKWARD * scale, update=UPDATE * scale)
        point = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=n, batch_size=8, threads=1)
        provenance = {"cpu_count": 2, "environment": {"OMP_NUM_THREADS": "1"}}
        cpus, busy = (1 / scale, (n / scale + 2 - cores) / 2) if others else (1.0, 0.5)
        waits = (
            sched_rows(n, 1.5, 12.0, wait=1 - 1 / scale, runnable=runnable, cpus=cpus, node_busy=busy)
            if runnable is not None
            else None
        )
        if waits is not None and n == 4:
            waits["cpu_steal"] = steal4
        write_point_file(directory / f"{point.id}.h5", point, it, resources=waits, hostnames=["h"] * n,
                         provenance=provenance)  # fmt: skip
        truth[n] = (FORWARD + BACKWARD + UPDATE) * scale
    return truth


def test_held_out_follows_a_host_whose_cores_are_worth_less_than_their_count(tmp_path: Path) -> None:
    truth = host_of_125_cores(tmp_path)
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    assert "extrapolated without the host's effective cores: 1" in analysis.headlines[0]
    # 4 ranks from 1 and 2 (C_eff fitted), 2 ranks from 1 and 4: exact
    for n in (2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6)
    # 1 rank from 2 and 4 cannot know C_eff: the CPU count is assumed, the miss is said
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
    assert "effective cores not measured" in str(held.loc[1, "note"])


def test_one_rank_from_several_through_the_run_queue_wait_of_their_loops(tmp_path: Path) -> None:
    """With the scheduler's account, one rank held out is predicted from 2 and 4 exactly, and
    the notes name the wait."""
    truth = host_of_125_cores(tmp_path, runnable=1.0)
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6)
    assert "extrapolated" not in analysis.headlines[0]
    assert "waited 38% of their runnable time for a CPU although 2 rank(s) × 1 thread(s) on 2 cores fit" in str(
        held.loc[2, "note"]
    )
    assert analysis.stats.set_index("ranks").loc[4, "cpu_wait"] == pytest.approx(0.6875, rel=1e-6)
    assert not held["note"].str.contains("other processes").any() and "other processes" not in analysis.headlines[0]


def test_the_notes_name_the_points_during_which_other_processes_held_cpus(tmp_path: Path) -> None:
    """0.75 of the host's 2 CPUs held by other processes at every scale: the stats say so, and
    every held-out note names its own point and its calibration points."""
    host_of_125_cores(tmp_path, runnable=1.0, others=True)
    analysis = pipeline.analyse(tmp_path)
    stats = analysis.stats.set_index("ranks")
    assert stats["other_cpus"].to_numpy() == pytest.approx([0.75] * 3, rel=1e-6)
    assert "measured beside other work (other processes' CPUs, a hypervisor's steal): 3" in analysis.headlines[0]
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        note = str(held.loc[n, "note"])
        assert "measured beside other work: other processes 0.75 CPUs during this point" in note
        for m in {1, 2, 4} - {n}:
            assert f"0.75 CPUs during calibration point {stats.loc[m, 'point']}" in note


def test_the_notes_name_the_point_during_which_the_hypervisor_stole_cpu_time(tmp_path: Path) -> None:
    """The 4-rank point ran while the hypervisor took 8 % of the host's CPU time: the stats
    say so, its own held-out note and those calibrated on it name it, and no other point."""
    host_of_125_cores(tmp_path, runnable=1.0, steal4=8.0)
    analysis = pipeline.analyse(tmp_path)
    stats = analysis.stats.set_index("ranks")
    assert stats["cpu_steal"].to_numpy() == pytest.approx([0.0, 0.0, 8.0])
    assert "a hypervisor's steal): 3" in analysis.headlines[0]
    held = analysis.held_out.set_index("ranks")
    assert "measured beside other work: hypervisor steal 8 % during this point" in str(held.loc[4, "note"])
    for n in (1, 2):
        note = str(held.loc[n, "note"])
        assert f"hypervisor steal 8 % during calibration point {stats.loc[4, 'point']}" in note
        assert "during this point" not in note
    notes = [n for n in analysis.notes if "hypervisor gave" in n]
    assert len(notes) == 1 and notes[0].startswith(f"point {stats.loc[4, 'point']}: the hypervisor gave 8 %")


def test_loops_that_did_not_wait_measure_the_cpu_count(tmp_path: Path) -> None:
    """Cores worth their count: the 2-rank loops waited 0 %, so one rank alone computes as
    fast as each of two, which is measured now, not assumed."""
    truth = host_of_125_cores(tmp_path, runnable=1.0, cores=2.0)
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6)
    assert truth[1] == truth[2] and "extrapolated" not in analysis.headlines[0]


def test_a_loop_that_hands_the_compute_to_other_threads_says_nothing_of_their_wait(tmp_path: Path) -> None:
    """The same sweep, but the loops were runnable 15 % of the time while the compute took all
    of it (TensorFlow's, MXNet's, JAX's own threads computed): their wait is not the compute's,
    and one rank held out falls back to the CPU count, with the note that says so."""
    truth = host_of_125_cores(tmp_path, runnable=0.15)
    held = pipeline.analyse(tmp_path).held_out.set_index("ranks")
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
    assert "effective cores not measured" in str(held.loc[1, "note"])


def test_analyze_notes_each_point_that_shared_its_host(tmp_path: Path) -> None:
    host_of_125_cores(tmp_path, runnable=1.0, others=True)
    out = io.StringIO()
    assert cmd_summary(tmp_path, out) == 0
    notes = [line for line in out.getvalue().splitlines() if "other processes than the ranks" in line]
    assert len(notes) == 3 and all("kept 0.75 CPUs busy during its timed loop" in n for n in notes)
    report = pipeline.analyse(tmp_path).notes
    assert sum("kept 0.75 CPUs busy during its timed loop" in n for n in report) == 3
