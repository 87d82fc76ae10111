"""The model's held-out prediction on the network lab: synthetic points (sleep-based compute,
one real 2 MiB all-reduce per iteration) on 1, 2, 3 and 4 lab nodes, one rank per node, every
link shaped to RATE_MBIT; `hpcbench predict` on a sweep directory holding only the 1- and
2-node points predicts the 3- and 4-node points' t_iter within 10 % of what they measure.

At RATE_MBIT the all-reduce takes 110-180 ms on the link against 50 ms of compute, so the
link, not the loaded CPU, sets t_iter; Open MPI's all-reduce is pinned to the ring at every
rank count (hpcbench.testing.heldout.RING_MCA), the algorithm the model assumes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbench.testing.heldout import Workload, held_out
from hpcbench.testing.netlab import Lab
from tests.conftest import skip_unless_required

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

RATE_MBIT = 150
NODES = 4
WORK = Workload(forward_s=0.02, backward_s=0.03, comm_bytes=2 * 1024 * 1024, iterations=24, warmup=3)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        skip_unless_required("the network lab needs root and iproute2")
    with Lab(nodes=NODES, subnet="10.234.0.0/24", prefix="hbp") as lab:
        for i in range(1, NODES + 1):
            lab.shape(i, RATE_MBIT)
        yield lab


@pytest.mark.quiet  # measured times against the model: no other test's load beside them
def test_calibrated_on_two_nodes_the_model_predicts_three_and_four(lab: Lab, tmp_path: Path) -> None:
    result = held_out(lab, tmp_path, [1, 2], [3, 4], WORK)
    print(result.report)
    measured, predicted = result.measured, result.predicted
    assert sorted(measured) == [1, 2, 3, 4] and sorted(predicted) == [3, 4], (measured, predicted)
    # calibrated on the 1- and 2-node points only
    assert "N=2" in result.comm_source, result.comm_source
    # the shaped link sets t_iter: at 4 nodes most of it is the all-reduce (not the compute)
    compute = WORK.forward_s + WORK.backward_s
    assert measured[4] - compute > 0.6 * measured[4], measured
    for nodes in (3, 4):
        error = result.errors[nodes]
        print(f"{nodes} nodes: measured {measured[nodes] * 1e3:.1f} ms, predicted {predicted[nodes] * 1e3:.1f} ms, "
              f"error {error:+.1%}")  # fmt: skip
        assert abs(error) < 0.10, (nodes, measured, predicted)
