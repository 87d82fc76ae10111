"""Run by the lab tests on every rank: one all-reduce of N bytes (argv[1]); prints a JSON
line per rank: its rank, Slurm node, network namespace (inode) and whether the sum is right."""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.full(int(sys.argv[1]) // 4, comm.rank + 1, dtype=np.float32)
comm.Allreduce(MPI.IN_PLACE, buf)
expected = comm.size * (comm.size + 1) / 2
print(
    json.dumps(
        {
            "rank": comm.rank,
            "node": os.environ.get("SLURMD_NODENAME", ""),
            "netns": os.stat("/proc/self/ns/net").st_ino,
            "right": bool((buf == expected).all()),
        }
    ),
    flush=True,
)
