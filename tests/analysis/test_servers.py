"""Parameter-server backends in sweep predictions (hpcbench.analysis.model.servers), against numbers
worked out by hand: the step cost of a push and a pull through S servers, the link read back
from recorded transfers, and leave-one-scale-out on a sweep of pushes and pulls that follows
the model exactly."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.analysis import pipeline
from hpcbench.analysis.model.collectives import LinkCost, MessageCost, ModelError
from hpcbench.analysis.model.servers import Servers, link_from_transfers, servers_of
from hpcbench.spec import Point
from hpcbench.store.traits import Traits, legacy
from hpcbench.testing.arrays import comm_rows, iterations
from hpcbench.testing.fabricate import write_point_file

ALPHA, BETA = 3e-4, 2e-9  # a transfer's latency (s) and seconds per byte on the servers' link
BYTES = (4e5, 1e6)  # tensors of layer 1 and layer 2 (layer 2's gradient is ready first)
TB = (0.030, 0.040)  # backward of layer 1, layer 2: longer than any push and pull below
FORWARD, UPDATE = 0.010, 0.002


def _of(framework: str, backend: str, **extra: int | bool) -> Servers | None:
    """The servers of a point of that name whose file recorded no traits (store/traits.legacy)."""
    point = Point(framework=framework, backend=backend, extra=tuple(extra.items()))
    return servers_of(point, legacy(framework, backend, point.launcher))


def test_servers_of_a_point() -> None:
    assert _of("torch", "gloo") is None
    assert _of("mxnet", "dist_sync") == Servers(1, True)
    assert _of("mxnet", "dist_async", servers=2) == Servers(2, False)
    assert _of("tensorflow", "ps") == Servers(1, False)  # TensorFlow: async unless
    assert _of("tensorflow", "ps", sync=True) == Servers(1, True)
    with pytest.raises(ModelError, match="needs >= 1 server"):
        _of("tensorflow", "ps", servers=0)
    # what decides is the traits the point recorded, not its backend's name
    assert servers_of(Point(framework="mxnet", backend="dist_sync"), Traits()) is None
    assert servers_of(Point(framework="torch", backend="gloo"), Traits(parameter_server=True)) == Servers(1, True)
    assert servers_of(Point(), Traits(parameter_server=True, asynchronous=True)) == Servers(1, False)


def test_step_cost_and_link_from_transfers() -> None:
    link = LinkCost(ALPHA, BETA)
    # synchronous: 4 workers' transfers cross 2 servers' links together: share 2
    assert Servers(2, True).step_cost(1e6, 4, link) == pytest.approx(2 * ALPHA + 2 * 2 * 1e6 * BETA)
    # asynchronous: a worker waits for its own transfers only: share 1/2
    assert Servers(2, False).step_cost(1e6, 4, link) == pytest.approx(2 * ALPHA + 2 * 0.5 * 1e6 * BETA)
    # one worker still crosses to the servers: not zero, unlike a ring
    assert Servers(1, True).step_cost(1e6, 1, link) == pytest.approx(2 * ALPHA + 2 * 1e6 * BETA)
    # transfers fitted at 4 synchronous workers on one server give the link back
    back = link_from_transfers(MessageCost(ALPHA, 4 * BETA), Servers(1, True), 4)
    assert (back.alpha, back.beta) == pytest.approx((ALPHA, BETA))


def transfer(n: float, workers: int) -> float:
    return ALPHA + workers * n * BETA  # one synchronous server: every worker's transfer at once


def server_point(directory: Path, workers: int) -> float:
    """MXNet dist_sync on one server: each gradient is pushed when ready, then pulled; every
    push and pull ends before the next gradient is ready, so only the last tensor's (layer
    1's) push and pull are exposed."""
    t1, t2 = transfer(BYTES[0], workers), transfer(BYTES[1], workers)
    exposed = 2 * t1
    it = iterations(workers, 12, warmup=2, forward=FORWARD, backward=sum(TB), comm=exposed, update=UPDATE)
    rows = []
    for r in range(workers):
        for i in range(12):
            start = it["t_start"][r, i] + FORWARD
            for ready, t, n in ((start + TB[1], t2, BYTES[1]), (start + TB[1] + TB[0], t1, BYTES[0])):
                rows.append((r, i, int(n), ready, ready + t, b"push"))
                rows.append((r, i, int(n), ready + t, ready + 2 * t, b"pull"))
    comm = np.concatenate([comm_rows([row[:5]], op=row[5]) for row in rows])
    comm["name"] = [f"t{k % 4 // 2}".encode() for k in range(len(comm))]
    point = Point(framework="mxnet", backend="dist_sync", model="mlp", ranks_per_node=workers, batch_size=8)
    write_point_file(directory / f"{point.id}.h5", point, it, comm=comm)
    return FORWARD + sum(TB) + exposed + UPDATE


def test_held_out_pushes_and_pulls(tmp_path: Path) -> None:
    """Every scale held out is predicted exactly: 1 worker from 2 and 4 (the link from 2
    workers' transfers), 2 from 1 and 4 and 4 from 1 and 2 (the link from one worker's
    transfers: a ring would have none to fit)."""
    assert 2 * transfer(BYTES[1], 4) < TB[0]  # the premise: no push waits for an earlier pull
    truth = {n: server_point(tmp_path, n) for n in (1, 2, 4)}
    analysis = pipeline.analyse(tmp_path)
    held = analysis.held_out.set_index("ranks")
    for n in (1, 2, 4):
        assert held.loc[n, "predicted_t_iter_s"] == pytest.approx(truth[n], rel=1e-6), n
    pred = analysis.predictions.set_index("ranks")
    assert "parameter servers: 1 (sync)" in str(pred.loc[4, "comm_source"])
    # in-sample: the exchange at one worker is its last tensor's push and pull, not zero
    assert pred.loc[1, "pred_comm_exposed_s"] == pytest.approx(2 * transfer(BYTES[0], 1), rel=1e-6)


def test_one_oversubscribed_worker_calibrates_the_servers_link(tmp_path: Path) -> None:
    """A one-worker point whose threads outnumber the host's CPUs: its transfers are the
    link's, divided by the oversubscription (no ring steps to take a scheduling wait from)."""
    for n in (1, 2, 4):
        server_point(tmp_path, n)
    for path in tmp_path.glob("*.h5"):  # 3 threads per rank on 2 CPUs: every point oversubscribed
        with h5py.File(path, "r+") as f:
            f["provenance"].attrs["cpu_count"] = 2
            f["provenance"].attrs["environment"] = '{"OMP_NUM_THREADS": "3"}'
    analysis = pipeline.analyse(tmp_path)
    pred = analysis.predictions.set_index("ranks")
    assert "1.5x oversubscribed" in str(pred.loc[4, "comm_source"])
    assert pred.loc[1, "alpha_s"] == pytest.approx(ALPHA / 1.5, rel=1e-6)
