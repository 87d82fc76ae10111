"""Seconds from `python -m hpcbench.sweep SPEC` starting to 1000 points queued on Slurm.

    eval "$(slurm/testcluster/start.sh -n 4)"     # or any cluster: SLURM_CONF / sbatch on PATH
    python benchmarks/submit_1000.py [--points 1000]

Plans a 1000-point sweep (one resource shape: one job array per MaxArraySize points),
submits it through the real CLI in a subprocess, checks with squeue that every point is
queued, prints the wall time (goal <= 10 s), then cancels the jobs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hpcbench.sweepdir.manifest import Manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=1000)
    args = ap.parse_args()
    spec = {
        "name": "submit-benchmark",
        "executor": "slurm",
        "profile": "testcluster",
        "matrix": {"seed": list(range(args.points))},
        "fixed": {"launcher": "srun", "iterations": 1, "warmup": 0},
        "slurm": {"array_parallelism": 1},  # queue them all, run almost none
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = Path(tmp) / "sweep"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "hpcbench.sweep", str(path), "--out", str(out)], capture_output=True, text=True
        )
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"submission failed: {proc.stderr}")
        job_ids = sorted({e.job_id.split("_")[0] for e in Manifest.load(out).entries.values()})
        queued = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True, check=True
        ).stdout.split()
        subprocess.run(["scancel", *job_ids], check=True)
    print(f"{args.points} points in {len(job_ids)} job array(s): {len(queued)} array tasks seen by squeue")
    print(f"command start to all jobs queued: {elapsed:.2f} s (goal <= 10 s)")


if __name__ == "__main__":
    main()
