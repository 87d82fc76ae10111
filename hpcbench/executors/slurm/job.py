"""What a batch job runs on its nodes (submitit pickles these functions into the job).

`run_rank` is one rank: Slurm started it as a task (launcher `srun`). `run_launcher` runs
the point's launcher (`mpirun`, `torchrun`, `horovodrun`) once per job or per node, with
what only the running job knows: its hosts and a rendezvous address on its first node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpcbench import worker
from hpcbench.errors import HpcbenchError
from hpcbench.plan import launch as plan
from hpcbench.plan import profiles
from hpcbench.sweepdir.layout import SweepDir
from hpcbench.sweepdir.runfile import RunFile

RENDEZVOUS_PORT_BASE = 20000


def run_rank(run_file: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    worker.run(Path(run_file))


def job_hosts() -> tuple[str, ...]:
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return ()
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return tuple(out.stdout.split())


def node_address(node: str) -> str:
    """The address Slurm reaches `node` at (NodeAddr; the name itself on most clusters)."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=False)
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


def run_launcher(run_file: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    path = Path(run_file)
    run = RunFile.load(path)
    profile = profiles.from_dict(run.profile) if run.profile else profiles.load(None)
    hosts = job_hosts()
    job_id = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    rendezvous = f"{node_address(hosts[0]) if hosts else '127.0.0.1'}:{RENDEZVOUS_PORT_BASE + job_id % 20000}"
    sweep_dir = SweepDir.of_run_file(path).root
    ctx = plan.context(run.point, sweep_dir, profile, local=False, rendezvous=rendezvous, hosts=hosts)
    launch = plan.launch(run.point, ctx, profile)
    print("+ " + " ".join(launch.argv), flush=True)
    rc = subprocess.run(launch.argv, env={**os.environ, **launch.env}, check=False).returncode
    if rc != 0:
        raise HpcbenchError(f"{launch.argv[0]} exited with status {rc} on {os.uname().nodename}")
    sys.stdout.flush()
