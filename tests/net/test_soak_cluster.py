"""Soak on the network lab's Slurm cluster: a stream of short 2-node srun points (one rank
per virtual node, a real 1 KiB all-reduce per iteration over the lab's bridge) submitted as
one sweep that runs them one after another, while a striker thread hits a running rank, or
the node it runs on, at random moments (start-up, the loop, a flush, a stop, between points):

* SIGTERM to the rank (its peers stop with it, every row kept) or SIGKILL (the job fails);
* `scontrol update state=down` of its node (Slurm requeues the job; the node is resumed
  once the job's steps there have ended);
* its node's link down for a short blip (BLIP_S, well inside the stall timeout once TCP's
  retransmissions resume: the point rides it out) or for an outage (OUTAGE_S, longer than
  the watchdog's limit, probe and grace: the point fails, naming the stall).

Links and nodes are restored, then, whatever happened: every point is `done`, `stopped` or
`failed` with a reason naming its log; every file of every run (the result and the
attempts kept aside) holds, for a stopped run, every row of both ranks up to one common
iteration, else every flushed block, all rows valid, and at least as many rows as were
flushed when a strike landed; no complete run's loop ran through an outage of one of its
nodes; a point struck only by blips (and no node or link failure while it ran) is done; no
rank or step daemon is left; and `resume` completes every point that was not done.
HPCBENCH_NET_SOAK_POINTS=N runs N points instead of 3 (a longer soak).

Each job has a time limit of LIMIT_MIN: a rank that dies while a peer's node is cut off can
leave srun waiting for good for that peer's task-exit message, which its slurmstepd sent
into the outage and never sends again; the limit ends such a job (`Slurm state TIMEOUT`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

from hpcbench.store import schema
from hpcbench.store.reader import PointData, read_point
from hpcbench.sweepdir.manifest import ACTIVE, DONE, FAILED, STOPPED, Entry, Manifest
from hpcbench.testing.crash import BATCH, FLUSH_EVERY, SUBMITIT_TASK, WORKER, check_rows, rank_pids
from hpcbench.testing.faults import Fault, Faults
from tests.conftest import ROOT
from tests.net.conftest import NODES, NetCluster

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

POINTS = int(os.environ.get("HPCBENCH_NET_SOAK_POINTS", "3"))
ITERATIONS = 600  # of at least FORWARD_S each: a point's loop lasts at least 6 s
FORWARD_S = 0.01
STALL_S = 10.0
# A blip: TCP retransmits after 0.2, 0.6, 1.4, 3.0, 6.2 s, so traffic resumes within 6.2 s of
# the start of a blip of up to 3 s, well inside STALL_S. An outage outlasts what the watchdog
# allows a stall: STALL_S, its period (1 s), the peers' probe (3 s) and its grace (5 s).
BLIP_S = (1.0, 3.0)
OUTAGE_S = (25.0, 35.0)
PAUSE_S = (1.0, 6.0)  # between strikes
KINDS = {"SIGTERM": 3, "SIGKILL": 1, "node down": 1, "link blip": 2, "link outage": 1}
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
# Strikes that end the run: it is struck no more. (A rank killed while its peer's node is cut
# off, or cut off while its peer dies, can leave srun waiting for good: see the time limit.)
FATAL = ("SIGKILL", "node down", "link outage")
LIMIT_MIN = 1  # ends a job Slurm cannot end otherwise (see the module doc)
STREAM_S = 240 + 150 * POINTS  # the stream's bound, a loaded 2-core machine included
RESUME_S = 120 + 40 * POINTS
SETTLE_S = 120  # for the cluster to settle once the faults are lifted (ranks gone, nodes back)


@dataclass(frozen=True)
class Rank:
    """A live rank of the sweep: its process, its job (the manifest's job id and Slurm's own
    id: they differ for an array task) and its node."""

    pid: int
    job: str
    job_id: str
    node: str


@dataclass(frozen=True)
class Strike:
    kind: str
    job: str
    node: str
    at: float  # time.time() when it struck
    seconds: float = 0.0  # how long a link stays down
    epoch_ns: int = 0  # the struck run's file (its epoch_ns) and the rows it held then (0: no file yet)
    flushed: int = 0


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def live_ranks(out: Path) -> list[Rank]:
    """The sweep's running ranks (submitit's task processes, into which srun starts each rank)."""
    ranks = []
    for pid in rank_pids(out, SUBMITIT_TASK):
        try:
            env = _environ(pid)
        except OSError:  # ended meanwhile
            continue
        job_id = env.get("SLURM_JOB_ID", "")
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        job = f"{array}_{task}" if array and task else job_id
        if job and env.get("SLURMD_NODENAME"):
            ranks.append(Rank(pid, job, job_id, env["SLURMD_NODENAME"]))
    return ranks


def _netns(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def step_daemons(job_id: str, namespaces: set[int]) -> list[int]:
    """The live slurmstepd processes of Slurm job `job_id` (titled `slurmstepd: [JOB.STEP]`)
    whose node is one of the lab's (its network namespace is in `namespaces`)."""
    title = f"slurmstepd: [{job_id}.".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "cmdline").read_bytes().startswith(title)
                and _netns(proc.name) in namespaces
            ):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def flushed_now(result: Path) -> tuple[int, int]:
    """(epoch_ns, iterations_written) of a running point's file; (0, 0) while there is none."""
    try:  # without HDF5's file lock, which the running writer holds
        with h5py.File(result, "r", locking=False) as f:
            return int(f.attrs.get("epoch_ns", 0)), int(f.attrs.get("iterations_written", 0))
    except (OSError, KeyError, ValueError, RuntimeError):  # not there yet, or being created
        return 0, 0


class Striker:
    """Strikes a live rank of the sweep, or its node, every PAUSE_S until stopped, at most one
    node or link fault at a time; notes the jobs that ran while a node was down or a link out."""

    def __init__(self, cluster: NetCluster, faults: Faults, out: Path, rng: random.Random) -> None:
        self.cluster, self.faults, self.out, self.rng = cluster, faults, out, rng
        self.env = cluster.env()
        self.struck: list[Strike] = []
        self.exposed: set[str] = set()  # jobs that ran while a node was down or a link out
        self.downed: set[str] = set()  # nodes set DOWN, not resumed yet
        self.link: Fault | None = None  # the last link fault (blip or outage)
        self.outage: Fault | None = None  # the last outage
        self.doomed: set[int] = set()  # ranks of runs already struck down: left to end alone
        self.healers: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.until = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-striker")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Strike no more; wait until the nodes set DOWN are resumed."""
        self.until.set()
        self.thread.join()
        for healer in self.healers:
            healer.join()

    def _slurm(self, *argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60, check=False).stdout

    def _faulted(self, blips: bool = True) -> bool:
        """A node is down or a link out (with `blips`: for a blip too)."""
        with self.lock:
            link = self.link if blips else self.outage
            return bool(self.downed) or (link is not None and link.active)

    def _run(self) -> None:
        next_at = time.monotonic() + self.rng.uniform(*PAUSE_S)
        while not self.until.wait(0.5):
            if self._faulted(blips=False):
                self.exposed.update(self._slurm("squeue", "-h", "-r", "-t", "R,CG,CF", "-o", "%i").split())
            if time.monotonic() < next_at:
                continue
            next_at = time.monotonic() + self.rng.uniform(*PAUSE_S)
            ranks = live_ranks(self.out)
            if live := [r for r in ranks if r.pid not in self.doomed]:
                self._strike(self.rng.choice(live), ranks)

    def _strike(self, rank: Rank, ranks: list[Rank]) -> None:
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind not in SIGNALS and self._faulted():
            kind = self.rng.choice(list(SIGNALS))
        if kind in FATAL:
            self.doomed.update(r.pid for r in ranks if r.job == rank.job)
        entry = next((e for e in Manifest.load(self.out).entries.values() if e.job_id == rank.job), None)
        epoch, flushed = flushed_now(self.out / entry.result) if entry is not None else (0, 0)
        seconds = 0.0
        if kind in SIGNALS:
            try:
                os.kill(rank.pid, SIGNALS[kind])
            except ProcessLookupError:
                return
        elif kind == "node down":
            with self.lock:
                self.downed.add(rank.node)
            self.exposed.add(rank.job)
            self._slurm("scontrol", "update", f"nodename={rank.node}", "state=down", "reason=soak")
            healer = threading.Thread(target=self._heal, args=(rank,), name=f"soak-heal-{rank.node}")
            self.healers.append(healer)
            healer.start()
        else:
            seconds = self.rng.uniform(*(BLIP_S if kind == "link blip" else OUTAGE_S))
            if kind == "link outage":
                self.exposed.add(rank.job)
            with self.lock:
                self.link = self.faults.link_down(node_index(rank.node), seconds=seconds)
                if kind == "link outage":
                    self.outage = self.link
        self.struck.append(Strike(kind, rank.job, rank.node, time.time(), seconds, epoch, flushed))

    def _heal(self, rank: Rank) -> None:
        """Resume a node set DOWN once the struck job's steps there have ended (a rerun of the
        job meeting them could have its step killed by theirs), then let a requeued job start
        now rather than after the hold Slurm may give it."""
        namespace = {os.stat(self.cluster.lab.node(node_index(rank.node)).netns_path).st_ino}
        deadline = time.monotonic() + SETTLE_S
        while step_daemons(rank.job_id, namespace) and time.monotonic() < deadline:
            time.sleep(0.5)
        self._slurm("scontrol", "update", f"nodename={rank.node}", "state=resume")
        with self.lock:
            self.downed.discard(rank.node)
        if self._slurm("squeue", "-h", "-j", rank.job, "-o", "%T %r").split() == ["PENDING", "BeginTime"]:
            self._slurm("scontrol", "update", f"jobid={rank.job}", "starttime=now")


def node_index(node: str) -> int:
    """The lab's node that Slurm's node cI runs on: I."""
    return int(node.removeprefix("c"))


def lab_namespaces(cluster: NetCluster) -> set[int]:
    return {os.stat(n.netns_path).st_ino for n in cluster.lab.nodes}


def sweep(cluster: NetCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The sweep command, with the lab cluster's environment."""
    argv = [sys.executable, "-m", "hpcbench.sweep", *args]
    return subprocess.run(argv, cwd=ROOT, env=cluster.env(), capture_output=True, text=True, timeout=timeout)


def follow(cluster: NetCluster, out: Path, timeout: float) -> list[Entry]:
    """`status` (which refreshes the manifest from Slurm) until no point is queued or running;
    a failing `status` (Slurm's accounting lagging, a loaded machine) is asked again."""
    deadline = time.monotonic() + timeout
    while True:
        res = sweep(cluster, "status", str(out))
        entries = list(Manifest.load(out).entries.values())
        if not any(e.state in ACTIVE for e in entries):
            return entries
        assert time.monotonic() < deadline, f"the sweep did not end in {timeout:.0f} s:\n{res.stdout}{res.stderr}"
        time.sleep(1)


def settle(cluster: NetCluster, out: Path) -> None:
    """Every node back in service (resumed where Slurm or a strike left it down), and no rank,
    step daemon or job of the sweep left."""
    env, namespaces = cluster.env(), lab_namespaces(cluster)
    deadline = time.monotonic() + SETTLE_S
    while True:
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env)
        states = dict(line.split() for line in nodes.stdout.splitlines() if line.strip())
        for node, state in states.items():
            if state.startswith(("down", "drain")):
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, check=False)
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, env=env).stdout
        ranks, workers = rank_pids(out, SUBMITIT_TASK), rank_pids(out, WORKER)
        daemons = [pid for pid in Path("/proc").iterdir() if _is_step_daemon(pid, namespaces)]
        up = len(states) == NODES and all(s in ("idle", "mixed", "allocated", "completing") for s in states.values())
        if up and not queue.strip() and not ranks and not workers and not daemons:
            return
        assert time.monotonic() < deadline, (
            f"left behind: nodes {states}, jobs {queue.split()}, ranks {ranks + workers}, step daemons {daemons}"
        )
        time.sleep(0.5)


def _is_step_daemon(proc: Path, namespaces: set[int]) -> bool:
    try:
        return (
            proc.name.isdigit()
            and (proc / "cmdline").read_bytes().startswith(b"slurmstepd:")
            and (_netns(proc.name) in namespaces)
        )
    except OSError:
        return False


def point_files(out: Path, entry: Entry) -> list[Path]:
    """The point's result and the earlier attempts kept aside."""
    return sorted([*out.glob(f"{entry.id}.h5"), *out.glob(f"{entry.id}.attempt*.h5")])


def check_file(path: Path) -> PointData:
    """A complete file holds every row; a stopped one every row of both ranks up to one common
    iteration; any other one every flushed block. All rows valid, in order."""
    data = read_point(path)
    if data.complete:
        assert data.iterations.shape == (2, ITERATIONS), path
    elif data.stopped:
        assert data.attrs["stop_reason"], path
    else:
        assert data.status in (schema.STATUS_RUNNING, schema.STATUS_FAILED), (path, data.status)
    check_rows(data, stopped=data.complete or data.stopped)
    assert (np.diff(data.iterations["t_start"], axis=1) > 0).all(), path
    assert np.isfinite(data.iterations["loss"]).all(), path
    return data


def wall(data: PointData, t: np.ndarray) -> np.ndarray:
    """Seconds on the point's clock as wall-clock time (time.time())."""
    return t + int(data.attrs["epoch_ns"]) / 1e9


def spec_yaml(profile: Path) -> str:
    """One sweep of POINTS same-shape points: one job array whose tasks run one at a time."""
    spec: dict[str, Any] = {
        "name": "netsoak", "executor": "slurm", "profile": str(profile),
        "matrix": {"seed": list(range(POINTS))},
        "fixed": {"framework": "synthetic", "backend": "none", "model": "sleep", "launcher": "srun",
                  "nodes": 2, "ranks_per_node": 1, "iterations": ITERATIONS, "warmup": 0, "batch_size": BATCH,
                  "extra": {"forward_s": FORWARD_S, "comm_bytes": 1024},
                  "slurm": {"array_parallelism": 1, "time": LIMIT_MIN}},
        "options": {"flush_every": FLUSH_EVERY, "stall_timeout_s": STALL_S, "sample_period_s": 0.05},
    }  # fmt: skip
    return yaml.safe_dump(spec)


@pytest.fixture
def faults(lab_cluster: NetCluster) -> Iterator[Faults]:
    with Faults(lab_cluster.lab) as faults:
        yield faults


def check_entries(out: Path, entries: list[Entry]) -> dict[int, PointData]:
    """Every point ended with a reason naming its log (unless done), and every file of every
    run holds its rows (check_file); those files by their epoch_ns (one per run)."""
    assert len(entries) == POINTS, [e.id for e in entries]
    files = {}
    for e in entries:
        assert e.state in (DONE, STOPPED, FAILED), (e.id, e.state, e.reason)
        result = out / e.result
        if e.state != DONE:
            assert e.reason and e.log in e.reason, e.reason
        if e.state == DONE:
            assert read_point(result).complete, e.id
        elif e.state == STOPPED:
            assert read_point(result).stopped, e.reason
        elif result.exists():  # failed: the file says so (or `running`: killed before it could write it)
            assert read_point(result).status in (schema.STATUS_RUNNING, schema.STATUS_FAILED), e.reason
        for path in point_files(out, e):
            data = check_file(path)
            files[int(data.attrs["epoch_ns"])] = data
    return files


def check_strikes(out: Path, entries: list[Entry], files: dict[int, PointData], striker: Striker) -> None:
    """No row flushed before a strike is lost; no complete loop ran through an outage of its
    node; a point struck by blips alone (no node or link failure while it ran) is done."""
    by_job = {e.job_id: e for e in entries}
    for s in striker.struck:
        if s.epoch_ns:  # the struck run's file holds at least what it held then
            assert s.epoch_ns in files, f"{s}: the struck run's file is gone"
            kept = int(files[s.epoch_ns].attrs["iterations_written"])
            assert kept >= s.flushed, f"{s}: {kept} rows kept of {s.flushed} flushed"
        entry = by_job[s.job]
        if s.kind == "link outage" and entry.state == DONE:  # a later run, or one whose loop was over
            data = read_point(out / entry.result)
            starts, ends = wall(data, data.iterations["t_start"]), wall(data, data.iterations["t_end"])
            assert not (starts.min() < s.at and ends.max() > s.at + s.seconds), f"{s}: ridden out by {entry.id}"
    for e in entries:
        kinds = {s.kind for s in striker.struck if s.job == e.job_id}
        if kinds == {"link blip"} and e.job_id not in striker.exposed:
            assert e.state == DONE, f"{e.id} failed on link blips alone: {e.reason}"


def summary(entries: list[Entry], struck: list[Strike]) -> str:
    kinds = Counter(s.kind for s in struck)
    states = Counter(e.state for e in entries)
    lines = [
        f"net soak: {POINTS} points, {len(struck)} strikes ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))});"
        f" ended {', '.join(f'{k} {n}' for k, n in sorted(states.items()))}"
    ]
    for e in entries:
        hits = [
            f"{s.kind} {s.node}" + (f" {s.seconds:.0f} s" if s.seconds else "") for s in struck if s.job == e.job_id
        ]
        reason = e.reason.partition("; see ")[0][:200]
        lines.append(f"  {e.id} (job {e.job_id}; {', '.join(hits) or 'not struck'}) {e.state}: {reason}")
    return "\n".join(lines)


@pytest.mark.timeout(STREAM_S + RESUME_S + 3 * SETTLE_S + 120)
def test_faults_striking_a_stream_of_points_on_the_lab_cluster_lose_nothing_and_resume_completes(
    lab_cluster: NetCluster, faults: Faults, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_yaml(lab_cluster.profile(tmp_path)))
    out = tmp_path / "sweep"
    res = sweep(lab_cluster, str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        striker = Striker(lab_cluster, faults, out, random.Random(POINTS))
        striker.start()
        try:
            entries = follow(lab_cluster, out, STREAM_S)
        finally:
            striker.stop()
            faults.clear()
        settle(lab_cluster, out)
        assert striker.struck, "nothing was struck"
        print(f"\n{summary(entries, striker.struck)}")
        check_strikes(out, entries, check_entries(out, entries), striker)

        res = sweep(lab_cluster, "resume", str(out))
        assert res.returncode == 0, res.stdout + res.stderr
        entries = follow(lab_cluster, out, RESUME_S)
        assert all(e.state == DONE for e in entries), [(e.id, e.state, e.reason) for e in entries]
        for e in entries:
            assert check_file(out / e.result).complete, e.id
        settle(lab_cluster, out)
    finally:  # the cluster serves the other tests of the session
        if any(e.state in ACTIVE for e in Manifest.load(out).entries.values()):
            sweep(lab_cluster, "cancel", str(out))
