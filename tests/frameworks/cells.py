"""What the framework tests check of every cell's point file, whatever the framework: the
iteration table's phases, the gradient messages against the model's bytes and the iteration's
timeline, and the ranks' agreement on the weights."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hpcbench.frameworks.base import model_for
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo

PHASES = ("data", "h2d", "forward", "backward", "comm", "update")


def gradient_bytes(data: PointData, itemsize: int = 4) -> int:
    """The model's gradient bytes (`itemsize` bytes a parameter; float32 by default): what one
    rank's messages of one op carry per iteration."""
    return itemsize * zoo.count_parameters(model_for(data.point))


def check_phases(data: PointData, iterations: int, timed: Iterable[str], zero: Iterable[str] = ()) -> None:
    """A complete file with `iterations` rows per rank; the `timed` phases took time on every
    rank and iteration, the `zero` ones none; some message time; the phases are disjoint
    parts of the iteration."""
    assert data.complete
    it = data.iterations
    assert it.shape == (data.point.ranks, iterations)
    for phase in timed:
        assert (it[phase] > 0).all(), (data.point.backend, phase)
    for phase in zero:
        assert (it[phase] == 0).all(), (data.point.backend, phase)
    assert (it["comm_total"] > 0).all()
    phases = sum(it[p] for p in PHASES)
    assert (phases <= it["t_end"] - it["t_start"] + 1e-9).all(), "phases are disjoint parts of the iteration"


def check_messages(
    data: PointData, ops: Iterable[str] = ("allreduce",), per_op: int | None = None, itemsize: int = 4
) -> None:
    """Exactly the messages of `ops`; per rank, iteration and op they carry the model's
    gradient bytes (in `per_op` messages, when given), each starting once backward has begun
    (a gradient is ready) and ending by the end of the iteration's comm phase."""
    comm, it, point = data.comm, data.iterations, data.point
    wanted = {op.encode() for op in ops}
    assert set(comm["op"].tolist()) == wanted
    grad_bytes = gradient_bytes(data, itemsize)
    for rank in range(point.ranks):
        for i in range(it.shape[1]):
            mine = comm[(comm["rank"] == rank) & (comm["iteration"] == i)]
            for op in wanted:
                of_op = mine[mine["op"] == op]
                assert int(of_op["bytes"].sum()) == grad_bytes, (point.backend, rank, i, op)
                assert per_op is None or len(of_op) == per_op, (point.backend, rank, i, op, len(of_op))
            assert (mine["t_end"] >= mine["t_start"]).all()
            row = it[rank, i]
            backward_begins = row["t_start"] + row["data"] + row["h2d"] + row["forward"]
            comm_ends = backward_begins + row["backward"] + row["comm"]
            assert (mine["t_start"] >= backward_begins - 1e-6).all(), (point.backend, rank, i)
            assert (mine["t_end"] <= comm_ends + 1e-6).all(), (point.backend, rank, i)


def check_weights_agree(data: PointData) -> None:
    """Every rank evaluated, and all hold the same weights afterwards."""
    ev = data.eval
    assert sorted(ev["rank"].tolist()) == list(range(data.point.ranks))
    assert np.isfinite(ev["param_checksum"]).all()
    assert len(set(ev["param_checksum"].tolist())) == 1, "weights identical on every rank"


def check_learns_tokens(data: PointData, window: int = 5) -> None:
    """A sequence model learnt on every rank: the mean loss of the last `window` iterations is
    below that of the first `window`; the held-out loss is finite and every rank tested
    tokens (no accuracy: a sequence model's test is its loss, i.e. its perplexity)."""
    it, ev = data.iterations, data.eval
    first = it["loss"][:, :window].mean(axis=1)
    last = it["loss"][:, -window:].mean(axis=1)
    assert (last < first).all(), (data.point.backend, first, last)
    assert np.isfinite(ev["loss"]).all() and (ev["total"] == 0).all(), ev
