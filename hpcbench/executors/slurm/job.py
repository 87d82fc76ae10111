"""What a batch job runs on its nodes (submitit pickles these functions into the job).

Each is given the point's launch as the plan built it (`Launch.to_json`). `run_rank` is one
rank: Slurm started it as a task (launcher `srun`). `run_launcher` runs the point's launcher
(`mpirun`, `torchrun`, `horovodrun`) once per job or per node, its launch's slots filled with
what only the running job knows: its hosts, a rendezvous address on its first node, and the
cores of the node it runs on.

Signals: submitit's own handlers, set before these functions run, ignore SIGTERM and answer
SIGUSR2 by raising (time limit) or by requeueing the job itself (rank 0). Neither may reach
the ranks' stop (rank/stop.py): `run_rank` puts the defaults back and the worker replaces
them with its own as soon as it starts; `run_launcher` notes the signals and waits for its
launcher, which Slurm signals too (it is in the same step) and which passes them on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hpcbench import worker
from hpcbench.errors import HpcbenchError
from hpcbench.plan import launch as plan
from hpcbench.rank.stop import EXIT_CODE, STOP_SIGNALS, TIME_LIMIT_SIGNAL_ENV

RENDEZVOUS_PORT_BASE = 20000
# mpirun's (and its daemons') wait between the SIGTERM it passes to its ranks and SIGKILL
# (1 s by default): long enough for the ranks to stop together and write; Slurm's KillWait
# bounds it in any case.
MPIRUN_KILL_GRACE = {"OMPI_MCA_odls_base_sigkill_timeout": "30"}


def time_limit_signal() -> str:
    """The signal the job gets ahead of its time limit (`--signal`, submitit's USR_SIG: USR2)."""
    from submitit.core.job_environment import JobEnvironment

    return str(JobEnvironment.USR_SIG)


def run_rank(launch_json: str) -> None:
    launch = plan.Launch.from_json(launch_json)
    _, env = launch.bind({})  # Slurm started this rank: its launch has nothing left to fill in
    os.environ.update(env)
    os.environ.setdefault(TIME_LIMIT_SIGNAL_ENV, time_limit_signal())
    for sig in STOP_SIGNALS:  # not submitit's: see the module's docstring
        signal.signal(sig, signal.SIG_DFL)
    code = worker.run(Path(launch.run_file))
    if code:  # stopped on a signal, every row kept: the job ends with the worker's exit code
        sys.stdout.flush()
        sys.exit(code)


def _note_signal(signum: int, frame: object) -> None:
    print(f"hpcbench.job: signal {signum} passed on to the launcher's ranks", file=sys.stderr, flush=True)


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


def run_launcher(launch_json: str) -> None:
    launch = plan.Launch.from_json(launch_json)
    hosts = job_hosts()
    job_id = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    rendezvous = f"{node_address(hosts[0]) if hosts else '127.0.0.1'}:{RENDEZVOUS_PORT_BASE + job_id % 20000}"
    argv, env = launch.bind(plan.job_values(launch.point, hosts, rendezvous, os.cpu_count() or 1))
    print("+ " + " ".join(argv), flush=True)
    for sig in STOP_SIGNALS:  # not submitit's, which would raise here and SIGKILL the launcher
        signal.signal(sig, _note_signal)
    env = {**os.environ, **MPIRUN_KILL_GRACE, TIME_LIMIT_SIGNAL_ENV: time_limit_signal(), **env}
    rc = subprocess.run(argv, env=env, check=False).returncode
    if rc == EXIT_CODE:
        print(f"{argv[0]}: the ranks stopped on a signal, every row kept", file=sys.stderr, flush=True)
        sys.exit(rc)
    if rc != 0:
        raise HpcbenchError(f"{argv[0]} exited with status {rc} on {os.uname().nodename}")
    sys.stdout.flush()
