"""Step time of the same model with full tracing on vs off, measured in one run.

    python benchmarks/recording_overhead.py [--model lenet] [--batch 32] [--blocks 40] [--block 25] [--device cuda]

Runs one rank of the torch adapter (DDP over gloo, world size 1; over NCCL with
`--device cuda`) and alternates blocks of iterations with full tracing (phase marks, every
all-reduce message, the resource sampler thread, drains and HDF5 writes through the
one-writer path; on a GPU, CUDA events and NVML) and with a recorder that records nothing,
so that both arms see the same machine state. On a GPU each block ends by waiting for the
device, in both arms, so that a block's wall time is the device's work.
Prints the ratio on/off of total times (goal <= 1.01; HDF5 writes included, one every
`--flush-every` iterations) and the median ratio of paired blocks, in wall time and in the
main thread's CPU time (with one compute thread the step runs on the main thread, and CPU
time does not count the moments another process had the core: the steadier figure on a
shared machine), and the cost of one phase mark and of one communication event.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hpcbench.frameworks.torch.adapter import TorchFramework
from hpcbench.rank import env as rankenv
from hpcbench.rank.collectives import SelfComm
from hpcbench.rank.net import free_port
from hpcbench.spec import Options, Point
from hpcbench.store import schema
from hpcbench.store.writer import FileMeta, open_writer
from hpcbench.trace.messages import CommRecorder
from hpcbench.trace.recorder import NullRecorder, Phase, Recorder, clock_offset_ns
from hpcbench.trace.sampler import Sampler


def mark_cost_ns(n: int = 200_000) -> float:
    rec = Recorder(1, clock_offset_ns(), 0)
    rec.start()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        rec.mark(Phase.FORWARD)
    return (time.perf_counter_ns() - t0) / n


def comm_event_cost_ns(n: int = 100_000) -> float:
    """begin + end of one message, as the DDP hook records it."""
    comm = CommRecorder(0, clock_offset_ns(), 0, capacity=n)
    t0 = time.perf_counter_ns()
    for i in range(n):
        comm.end(comm.begin(i, "allreduce", "bucket0", "float32", 1 << 20))
    return (time.perf_counter_ns() - t0) / n


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=300, help="blocks per arm")
    ap.add_argument("--block", type=int, default=4, help="iterations per block (short blocks cancel drift)")
    ap.add_argument("--flush-every", type=int, default=Options.flush_every, help="iterations per HDF5 write")
    ap.add_argument("--sample-period", type=float, default=Options.sample_period_s, help="resource sampler period (s)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, CUDA events, NVML")
    ap.add_argument(
        "--record",
        choices=("all", "phases", "host"),
        default="all",
        help="phases: phase marks only (no messages, no sampler); host: the marks' host clocks only (no CUDA events)",
    )
    return ap.parse_args()


Times = dict[str, list[tuple[float, float]]]  # arm -> (wall, main-thread CPU) seconds of each block


def measure(args: argparse.Namespace, fw: TorchFramework, point: Point) -> Times:
    """Blocks of iterations alternating between the arms (full tracing, nothing recorded)."""
    cuda = args.device == "cuda"
    offset = clock_offset_ns()
    n_on = args.blocks * args.block
    with tempfile.TemporaryDirectory() as tmp:
        row = np.zeros((), dtype=schema.RANK_DTYPE)
        meta = FileMeta(root={"epoch_ns": 0}, point={"id": "bench", "json": point.to_json()})
        writer = open_writer(Path(tmp) / "bench.h5", SelfComm(), meta, n_on, row, "gather")
        on = (
            Recorder(args.flush_every, offset, 0) if args.record == "host" else fw.recorder(args.flush_every, offset, 0)
        )
        on.comm = fw.comm_recorder(0, offset, 0) if args.record == "all" else None
        sampler = Sampler(0, args.sample_period, offset, 0, gpu_index=0 if cuda else None)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()

        if args.record == "all":
            sampler.start()
        off = NullRecorder(1, offset, 0)

        def flush() -> None:
            first = on.first
            rows = on.drain()  # before the messages, as the worker does
            messages = on.comm.drain() if on.comm is not None else np.zeros(0, dtype=schema.COMM_DTYPE)
            writer.write_iterations(first, rows, {"comm": messages, "resources": sampler.drain()})

        def block(rec: Recorder) -> tuple[float, float]:
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(args.block):
                rec.start()
                loss = fw.step(rec)
                rec.stop(args.batch, loss)
                if rec.full:
                    flush()
            sync()
            return time.perf_counter() - t0, time.thread_time() - c0

        for _ in range(3):  # warm-up, both arms
            block(off)
        times: Times = {"on": [], "off": []}
        for i in range(args.blocks):
            arms = ("on", "off") if i % 2 == 0 else ("off", "on")
            for arm in arms:
                times[arm].append(block(on if arm == "on" else off))
        sampler.stop()
        flush()
        writer.close(schema.STATUS_COMPLETE)
    return times


def report(args: argparse.Namespace, times: Times) -> None:
    shape = f"{args.blocks} blocks x {args.block} iterations per arm"
    print(f"model {args.model}, batch {args.batch}, {args.device}, recording {args.record}, {shape}")
    for i, clock in enumerate(("wall time", "main-thread CPU time")):
        on_t = [t[i] for t in times["on"]]
        off_t = [t[i] for t in times["off"]]
        paired = statistics.median(a / b for a, b in zip(on_t, off_t, strict=True))
        print(
            f"{clock}: step {sum(off_t) / len(off_t) / args.block * 1e3:.3f} ms off, "
            f"{sum(on_t) / len(on_t) / args.block * 1e3:.3f} ms on; ratio on/off {sum(on_t) / sum(off_t):.4f} "
            f"(goal <= 1.01; median of paired blocks {paired:.4f})"
        )
    print(
        f"one phase mark: {mark_cost_ns():.0f} ns; one communication event (begin + end): {comm_event_cost_ns():.0f} ns"
    )


def main() -> None:
    args = parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    backend = "nccl" if args.device == "cuda" else "gloo"
    point = Point(model=args.model, batch_size=args.batch, threads=1, device=args.device, backend=backend)
    fw = TorchFramework()
    fw.setup(point, rankenv.single(), None)
    fw.build(point)
    times = measure(args, fw, point)
    fw.teardown()
    report(args, times)


if __name__ == "__main__":
    main()
