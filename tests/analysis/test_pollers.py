"""Threads that poll beside the compute (Horovod's background thread over an Open MPI that
spins) and the wait for the last rank where ranks take turns on the CPUs: sweeps that follow
the model exactly, predicted at every scale held out."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench.analysis import tables
from hpcbench.analysis.contention import Placement, fit_effective_cores, placement_of, ranks_take_turns
from hpcbench.analysis.exchange import HOROVOD_CYCLE_S
from hpcbench.analysis.predict import cycle_wait
from hpcbench.spec import Point
from hpcbench.store.reader import PointData, read_point
from hpcbench.testing.fabricate import write_point_file
from tests.analysis.helpers import EXPECTED_MAX, iterations, model_point

SPINS = {"OMPI_MCA_mpi_oversubscribe": "0"}  # what mpirun sets where ranks <= slots
YIELDS = {"OMPI_MCA_mpi_oversubscribe": "1"}  # where they outnumber them
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"


def _point(tmp_path: Path, n: int, backend: str = "horovod", launcher: str = "mpirun",
           provenance: dict[str, object] | None = None) -> PointData:  # fmt: skip
    point = Point(framework="torch", backend=backend, model="mlp", ranks_per_node=n, batch_size=8, launcher=launcher)
    path = tmp_path / f"{point.id}-{len(list(tmp_path.iterdir()))}.h5"
    it = iterations(n, 4, forward=0.01, backward=0.02)
    write_point_file(path, point, it, hostnames=["h"] * n, provenance={"cpu_count": 2, **(provenance or {})})
    return read_point(path)


def test_horovod_over_an_mpi_that_spins_counts_a_polling_thread_per_rank(tmp_path: Path) -> None:
    spins = placement_of(_point(tmp_path, 2, provenance={"environment": SPINS}))
    assert spins == Placement(2, 1, 2, pollers=1)
    assert spins.load == 4 and spins.oversubscription == 2.0 and spins.oversubscribed
    assert not ranks_take_turns(spins)  # its ranks' own threads have a CPU each
    assert spins.describe() == "2 rank(s) × 1 thread(s) and 1 polling thread(s) each on 2 cores"
    # Open MPI yields where it was told the host is oversubscribed, or to yield when idle
    assert placement_of(_point(tmp_path, 4, provenance={"environment": YIELDS})).pollers == 0
    told = {"OMPI_MCA_mpi_yield_when_idle": "1", **SPINS}
    assert placement_of(_point(tmp_path, 2, provenance={"environment": told})).pollers == 0
    # where the environment does not say, as mpirun decides: more ranks than CPUs
    assert placement_of(_point(tmp_path, 2)).pollers == 1
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
    directory: Path, last_rank: float = 0.0, spin: float = 1.0, loop_wait: float | None = None,
    work_wait: float | None = None,
) -> dict[int, float]:  # fmt: skip
    """2 CPUs. 2 ranks: Open MPI spins, each rank's polling thread takes `spin` of a CPU
    beside its compute (2·(1 + spin) thread-loads: with a whole thread, compute twice as long
    as alone), the ranks wait `last_rank` for their last one, and their loops `loop_wait` for
    a CPU; with `work_wait`, their loops hand the compute to the framework's threads (runnable
    a fifth of an iteration, as TensorFlow's and MXNet's) and the threads waited that share
    of their work. 4 ranks: it yields (4 loads), and they wait for none. One rank sends
    nothing, but its exchange waits half of Horovod's cycle for its background thread."""
    directory.mkdir()
    handed = 0.2 if work_wait is not None else None
    return {
        n: model_point(directory, n, cpus=2, backend="horovod", mpi=OPEN_MPI, environment=YIELDS if n == 4 else SPINS,
                       pollers=pollers, last_rank=wait, steps=4 if n == 4 else None,
                       loop_wait=loop_wait if n == 2 else None, work_wait=work_wait if n == 2 else None,
                       loop_runnable=handed if n == 2 else None, alone=HOROVOD_CYCLE_S / 2 if n == 1 else 0.0)[1]
        for n, pollers, wait in ((1, 0.0, 0.0), (2, spin, last_rank), (4, 0.0, 0.0))
    }  # fmt: skip


def test_a_horovod_sweep_whose_background_threads_spin_at_two_ranks_and_yield_at_four(tmp_path: Path) -> None:
    truth = _horovod(tmp_path / "sweep")
    analysis = tables.analyse(tmp_path / "sweep")
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    # the 4 ranks compute no longer than the 2: a model blind to the pollers, seeing the compute
    # double from 1 to 2 ranks, would have doubled it again from 2 to 4
    forward = analysis.stats.set_index("ranks")["forward_s"]
    assert forward[4] == pytest.approx(forward[2]) and forward[2] == pytest.approx(2 * forward[1])
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
    held = tables.analyse(tmp_path).held_out.set_index("ranks")
    # 2 ranks from 1 and 4: the wait measured at 4 is not carried to ranks with a CPU each
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(truth[2], rel=1e-6)
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[1], rel=1e-6)
    # 4 ranks from 1 and 2: the points with a CPU each show no such wait, so none is predicted
    grown = wait * EXPECTED_MAX[4] / EXPECTED_MAX[2]
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4] - grown, rel=1e-6)


def test_a_wait_measured_where_pollers_spin_is_not_carried_to_where_they_yield(tmp_path: Path) -> None:
    wait = 3e-3
    truth = _horovod(tmp_path / "sweep", last_rank=wait)
    held = tables.analyse(tmp_path / "sweep").held_out.set_index("ranks")
    # 4 ranks from 1 and 2: the 2 ranks' wait came with their spinning threads, not carried
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    # 2 ranks from 1 and 4: nothing measured shows it
    assert held.loc[2, "predicted_t_iter_s"] == pytest.approx(truth[2] - wait, rel=1e-6)


def test_a_polling_threads_share_is_what_the_loops_wait_measured(tmp_path: Path) -> None:
    # Idle, a poller spins only while its peers are late: a third of a thread each at 2 ranks
    # (2·4/3 thread-loads on 2 CPUs, compute 4/3 as long as alone), and the loops waited
    # 1 − 2/(8/3) = 25 % for a CPU. One rank held out from 2 and 4 follows that wait.
    truth = _horovod(tmp_path / "measured", spin=1 / 3, loop_wait=0.25)
    held = tables.analyse(tmp_path / "measured").held_out.set_index("ranks")
    for n in (1, 2, 4):
        if n != 2:  # a placement predicted, not measured, counts the whole thread
            assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    # held out, the 2 ranks are predicted with whole threads, and their note says what their
    # own loops' wait shows: 8/3 thread-loads, a third of a polling thread each
    assert float(held["predicted_t_iter_s"][2]) > 1.2 * truth[2]
    shown = "a wait of 25% is what 2.7 thread-loads on 2 CPUs give, 4 counted: 0.33 polling thread(s) each, not 1"
    assert shown in str(held.loc[2, "note"])
    # not measured, the 2 ranks' polling threads count whole: one rank at half their compute
    _horovod(tmp_path / "unmeasured", spin=1 / 3)
    one = float(tables.analyse(tmp_path / "unmeasured").held_out.set_index("ranks")["predicted_t_iter_s"][1])
    assert one < 0.8 * truth[1]


def test_a_polling_threads_share_is_what_the_framework_threads_wait_measured(tmp_path: Path) -> None:
    # TensorFlow and MXNet compute on their own threads: the loop waits for them, not for a CPU,
    # so its wait says nothing. Their threads' wait by their work does: 25 %, a third of a
    # polling thread each at 2 ranks. One rank held out from 2 and 4 follows it.
    truth = _horovod(tmp_path / "framework", spin=1 / 3, loop_wait=0.9, work_wait=0.25)
    held = tables.analyse(tmp_path / "framework").held_out.set_index("ranks")
    assert held.loc[1, "predicted_t_iter_s"] == pytest.approx(truth[1], rel=1e-6)
    assert held.loc[4, "predicted_t_iter_s"] == pytest.approx(truth[4], rel=1e-6)
    # without the threads' wait (a file before schema 7) the thread counts whole, as before
    _horovod(tmp_path / "older", spin=1 / 3, loop_wait=0.9)
    one = float(tables.analyse(tmp_path / "older").held_out.set_index("ranks")["predicted_t_iter_s"][1])
    assert one < 0.8 * truth[1]


def test_one_rank_of_horovod_waits_half_its_cycle(tmp_path: Path) -> None:
    # its background thread takes the tensors once per cycle: 1 ms by default, or as set
    assert cycle_wait(_point(tmp_path, 1)) == pytest.approx(0.5e-3)
    told: dict[str, object] = {"environment": {"HOROVOD_CYCLE_TIME": "5"}}
    assert cycle_wait(_point(tmp_path, 1, provenance=told)) == pytest.approx(2.5e-3)
    assert cycle_wait(_point(tmp_path, 1, provenance={"environment": {"HOROVOD_CYCLE_TIME": "x"}})) == 0.5e-3
    assert cycle_wait(_point(tmp_path, 1, backend="mpi", provenance=told)) == 0.0
