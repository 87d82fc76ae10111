"""Does MPI serve a non-blocking all-reduce while the rank computes without calling MPI?

    python benchmarks/mpi_progress.py [--ranks 2] [--btl vader,self] [--repeat 15]

torch `mpi` hands each gradient to a non-blocking all-reduce (mpi4py's Iallreduce) from
backward's hooks and waits for them after backward, as MPI-based frameworks do. Whether that
overlaps depends on the MPI library progressing the request while the rank computes: Open
MPI has no progress thread, so a request advances only inside MPI calls. The model takes
such an exchange as served once backward is over (analysis/model/calibrate.py: a backend
whose trait `mpi_exchange` is set).

Per message size, under mpirun (it starts itself there): the blocking all-reduce's time
(median of `--repeat`), then the same all-reduce started, 4 times its blocking time (at
least 4 ms) of computing without MPI calls, and the time its wait still took. Prints their
ratio: 1 (or more) where nothing was served during the compute, 0 where all of it was.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SIZES_KIB = (16, 256, 1024, 4096, 16384)


def _compute(seconds: float) -> None:
    """Work on the CPU without any MPI call."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(repeat: int) -> list[tuple[int, float, float, float]]:
    """(KiB, blocking s, compute s, waited after the compute s) per size, medians."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = []
    for kib in SIZES_KIB:
        send = np.ones(kib * 256, np.float32)
        recv = np.empty_like(send)
        blocking, waited = [], []
        for _ in range(repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(send, recv)
            blocking.append(time.perf_counter() - t0)
        compute = max(4 * statistics.median(blocking), 4e-3)
        for _ in range(repeat):
            comm.Barrier()
            request = comm.Iallreduce(send, recv)
            _compute(compute)
            t0 = time.perf_counter()
            request.Wait()
            waited.append(time.perf_counter() - t0)
        rows.append((kib, statistics.median(blocking), compute, statistics.median(waited)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--btl", default="vader,self", help="Open MPI transports (tcp,self: over TCP)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:  # start the ranks
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        argv = ["mpirun", *root, "--oversubscribe", "--bind-to", "none", "--mca", "btl", args.btl,
                "-np", str(args.ranks), sys.executable, __file__, *sys.argv[1:]]  # fmt: skip
        sys.exit(subprocess.call(argv))
    rows = measure(args.repeat)
    if int(os.environ["OMPI_COMM_WORLD_RANK"]) == 0:
        print(f"{args.ranks} ranks, btl {args.btl}: a non-blocking all-reduce's wait after computing without MPI calls")
        print(f"{'size':>10} {'blocking':>10} {'computed':>10} {'waited':>10} {'waited/blocking':>16}")
        for kib, blocking, compute, waited in rows:
            print(f"{kib:>6} KiB {blocking * 1e3:>7.2f} ms {compute * 1e3:>7.1f} ms {waited * 1e3:>7.2f} ms "
                  f"{waited / blocking:>16.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
