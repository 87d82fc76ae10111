"""The link model checked on the lab: every node's link shaped to RATE_MBIT, Open MPI's
all-reduce pinned to the ring (the algorithm the model assumes) and two TCP connections per
pair of ranks; commbench between two nodes (mpirun through the lab's remote shell): the fitted
β is 1 / (the link's TCP goodput: the rate less the TCP/IP and Ethernet headers of a full
frame, netlab.TCP_PAYLOAD_FRACTION), within 10 %. At RATE_MBIT an 8 MiB all-reduce takes
about 0.5 s on the link, against milliseconds of CPU for the reduction and TCP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbench.analysis.model.linkfit import link_from_commbench
from hpcbench.testing.mpi import MPI_ENV
from hpcbench.testing.netlab import TCP_PAYLOAD_FRACTION, Shaping
from tests.net.conftest import NODES, NetCluster

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

RATE_MBIT = 150
# Open MPI: the ring all-reduce, and two TCP connections per pair of ranks (with one, two ranks
# sending to each other at once reached half the rate in about three runs of four).
RING = {
    "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
    "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
    "OMPI_MCA_btl_tcp_links": "2",
}


@pytest.fixture(scope="module")
def shaped(lab_cluster: NetCluster) -> Iterator[Shaping]:
    lab = lab_cluster.lab
    shaping = {i: lab.shape(i, RATE_MBIT) for i in range(1, NODES + 1)}
    yield shaping[1]
    for i in shaping:
        lab.unshape(i)


@pytest.mark.quiet  # a fitted rate: the ranks' TCP progress must not starve for CPU
def test_commbench_between_two_nodes_fits_the_shaped_rate(
    lab_cluster: NetCluster, shaped: Shaping, tmp_path: Path
) -> None:
    out = tmp_path / "inter.h5"
    exports = [arg for name in RING for arg in ("-x", name)]
    commbench = ["-m", "hpcbench.commbench", "--sizes", "1M,2M,4M,8M", "--iters", "4", "--warmup", "1", "-o", str(out)]
    argv = lab_cluster.lab.mpirun_argv([1, 2], 1, [*exports, sys.executable, *commbench], agent_dir=tmp_path)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **MPI_ENV, **RING}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    link = link_from_commbench([out])
    goodput = shaped.tcp_goodput_bytes_per_s
    fitted = f"fitted {8 / link.beta / 1e6:.1f} Mbit/s, ratio {1 / link.beta / goodput:.3f}"
    print(f"netlab: rate {RATE_MBIT} Mbit/s, {fitted}")
    assert 1 / link.beta == pytest.approx(goodput, rel=0.10), (
        f"fitted {8 / link.beta / 1e6:.1f} Mbit/s of TCP payload, link goodput {8 * goodput / 1e6:.1f} Mbit/s "
        f"({RATE_MBIT} Mbit/s × {TCP_PAYLOAD_FRACTION:.3f})"
    )
