"""The lab itself: namespaces, addresses and links made and removed; ranks on different
virtual nodes under srun (Slurm in the namespaces) and mpirun (a remote shell into them)
exchange through the bridge, which their links' byte counters show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbench.testing.mpi import MPI_ENV
from hpcbench.testing.netlab import Lab, LabError
from tests.conftest import skip_unless_required
from tests.net.conftest import NetCluster

PROBE = Path(__file__).with_name("allreduce_probe.py")
BYTES = 8 * 2**20  # all-reduced per rank: each rank's link carries at least this much each way


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _inode(namespace: str) -> int:
    return os.stat(f"/run/netns/{namespace}").st_ino


def test_bad_lab_settings_name_the_field() -> None:
    with pytest.raises(LabError, match="nodes: must be a positive integer"):
        Lab(0)
    with pytest.raises(LabError, match="subnet: not an IPv4 network"):
        Lab(2, subnet="10.231.300.0/24")
    with pytest.raises(LabError, match=r"subnet: 10\.231\.0\.0/30 has room for fewer than 4 nodes"):
        Lab(4, subnet="10.231.0.0/30")
    with pytest.raises(LabError, match="prefix: must be 1-8 lower-case letters"):
        Lab(2, prefix="Bad-Prefix")


def test_lab_is_built_and_removed_even_after_a_crash() -> None:
    if os.geteuid() != 0:
        skip_unless_required("the network lab needs root")
    stale = Lab(2, subnet="10.231.9.0/24", prefix="hbx")
    stale.up()  # never taken down: a crashed run

    def build_and_fail() -> None:
        with Lab(3, subnet="10.231.9.0/24", prefix="hbx") as lab:
            assert {"hbx1", "hbx2", "hbx3"} <= set(_namespaces())
            assert {"hbxbr", "hbx1h", "hbx2h", "hbx3h"} <= _links()
            assert [n.address for n in lab.nodes] == ["10.231.9.2", "10.231.9.3", "10.231.9.4"]
            addr = lab.run(2, ["ip", "-4", "-o", "addr", "show", "dev", "hbx2n"]).stdout
            assert "10.231.9.3/24" in addr
            assert "default via 10.231.9.1" in lab.run(3, ["ip", "route"]).stdout
            shaping = lab.shape(1, 150)
            assert "rate 150Mbit" in lab.run(1, ["tc", "class", "show", "dev", "hbx1n"]).stdout
            assert shaping.tcp_goodput_bytes_per_s == pytest.approx(150e6 / 8 * 1448 / 1514)
            lab.unshape(1)
            assert "htb" not in lab.run(1, ["tc", "qdisc", "show", "dev", "hbx1n"]).stdout
            raise RuntimeError("the body fails")

    with pytest.raises(RuntimeError, match="the body fails"):
        build_and_fail()
    assert not [ns for ns in _namespaces() if ns.startswith("hbx")]
    assert not [dev for dev in _links() if dev.startswith("hbx")]


def _ranks(stdout: str) -> list[dict[str, object]]:
    """Each rank's JSON object. mpirun forwards the ranks' output in chunks of its own: two
    ranks' lines once came joined ('{...}{...}' on one line), so objects are read one after
    another, whatever separates them."""
    decoder, found, text = json.JSONDecoder(), [], stdout
    start = text.find("{")
    while start >= 0:
        obj, end = decoder.raw_decode(text, start)
        found.append(obj)
        start = text.find("{", end)
    return sorted(found, key=lambda r: r["rank"])


def _sent(lab: Lab, nodes: list[int]) -> list[tuple[int, int]]:
    return [(lab.counters(i).tx_bytes, lab.counters(i).rx_bytes) for i in nodes]


@pytest.mark.slurm
@pytest.mark.slow
def test_srun_ranks_on_two_nodes_exchange_through_the_bridge(lab_cluster: NetCluster) -> None:
    lab = lab_cluster.lab
    before = _sent(lab, [1, 2])
    proc = subprocess.run(
        ["srun", "-N2", "-n2", "-w", "c1,c2", "--mpi=pmix", sys.executable, str(PROBE), str(BYTES)],
        capture_output=True, text=True, env=lab_cluster.env(), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = _ranks(proc.stdout)
    assert [r["node"] for r in ranks] == ["c1", "c2"]
    assert [r["netns"] for r in ranks] == [_inode("hbn1"), _inode("hbn2")]
    assert all(r["right"] for r in ranks)
    for (tx0, rx0), (tx1, rx1) in zip(before, _sent(lab, [1, 2]), strict=True):
        assert tx1 - tx0 >= BYTES and rx1 - rx0 >= BYTES


@pytest.mark.mpi
@pytest.mark.slow
def test_mpirun_ranks_in_two_namespaces_exchange_through_the_bridge(lab_cluster: NetCluster, tmp_path: Path) -> None:
    lab = lab_cluster.lab
    before = _sent(lab, [3, 4])
    argv = lab.mpirun_argv([3, 4], 1, [sys.executable, str(PROBE), str(BYTES)], agent_dir=tmp_path)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **MPI_ENV}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = _ranks(proc.stdout)
    assert [r["netns"] for r in ranks] == [_inode("hbn3"), _inode("hbn4")]
    assert all(r["right"] for r in ranks)
    for (tx0, rx0), (tx1, rx1) in zip(before, _sent(lab, [3, 4]), strict=True):
        assert tx1 - tx0 >= BYTES and rx1 - rx0 >= BYTES
