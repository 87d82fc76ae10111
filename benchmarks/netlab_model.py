"""The performance model held out on the network lab: fitted bandwidth and held-out t_iter.

    sudo .venv/bin/python benchmarks/netlab_model.py [--rate 150] [--iterations 24] [--comm-mib 2]

Builds a 4-node network lab (hpcbench.testing.netlab; needs root and iproute2), shapes every
node's link to `--rate` Mbit/s, and runs synthetic points (20 + 30 ms of sleep-based compute,
one real all-reduce of `--comm-mib` MiB per iteration) on 1, 2, 3 and 4 nodes, one rank per
node, under mpirun with Open MPI's all-reduce pinned to the ring (hpcbench.testing.heldout).
The model is calibrated on the 1- and 2-node points only (`hpcbench predict` on a sweep
directory holding just them) and predicts 3 and 4 nodes. Prints the configured rate, the
link's TCP goodput, the bandwidth the 2-node point's messages fit (and its ratio to the
goodput), and per node count the measured and predicted t_iter and the held-out error.
Goal: every held-out error within 10 %.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from hpcbench.testing.heldout import Workload, held_out
from hpcbench.testing.netlab import Lab

NODES = 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=150.0, help="each link's rate, Mbit/s (default 150)")
    p.add_argument("--iterations", type=int, default=24, help="timed iterations per point (default 24)")
    p.add_argument("--comm-mib", type=float, default=2.0, help="all-reduce size per iteration, MiB (default 2)")
    args = p.parse_args()
    work = Workload(comm_bytes=int(args.comm_mib * 1024 * 1024), iterations=args.iterations)
    with Lab(nodes=NODES, subnet="10.234.0.0/24", prefix="hbp") as lab, tempfile.TemporaryDirectory() as tmp:
        shaping = {i: lab.shape(i, args.rate) for i in range(1, NODES + 1)}
        result = held_out(lab, Path(tmp), [1, 2], [3, 4], work)
    goodput = shaping[1].tcp_goodput_bytes_per_s
    fitted = 1 / result.link_beta
    print(f"rate {args.rate:g} Mbit/s, TCP goodput {8 * goodput / 1e6:.1f} Mbit/s; "
          f"fitted (2 nodes) {8 * fitted / 1e6:.1f} Mbit/s, ratio {fitted / goodput:.3f}")  # fmt: skip
    print("nodes  measured ms  predicted ms  error")
    for n, t in sorted(result.measured.items()):
        if n in result.predicted:
            print(f"{n:5d}  {t * 1e3:11.1f}  {result.predicted[n] * 1e3:12.1f}  {result.errors[n]:+.1%}")
        else:
            print(f"{n:5d}  {t * 1e3:11.1f}  {'(calibration)':>12}")


if __name__ == "__main__":
    main()
