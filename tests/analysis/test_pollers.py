"""Threads that poll beside the compute (Horovod's background thread over an Open MPI that
spins) and the wait for the last rank where ranks take turns on the CPUs: sweeps that follow
the model exactly, predicted at every scale held out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model.contention import fit_effective_cores, ranks_take_turns
from hpcbench.analysis.model.predict import cycle_wait
from hpcbench.analysis.placement import Placement, placement_of
from hpcbench.spec import Point
from hpcbench.store.reader import PointData, read_point
from hpcbench.testing.arrays import EXPECTED_MAX, iterations, model_point
from hpcbench.testing.fabricate import write_point_file

SPINS = {"OMPI_MCA_mpi_oversubscribe": "0"}  # what mpirun sets where ranks <= slots
YIELDS = {"OMPI_MCA_mpi_oversubscribe": "1"}  # where they outnumber them
HALF_CYCLE_S = 0.5e-3  # half of Horovod's default HOROVOD_CYCLE_TIME, 1 ms: written here, not taken from the model
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"


def _point(tmp_path: Path, n: int, backend: str = "horovod", launcher: str = "mpirun",
           provenance: dict[str, object] | None = None) -> PointData:  # fmt: skip
    point = Point(framework="torch", backend=backend, model="mlp", ranks_per_node=n, batch_size=8, launcher=launcher)
    path = tmp_path / f"{point.id}-{len(list(tmp_path.iterdir()))}.h5"
    it = iterations(n, 4, forward=0.01, backward=0.02)
    write_point_file(path, point, it, hostnames=["h"] * n, provenance={"cpu_count": 2, **(provenance or {})})
    return read_point(path)


def test_horovod_over_an_mpi_that_spins_counts_the_polling_threads_that_can_spin_at_once(tmp_path: Path) -> None:
    # a poller spins while a peer is late, and the last to arrive waits for none: of 2 ranks'
    # pollers one spins at a time, half a thread each; of 4, three, 3/4 of a thread each
    spins = placement_of(_point(tmp_path, 2, provenance={"environment": SPINS}))
    assert spins == Placement(2, 1, 2, pollers=0.5)
    assert spins.load == 3 and spins.oversubscription == 1.5 and spins.oversubscribed
    assert not ranks_take_turns(spins)  # its ranks' own threads have a CPU each
    assert spins.describe() == "2 rank(s) × 1 thread(s) and 0.5 polling thread(s) each on 2 cores"
    assert placement_of(_point(tmp_path, 4, provenance={"environment": SPINS})).pollers == 0.75
    # Open MPI yields where it was told the host is oversubscribed, or to yield when idle
    assert placement_of(_point(tmp_path, 4, provenance={"environment": YIELDS})).pollers == 0
    told = {"OMPI_MCA_mpi_yield_when_idle": "1", **SPINS}
    assert placement_of(_point(tmp_path, 2, provenance={"environment": told})).pollers == 0
    # where the environment does not say, as mpirun decides: more ranks than CPUs
    assert placement_of(_point(tmp_path, 2)).pollers == 0.5
    assert placement_of(_point(tmp_path, 4)).pollers == 0
    # alone, a rank has no peer to wait for; MPI backends poll in the training loop itself;
    # Horovod started by horovodrun, or built without MPI, negotiates over Gloo, which sleeps
    assert placement_of(_point(tmp_path, 1, provenance={"environment": SPINS})).pollers == 0
    assert placement_of(_point(tmp_path, 2, backend="mpi", provenance={"environment": SPINS})).pollers == 0
    assert placement_of(_point(tmp_path, 2, launcher="horovodrun")).pollers == 0
    assert placement_of(_point(tmp_path, 2, provenance={"horovod_controller": "gloo"})).pollers == 0


def test_the_effective_cores_are_fitted_with_the_polling_threads_counted() -> None:
    # one rank alone, then two ranks whose pollers make 4 thread-loads on 2 CPUs: a compute
    # twice as long is what 2 CPUs give them, not a host of 1 effective core
    alone, spinning = Placement(1, 1, 2), Placement(2, 1, 2, pollers=1)
    assert fit_effective_cores(alone, spinning, 1.0, 2.0) == pytest.approx(2.0)
    assert fit_effective_cores(alone, Placement(2, 1, 2), 1.0, 2.0) == pytest.approx(1.0)


def _horovod(
    directory: Path, last_rank: float = 0.0, spin: float = 0.5, loop_wait: float | None = None,
    handed: bool = False, work_wait: float | None = None,
) -> dict[int, float]:  # fmt: skip
    """2 CPUs. 2 ranks: Open MPI spins, each rank's polling thread takes `spin` of a CPU
    beside its compute (2·(1 + spin) thread-loads: at most half a thread each, one of the
    two spinning at a time, which makes the compute 1.5 times as long as alone), the ranks
    wait `last_rank` for their last one, and their loops `loop_wait` for a CPU; `handed`:
    their loops hand the compute to the framework's threads (runnable a fifth of an
    iteration, as TensorFlow's and MXNet's), whose wait by their work was `work_wait`.
    4 ranks: it yields (4 loads), and they wait for none. One rank sends nothing, but its
    exchange waits half of Horovod's cycle for its background thread."""
    directory.mkdir()
    runnable = 0.2 if handed else None
    return {
        n: model_point(directory, n, cpus=2, backend="horovod", mpi=OPEN_MPI, environment=YIELDS if n == 4 else SPINS,
                       pollers=pollers, last_rank=wait, steps=4 if n == 4 else None,
                       loop_wait=loop_wait if n == 2 else None, work_wait=work_wait if n == 2 else None,
                       loop_runnable=runnable if n == 2 else None, alone=HALF_CYCLE_S if n == 1 else 0.0)[1]
        for n, pollers, wait in ((1, 0.0, 0.0), (2, spin, last_rank), (4, 0.0, 0.0))
    }  # fmt: skip


def test_a_horovod_sweep_whose_background_threads_spin_at_two_ranks_and_yield_at_four(tmp_path: Path) -> None:
    truth = _horovod(tmp_path / "sweep")
    analysis = pipeline.analyse(tmp_path / "sweep")
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    # the 4 ranks compute 4/3 of the 2's time: a model blind to the pollers, seeing the compute
    # grow 1.5 times from 1 to 2 ranks, would read a host of 4/3 effective cores and triple it
    # from 1 to 4
    forward = analysis.stats.set_index("ranks")["forward_s"]
    assert forward[2] == pytest.approx(1.5 * forward[1]) and forward[4] == pytest.approx(2 * forward[1])
    assert bool(held.loc[2, "oversubscribed"])


def test_a_wait_measured_where_ranks_take_turns_is_not_carried_to_ranks_with_a_cpu_each(tmp_path: Path) -> None:
    # An Open MPI exchange on 2 CPUs whose ranks wait for their last one only at 4 ranks, where
    # they take turns on the CPUs (and Open MPI yields): a wait for descheduled peers.
    wait = 3e-3
    truth = {
        n: model_point(tmp_path, n, cpus=2, backend="mpi", mpi=OPEN_MPI, steps=4 if n == 4 else None,
                       last_rank=wait, last_rank_in_turns=True)[1]
        for n in (1, 2, 4)
    }  # fmt: skip
    held = pipeline.analyse(tmp_path).held_out.set_index("ranks")
    # 2 ranks from 1 and 4: the wait measured at 4 is not carried to ranks with a CPU each
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[1], rel=1e-6)
    # 4 ranks from 1 and 2: the points with a CPU each show no such wait, so none is predicted
    grown = wait * EXPECTED_MAX[4] / EXPECTED_MAX[2]
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4] - grown, rel=1e-6)


def test_a_wait_measured_where_pollers_spin_is_not_carried_to_where_they_yield(tmp_path: Path) -> None:
    wait = 3e-3
    truth = _horovod(tmp_path / "sweep", last_rank=wait)
    held = pipeline.analyse(tmp_path / "sweep").held_out.set_index("ranks")
    # 4 ranks from 1 and 2: the 2 ranks' wait came with their spinning threads, not carried
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    # 2 ranks from 1 and 4: nothing measured shows it
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(truth[2] - wait, rel=1e-6)


def test_a_polling_threads_share_is_what_the_loops_wait_measured(tmp_path: Path) -> None:
    # Idle, a poller spins only while its peers are late: a third of a thread each at 2 ranks
    # (2·4/3 thread-loads on 2 CPUs, compute 4/3 as long as alone), and the loops waited
    # 1 − 2/(8/3) = 25 % for a CPU. One rank held out from 2 and 4 follows that wait.
    truth = _horovod(tmp_path / "measured", spin=1 / 3, loop_wait=0.25)
    held = pipeline.analyse(tmp_path / "measured").held_out.set_index("ranks")
    for n in (1, 2, 4):
        if n != 2:  # a placement predicted, not measured, counts as many as can spin
            assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    # held out, the 2 ranks are predicted as if their pollers spun half a thread each (a sweep
    # whose threads did), and their note says what their own loops' wait shows: 8/3
    # thread-loads, a third of a polling thread each
    at_most = _horovod(tmp_path / "bound")[2]
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(at_most, rel=1e-6)
    shown = "a wait of 25% is what 2.7 thread-loads on 2 CPUs give, 3 counted: 0.33 polling thread(s) each, not 0.5"
    assert shown in str(held.loc[2, "note"])
    # not measured, the 2 ranks' pollers count half a thread: the one rank's compute is
    # predicted as (4/3) / (3/2) of what it was
    _horovod(tmp_path / "unmeasured", spin=1 / 3)
    _assert_one_rank_computes(tmp_path / "unmeasured", 8 / 9)


def test_a_polling_threads_share_is_what_the_framework_threads_wait_measured(tmp_path: Path) -> None:
    # TensorFlow and MXNet compute on their own threads: the loop waits for them, not for a CPU,
    # so its wait says nothing. Their threads' wait by their work does: 25 %, a third of a
    # polling thread each at 2 ranks. One rank held out from 2 and 4 follows it.
    truth = _horovod(tmp_path / "framework", spin=1 / 3, loop_wait=0.9, handed=True, work_wait=0.25)
    held = pipeline.analyse(tmp_path / "framework").held_out.set_index("ranks")
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[1], rel=1e-6)
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    # without the threads' wait (a file before schema 7) they count as many as can spin
    _horovod(tmp_path / "older", spin=1 / 3, loop_wait=0.9, handed=True)
    _assert_one_rank_computes(tmp_path / "older", 8 / 9)


def _assert_one_rank_computes(sweep: Path, share: float) -> None:
    """One rank held out from 2 and 4 is predicted to compute `share` of its measured compute."""
    analysis = pipeline.analyse(sweep)
    one = analysis.stats.set_index("ranks").loc[1]
    compute = sum(one[f"{phase}_s"] for phase in ("data", "h2d", "forward", "backward", "update"))
    missed = analysis.held_out.set_index("ranks")["resid_compute_s"][1]
    assert missed == pytest.approx((1 - share) * compute, rel=1e-6)


def test_one_rank_of_horovod_waits_half_its_cycle(tmp_path: Path) -> None:
    # its background thread takes the tensors once per cycle: 1 ms by default, or as set
    assert cycle_wait(_point(tmp_path, 1)) == pytest.approx(0.5e-3)
    told: dict[str, object] = {"environment": {"HOROVOD_CYCLE_TIME": "5"}}
    assert cycle_wait(_point(tmp_path, 1, provenance=told)) == pytest.approx(2.5e-3)
    assert cycle_wait(_point(tmp_path, 1, provenance={"environment": {"HOROVOD_CYCLE_TIME": "x"}})) == 0.5e-3
    assert cycle_wait(_point(tmp_path, 1, backend="mpi", provenance=told)) == 0.0
    # what decides is the recorded trait `background_thread`, not the backend's name
    threaded: dict[str, object] = {"traits": {"background_thread": True}, **told}
    assert cycle_wait(_point(tmp_path, 1, backend="mpi", provenance=threaded)) == pytest.approx(2.5e-3)
    assert cycle_wait(_point(tmp_path, 1, provenance={"traits": {"grouping": "fusion"}, **told})) == 0.0


def test_a_polling_thread_is_the_recorded_traits(tmp_path: Path) -> None:
    # a background thread over MPI, as recorded, whatever the backend's name; not where the
    # launcher does not start the ranks through MPI_Init
    thread: dict[str, object] = {"traits": {"background_thread": True}, "environment": SPINS}
    assert placement_of(_point(tmp_path, 2, backend="mpi", provenance=thread)).pollers == 0.5
    alone: dict[str, object] = {"traits": {"background_thread": True, "launcher_mpi": False}, "environment": SPINS}
    assert placement_of(_point(tmp_path, 2, backend="mpi", provenance=alone)).pollers == 0
    unthreaded: dict[str, object] = {"traits": {"grouping": "fusion"}, "environment": SPINS}
    assert placement_of(_point(tmp_path, 2, provenance=unthreaded)).pollers == 0
