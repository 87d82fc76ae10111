"""The network lab for the tests: four virtual nodes in their own network namespaces on a
bridge (hpcbench.testing.netlab), and a real Slurm cluster whose node cI runs its slurmd in
namespace I (slurm/testcluster/start.sh --netns), started once per session and stopped with
the lab at the end. Its state dir and ports are its own: it runs beside the main test
cluster (tests/slurm, port base 17800)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcbench.testing.netlab import Lab
from tests.conftest import ROOT, skip_unless_required

NODES = 4
SUBNET = "10.231.0.0/24"
PREFIX = "hbn"
STATE_DIR = "/tmp/hpcbench-slurm-netlab"
PORT_BASE = "18400"
TESTCLUSTER = ROOT / "slurm" / "testcluster"


@dataclass(frozen=True)
class NetCluster:
    lab: Lab
    conf: str  # its SLURM_CONF

    def env(self) -> dict[str, str]:
        """The environment for this cluster's clients (srun, sbatch, the sweep command)."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**clean, "SLURM_CONF": self.conf, "HPCBENCH_SLURM_DIR": STATE_DIR}

    def profile(self, directory: Path) -> Path:
        """A site profile for sweeps on this cluster: srun through PMIx, mpirun's and gloo's
        traffic on the lab's subnet (the main test cluster's profile pins them to lo)."""
        path = directory / "netlab.yaml"
        path.write_text(
            "description: the network lab's Slurm cluster (nodes in their own namespaces)\n"
            "srun_args: [--mpi=pmix]\n"
            f"mpirun_args: [--mca, btl, 'self,tcp', --mca, btl_tcp_if_include, '{SUBNET}',"
            f" --mca, oob_tcp_if_include, '{SUBNET}']\n"
            "env: {OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1'}\n"
            "slurm: {partition: debug, time: 10, signal_delay_s: 5}\n"
        )
        return path


def _needs_root() -> None:
    if os.geteuid() != 0:
        skip_unless_required("the network lab needs root (network namespaces, veth pairs, tc)")


@pytest.fixture(scope="session")
def lab_cluster() -> Iterator[NetCluster]:
    _needs_root()
    env = {**os.environ, "HPCBENCH_SLURM_DIR": STATE_DIR, "HPCBENCH_SLURM_PORT_BASE": PORT_BASE}
    stop = ["bash", str(TESTCLUSTER / "stop.sh"), "-d", STATE_DIR, "--purge"]
    with Lab(NODES, subnet=SUBNET, prefix=PREFIX) as lab:
        try:
            proc = subprocess.run(
                ["bash", str(TESTCLUSTER / "start.sh"), "-n", str(NODES), "--fresh", "--netns", PREFIX],
                capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            assert proc.returncode == 0, f"the lab's cluster did not start:\n{proc.stderr[-3000:]}"
            yield NetCluster(lab, proc.stdout.strip().removeprefix("export SLURM_CONF="))
        finally:
            subprocess.run(stop, capture_output=True, env=env, timeout=180)
