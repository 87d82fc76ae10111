"""Step time of the same model with full tracing on vs off, measured in one run.

    python benchmarks/recording_overhead.py [--model lenet] [--batch 32] [--blocks 40] [--block 25]
        [--device cuda] [--arms all,all:8]

Runs one rank of the torch adapter (DDP over gloo, world size 1; over NCCL with
`--device cuda`) and alternates blocks of iterations with full tracing (phase marks, every
all-reduce message, the resource sampler thread, drains, the energy counters' reads and HDF5
writes through the one-writer path; on a GPU, CUDA events and NVML) and with a recorder that records nothing,
so that both arms see the same machine state. On a GPU each block ends by waiting for the
device, in both arms, so that a block's wall time is the device's work.
Prints the ratio on/off of total times (goal <= 1.01; HDF5 writes included, one every
`--flush-every` iterations) and the median ratio of paired blocks, in wall time and in the
main thread's CPU time (with one compute thread the step runs on the main thread, and CPU
time does not count the moments another process had the core: the steadier figure on a
shared machine), and the cost of one phase mark and of one communication event.

`--arms all,all:8,phases,host` measures several recording arms against the same "off"
blocks in one run (each round one block of each, in a new random order): `phases` leaves out
the messages and the sampler, `host` also the CUDA events (host marks alone), and `:N` records
the CUDA events of every N-th iteration only (the others keep their host marks' times).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcbench.frameworks.torch.adapter import TorchFramework
from hpcbench.rank import env as rankenv
from hpcbench.rank.collectives import SelfComm
from hpcbench.rank.net import free_port
from hpcbench.spec import Options, Point
from hpcbench.store import schema
from hpcbench.store.writer import FileMeta, open_writer
from hpcbench.trace.energy.meter import EnergyMeter
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


ARM_KINDS = ("all", "phases", "host")
WARMUP_BLOCKS = 3  # of every arm, before the measured rounds


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
        choices=ARM_KINDS,
        default="all",
        help="phases: phase marks only (no messages, no sampler); host: the marks' host clocks only (no CUDA events)",
    )
    ap.add_argument(
        "--arms",
        default=None,
        help="several recording arms, each against the same 'off' blocks: KIND[:N] separated by commas, KIND one of"
        " all, phases, host and N the device events' sampling (CUDA events on every N-th iteration only)"
        " (default: --record's one arm)",
    )
    args = ap.parse_args()
    args.arms = [parse_arm(text, args.device) for text in (args.arms or args.record).split(",")]
    return args


def parse_arm(text: str, device: str) -> tuple[str, int]:
    kind, _, every = text.strip().partition(":")
    if kind not in ARM_KINDS:
        raise SystemExit(f"--arms: {text!r}: the kind must be one of {', '.join(ARM_KINDS)}")
    if every and (not every.isdigit() or int(every) < 1):
        raise SystemExit(f"--arms: {text!r}: N must be a whole number >= 1 (CUDA events on every N-th iteration)")
    n = int(every or 1)
    if n > 1 and (device != "cuda" or kind == "host"):
        raise SystemExit(f"--arms: {text!r}: sampling applies to CUDA events (--device cuda, kind all or phases)")
    return kind, n


def arm_name(arm: tuple[str, int]) -> str:
    kind, every = arm
    return kind if every == 1 else f"{kind}:{every}"


Times = dict[str, list[tuple[float, float]]]  # arm -> (wall, main-thread CPU) seconds of each block


def make_recorder(fw: TorchFramework, arm: tuple[str, int], flush_every: int, offset: int) -> Recorder:
    """The recorder of one arm: the adapter's own where the events are not sampled."""
    kind, every = arm
    if kind == "host":
        return Recorder(flush_every, offset, 0)
    if every == 1:
        rec = fw.recorder(flush_every, offset, 0)
        rec.comm = fw.comm_recorder(0, offset, 0) if kind == "all" else None
        return rec
    from hpcbench.trace.cuda import CudaCommRecorder, CudaRecorder

    rec = CudaRecorder(flush_every, offset, 0, fw.device, device_every=every)
    rec.comm = CudaCommRecorder(0, offset, 0, device=fw.device, device_every=every) if kind == "all" else None
    return rec


class Bench:
    """The blocks of one run: 'off' and every arm's, each arm with its recorder and HDF5 file."""

    def __init__(self, args: argparse.Namespace, fw: TorchFramework, point: Point, tmp: Path) -> None:
        self.args, self.fw = args, fw
        self.cuda = args.device == "cuda"
        offset = clock_offset_ns()
        row = np.zeros((), dtype=schema.RANK_DTYPE)
        meta = FileMeta(root={"epoch_ns": 0}, point={"id": "bench", "json": point.to_json()})
        self.sampler = Sampler(0, args.sample_period, offset, 0, gpu_index=0 if self.cuda else None)
        self.energy = EnergyMeter(0, offset, 0, 0, 0 if self.cuda else None)  # read at each flush, as the worker does
        self.off = NullRecorder(1, offset, 0)
        self.arms: dict[str, tuple[Recorder, Any]] = {}
        iterations = (WARMUP_BLOCKS + args.blocks) * args.block
        for i, arm in enumerate(args.arms):
            writer = open_writer(tmp / f"arm{i}.h5", SelfComm(), meta, iterations, row, "gather")
            self.arms[arm_name(arm)] = (make_recorder(fw, arm, args.flush_every, offset), writer)

    def flush(self, rec: Recorder, writer: Any) -> None:
        first = rec.first
        rows = rec.drain()  # before the messages, as the worker does
        self.energy.read()
        messages = rec.comm.drain() if rec.comm is not None else np.zeros(0, dtype=schema.COMM_DTYPE)
        tables = {"comm": messages, "resources": self.sampler.drain(), "energy": self.energy.drain()}
        writer.write_iterations(first, rows, tables)

    def block(self, name: str) -> tuple[float, float]:
        """One block of arm `name` ("off": nothing recorded); its wall and main-thread CPU seconds."""
        rec, writer = self.arms[name] if name != "off" else (self.off, None)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(self.args.block):
            rec.start()
            loss = self.fw.step(rec)
            rec.stop(self.args.batch, loss)
            if rec.full:
                self.flush(rec, writer)
        if self.cuda:  # a block's wall time is the device's work
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.thread_time() - c0

    def run(self) -> Times:
        names = ["off", *self.arms]
        if any(kind == "all" for kind, _ in self.args.arms):
            self.sampler.start()
        for _ in range(WARMUP_BLOCKS):
            for name in names:
                self.block(name)
        times: Times = {name: [] for name in names}
        order = random.Random(0)  # a new order each round: no arm always follows the same one
        for _ in range(self.args.blocks):
            for name in order.sample(names, len(names)):
                times[name].append(self.block(name))
        self.sampler.stop()
        for rec, writer in self.arms.values():
            self.flush(rec, writer)
            writer.close(schema.STATUS_COMPLETE)
        self.energy.close()
        return times


def measure(args: argparse.Namespace, fw: TorchFramework, point: Point) -> Times:
    """Blocks of iterations, each round one block of 'off' (nothing recorded) and of every
    arm, in a new random order each round."""
    with tempfile.TemporaryDirectory() as tmp:
        return Bench(args, fw, point, Path(tmp)).run()


def report(args: argparse.Namespace, times: Times) -> None:
    shape = f"{args.blocks} blocks x {args.block} iterations per arm"
    arms = [name for name in times if name != "off"]
    print(f"model {args.model}, batch {args.batch}, {args.device}, recording {', '.join(arms)}, {shape}")
    for i, clock in enumerate(("wall time", "main-thread CPU time")):
        off_t = [t[i] for t in times["off"]]
        print(f"{clock}: step {sum(off_t) / len(off_t) / args.block * 1e3:.3f} ms off")
        for name in arms:
            on_t = [t[i] for t in times[name]]
            paired = statistics.median(a / b for a, b in zip(on_t, off_t, strict=True))
            print(
                f"  {name}: step {sum(on_t) / len(on_t) / args.block * 1e3:.3f} ms; ratio on/off"
                f" {sum(on_t) / sum(off_t):.4f} (goal <= 1.01; median of paired blocks {paired:.4f})"
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
