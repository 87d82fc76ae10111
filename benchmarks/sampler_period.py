"""How closely the resource sampler's thread keeps its period beside a training loop that holds
Python's interpreter lock.

    python benchmarks/sampler_period.py [--period 0.05] [--seconds 2] [--threads 32] [--gpu INDEX]

The main thread spins in Python (as a loop of small framework calls does) while the sampler
thread samples at `--period`; `--threads` idle threads stand for a framework's pools (a
PyTorch process on a 16-core node has about 33). Every file the thread reads releases the
lock, and taking it back from a spinning loop can take the interpreter's switch interval
(5 ms), so a sample's cost grows with the reads it makes: this prints the median and largest
gap between the thread's samples, and their ratio to the period (goal: median ≤ 1.1).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from hpcbench.trace.sampler import Sampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--period", type=float, default=0.05, help="sampler period (s)")
    ap.add_argument("--seconds", type=float, default=2.0, help="how long the loop spins")
    ap.add_argument("--threads", type=int, default=32, help="idle threads beside the loop")
    ap.add_argument("--gpu", type=int, default=None, help="sample this GPU through NVML too")
    args = ap.parse_args()
    idle = threading.Event()
    pool = [threading.Thread(target=idle.wait, daemon=True) for _ in range(args.threads)]
    for thread in pool:
        thread.start()
    sampler = Sampler(0, args.period, 0, 0, gpu_index=args.gpu)
    sampler.start()
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:  # the loop: pure Python, holding the lock but at switches
        pass
    sampler.stop()
    threads = threading.active_count()
    idle.set()
    t = sampler.drain()["t"]
    gaps = np.diff(t[1:-1])  # between the thread's own samples (not start's and stop's)
    if gaps.size == 0:
        raise SystemExit("the thread took fewer than two samples: run longer (--seconds)")
    median = float(np.median(gaps))
    print(f"{threads} threads, period {args.period:.3f} s, {gaps.size + 1} thread samples")
    print(
        f"gap between samples: median {median:.3f} s, max {gaps.max():.3f} s; "
        f"median / period {median / args.period:.2f} (goal <= 1.1)"
    )


if __name__ == "__main__":
    main()
