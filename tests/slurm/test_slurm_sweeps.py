"""Sweeps through real sbatch / srun / mpirun / torchrun on the single-host test cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, FAILED, STOPPED, Manifest
from tests.conftest import ROOT, run_module
from tests.slurm.conftest import MAX_ARRAY_SIZE, slurm_spec, wait_for_state, wait_until_finished

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SLURM = {"executor": "slurm", "profile": "testcluster"}
# Ranks that start in a fraction of a second (no framework to import): the placement tests run
# 24 of them on 2 cores; PyTorch across nodes is test_torch_across_two_nodes_under_torchrun_and_srun.
SYNTHETIC = {"framework": "synthetic", "backend": "none", "model": "sleep"}


def accounted(job_ids: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Job id -> (the number Slurm gave the job, the nodes it ran on), as sacct records them.
    An array task's id ("A_T") is not its SLURM_JOB_ID: each task is a job of its own number."""
    argv = ["sacct", "-n", "-P", "-X", "-o", "JobID,JobIDRaw,NodeList", "-j", ",".join(job_ids)]
    rows = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    found = {}
    for row in rows:
        job, raw, nodelist = row.split("|")
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        found[job] = (raw, names.stdout.split())
    return found


def test_points_on_1_2_4_nodes_hold_every_rank_and_the_virtual_hosts(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    matrix = {"nodes": [1, 2, 4], "launcher": ["srun", "mpirun"]}
    spec = write_spec(slurm_spec("scale", matrix, ranks_per_node=2, threads=1, **SYNTHETIC))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "submitted 6 points" in res.stdout
    wait_until_finished(out)
    manifest = Manifest.load(out)
    assert {e.state for e in manifest.entries.values()} == {DONE}, [e.reason for e in manifest.entries.values()]
    jobs = accounted([e.job_id for e in manifest.entries.values()])
    for entry in manifest.entries.values():
        data = read_point(out / entry.result)
        nodes = data.point.nodes
        assert data.complete
        assert data.iterations.shape[0] == 2 * nodes
        hosts = data.hostnames
        assert all(re.fullmatch(r"c[1-4]", h) for h in hosts), hosts
        raw_id, allocated = jobs[entry.job_id]
        assert sorted(set(hosts)) == sorted(allocated) and len(allocated) == nodes, "the job's own virtual nodes"
        assert sorted(hosts.count(h) for h in set(hosts)) == [2] * nodes, "two ranks on each"
        assert data.provenance["slurm_job_id"] == raw_id  # the job the ranks ran in, as Slurm numbered it
        assert data.provenance["site_profile"]["name"] == "testcluster"
        source = {"srun": "slurm", "mpirun": "openmpi"}[data.point.launcher]
        assert data.provenance["launcher_source"] == source


def test_torch_across_two_nodes_under_torchrun_and_srun(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(slurm_spec("trun", {"launcher": ["torchrun", "srun"]}, nodes=2, ranks_per_node=2, threads=1))
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(spec), "--out", str(out)).returncode == 0
    wait_until_finished(out)
    entries = list(Manifest.load(out).entries.values())
    assert sorted(str(e.point["launcher"]) for e in entries) == ["srun", "torchrun"]
    jobs = accounted([e.job_id for e in entries])
    for entry in entries:
        assert entry.state == DONE, entry.reason
        data = read_point(out / entry.result)
        assert data.point.framework == "torch" and data.iterations.shape[0] == 4
        # ranks 0-1 on one of the job's two virtual nodes, 2-3 on the other (torchrun numbers a
        # node's ranks together; srun places them in blocks)
        hosts = data.hostnames
        _, allocated = jobs[entry.job_id]
        assert len(allocated) == 2 and sorted(set(hosts)) == sorted(allocated), (hosts, allocated)
        assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts


def test_same_shape_points_share_arrays_split_at_max_array_size(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    n = MAX_ARRAY_SIZE + 2
    spec = write_spec(slurm_spec("arrays", {"seed": list(range(n))}, launcher="srun", iterations=2, warmup=0))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stderr
    ids = [e.job_id for e in Manifest.load(out).entries.values()]
    arrays = {i.split("_")[0] for i in ids}
    assert all("_" in i for i in ids), ids
    assert len(arrays) == 2  # MAX_ARRAY_SIZE points in the first array, the rest in a second
    assert sorted(sum(1 for i in ids if i.startswith(a + "_")) for a in arrays) == [2, MAX_ARRAY_SIZE]
    wait_until_finished(out)
    assert {e.state for e in Manifest.load(out).entries.values()} == {DONE}


def test_scancel_is_reported_failed_and_resume_reruns_only_that_point(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = write_spec(slurm_spec("cancel", {"iterations": [3, 3000]}, launcher="srun", warmup=0))
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(spec), "--out", str(out)).returncode == 0
    entries = {e.point["iterations"]: e for e in Manifest.load(out).entries.values()}
    long, short = entries[3000], entries[3]
    wait_for_state(out, long.id, "running")
    subprocess.run(["scancel", long.job_id], check=True)
    res = wait_until_finished(out)
    assert res.returncode == 1  # a point failed
    after = Manifest.load(out).entries
    assert after[short.id].state == DONE
    # cancelled while torch starts: failed; once the ranks run: they stop together (stopped)
    assert after[long.id].state in (FAILED, STOPPED)
    assert "CANCELLED" in after[long.id].reason or after[long.id].reason.startswith("cancelled; ")
    assert after[long.id].log in after[long.id].reason
    assert Path(after[long.id].log).exists()

    # The cancelled attempt's file: stopped ranks wrote every row and marked it; ranks cancelled
    # while torch started may not have created it yet (the worker creates it once the framework is up)
    partial = out / long.result
    written = int(read_point(partial).attrs["iterations_written"]) if partial.exists() else None
    assert written is not None or after[long.id].state == FAILED, "stopped ranks leave their file"

    res = run_module("hpcbench.sweep", "resume", str(out))
    assert res.returncode == 0, res.stderr
    assert "resuming 1 of 2 points" in res.stdout
    resumed = Manifest.load(out).entries
    assert resumed[short.id].job_id == short.job_id and resumed[short.id].attempts == 1
    assert resumed[long.id].job_id != long.job_id and resumed[long.id].attempts == 2
    wait_until_finished(out, timeout=400)
    assert Manifest.load(out).entries[long.id].state == DONE
    assert read_point(partial).complete
    # the cancelled attempt's partial file is kept aside as it was, not overwritten; none where it left none
    asides = list(out.glob(f"{long.id}.attempt*.h5"))
    if written is None:
        assert asides == []
    else:
        (aside,) = asides
        kept = read_point(aside)
        assert not kept.complete and int(kept.attrs["iterations_written"]) == written


def test_hostile_name_paths_and_values_execute_nothing(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    evil = 'x\'; touch PWNED; $(touch PWNED2) `touch PWNED3` "q"'
    name = f"evil {evil}"
    text = slurm_spec(
        "placeholder", {"ranks_per_node": [2]}, launcher="srun", environ={"HPCBENCH_PROBE": evil + "\nline2"}
    )
    text = text.replace("name: placeholder", f"name: {json.dumps(name)}")
    spec = write_spec(text)
    out = tmp_path / f"out dir {evil}"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    wait_until_finished(out)
    (entry,) = Manifest.load(out).entries.values()
    assert entry.state == DONE, entry.reason
    data = read_point(out / entry.result)
    assert data.attrs["sweep"] == name
    assert data.provenance["environment"]["HPCBENCH_PROBE"] == evil + "\nline2"  # arrived intact, as data
    for where in (ROOT, tmp_path, out, Path.cwd(), Path("/tmp")):
        for marker in ("PWNED", "PWNED2", "PWNED3"):
            assert not (where / marker).exists(), where / marker


def test_output_path_with_newline_is_refused_before_submission(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(slurm_spec("nl", {"ranks_per_node": [1]}, launcher="srun"))
    out = tmp_path / "bad\nname"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 2  # bad input (docs/running.md#outputs-and-exit-codes)
    assert "control characters" in res.stderr
    assert not any(e.job_id for e in Manifest.load(out).entries.values())


def test_unreachable_controller_submits_and_records_nothing(
    write_spec: Callable[..., Path], tmp_path: Path, slurm_cluster: str
) -> None:
    conf = Path(slurm_cluster).read_text()
    bad = tmp_path / "slurm.conf"
    bad.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", conf))
    spec = write_spec(slurm_spec("down", {"ranks_per_node": [1]}, launcher="srun"))
    out = tmp_path / "sweep"
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out), env={"SLURM_CONF": str(bad)}, timeout=120)
    assert res.returncode == 2  # the command could not do what it was asked
    (line,) = res.stderr.strip().splitlines()
    assert "Slurm controller unreachable" in line and "SLURM_CONF" in line and "nothing was submitted" in line
    entries = Manifest.load(out).entries.values() if (out / "manifest.json").exists() else []
    assert all(e.state == "pending" and not e.job_id for e in entries)


def test_the_same_spec_runs_on_the_local_executor(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = slurm_spec("both", {"nodes": [1, 2], "launcher": ["mpirun", "torchrun"]}, ranks_per_node=1)
    local = write_spec(text.replace("executor: slurm", "executor: local"), "local.yaml")
    out = tmp_path / "local"
    res = run_module("hpcbench.sweep", str(local), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    for entry in Manifest.load(out).entries.values():
        data = read_point(out / entry.result)
        assert data.complete and data.iterations.shape[0] == data.point.nodes
        assert set(data.hostnames) == {os.uname().nodename}


def test_cancel_stops_queued_and_running_points(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(slurm_spec("stop", {"seed": [1, 2]}, launcher="srun", iterations=5000, warmup=0))
    out = tmp_path / "sweep"
    assert run_module("hpcbench.sweep", str(spec), "--out", str(out)).returncode == 0
    first = next(iter(Manifest.load(out).entries))
    wait_for_state(out, first, "running")
    res = run_module("hpcbench.sweep", "cancel", str(out))
    assert res.returncode == 0, res.stderr
    assert "cancelled 2 points" in res.stdout
    entries = Manifest.load(out).entries.values()
    assert all(e.state == STOPPED and "cancelled by the user" in e.reason for e in entries)
    jobs = [e.job_id for e in entries]
    # scancel signals the jobs; they leave the queue once their steps have ended (KillWait)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], capture_output=True, text=True)
        if not [j for j in left.stdout.split() if j in jobs]:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"jobs {jobs} still queued 60 s after cancel: {left.stdout}")
