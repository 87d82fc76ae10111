"""A transformer's tokens/s and MFU through hpcbench beside a plain hand-written loop of the
same model, measured in one run.

    python benchmarks/transformer_step.py [--model gpt_tiny] [--seq 64] [--batch 8]
        [--precision fp32|bf16|fp16] [--compile default] [--device cpu|cuda] [--blocks 20] [--block 5]

The plain loop is what a user writes for one device: the module built from the zoo
(`frameworks/torch/layers.py`), fused AdamW, autocast for bf16/fp16, `torch.compile` when
asked, synthetic tokens already on the device; forward, loss, backward, step. The hpcbench arm
is the torch adapter's step on one rank (DDP over gloo, NCCL on CUDA) with full recording:
phase marks (CUDA events on a GPU) and every gradient message; "hpcbench-off" is the same step
recording nothing (so hpcbench / hpcbench-off is the recording's cost alone); "plain+ddp" is the
plain loop with the module in DDP and its own C++ all-reduce (so hpcbench-off / plain+ddp is the
adapter's own cost: its data copy, its Python communication hook); with `--compile`,
"ddp(compiled)" wraps DDP around the compiled module instead of compiling the DDP module.
Blocks of iterations alternate between the arms, in a new random order each round, so that all
see the same machine state; on a GPU every block ends by waiting for the device. Prints each
arm's tokens/s and MFU (against the device's dense peak from the table, or a peak measured
with `hpcbench check --peak`) and the ratio hpcbench / plain of tokens/s (goal: >= 0.98).

The GPU check of issue 34: `--model gpt2_124m --precision bf16 --seq 1024 --batch 8 --device
cuda`, then again with `--compile default`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

import torch

from hpcbench.devices import cache, measure, peaks
from hpcbench.frameworks.base import model_for
from hpcbench.frameworks.torch import layers as torch_layers
from hpcbench.frameworks.torch.adapter import TorchFramework
from hpcbench.rank import env as rankenv
from hpcbench.rank.net import free_port
from hpcbench.spec import Point
from hpcbench.trace.recorder import NullRecorder, clock_offset_ns
from hpcbench.workloads.flops import model_flops


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt_tiny")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--compile", default=None, help="a torch.compile mode (default: eager)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--blocks", type=int, default=20, help="blocks per arm")
    ap.add_argument("--block", type=int, default=5, help="iterations per block")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    return ap.parse_args()


def plain_loop(point: Point, device: torch.device, ddp: bool = False, inner: bool = False) -> Callable[[], None]:
    """One training step of the hand-written loop (`ddp`: the module in DistributedDataParallel,
    as the hpcbench arm's, which tells the backend's cost from hpcbench's recording; `inner`:
    DDP around the compiled module instead of the compiled DDP module)."""
    model = model_for(point)
    torch.manual_seed(0)
    net: torch.nn.Module = torch_layers.build(model).to(device)
    if inner and point.compile:
        net = torch.compile(net, mode=point.compile)  # type: ignore[assignment]
    if ddp:
        net = torch.nn.parallel.DistributedDataParallel(net)
    step_net = torch.compile(net, mode=point.compile) if point.compile and not inner else net
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(point.precision or "")
    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    x = torch.randint(0, model.classes - 1, (point.batch_size, *model.input), device=device)
    y = torch.roll(x, -1, dims=1)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = step_net(x)
            loss = loss_fn(logits.flatten(0, 1).float(), y.flatten())
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


def hpcbench_step(point: Point) -> tuple[Callable[[], None], Callable[[], None], TorchFramework]:
    """One training step of the torch adapter, recorded as the worker records it; and the same
    step recording nothing (the adapter's own cost: its data, its DDP communication hook)."""
    fw = TorchFramework()
    fw.setup(point, rankenv.single(), None)
    fw.build(point)
    offset = clock_offset_ns()
    rec = fw.recorder(1 << 16, offset, 0)
    rec.comm = fw.comm_recorder(0, offset, 0)
    off = NullRecorder(1, offset, 0)

    def step() -> None:
        if rec.full:
            rec.drain()
            rec.comm.drain()  # type: ignore[union-attr]
        rec.start()
        loss = fw.step(rec)
        rec.stop(point.batch_size, loss)

    def unrecorded() -> None:
        fw.step(off)

    return step, unrecorded, fw


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    point = Point(
        model=args.model, seq_len=args.seq, batch_size=args.batch, device=args.device, optimizer="adamw", lr=1e-4,
        backend="nccl" if args.device == "cuda" else "gloo", dataset="synthetic",
        precision=None if args.precision == "fp32" else args.precision, compile=args.compile,
    )  # fmt: skip
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    arms: dict[str, Callable[[], None]] = {}
    arms["hpcbench"], arms["hpcbench-off"], fw = hpcbench_step(point)  # first: it starts the process group
    arms["plain"] = plain_loop(point, device)
    arms["plain+ddp"] = plain_loop(point, device, ddp=True)
    if point.compile:
        arms["ddp(compiled)"] = plain_loop(point, device, ddp=True, inner=True)

    def block(step: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        for _ in range(args.block):
            step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for step in arms.values():  # warm-up (and compilation), every arm
        for _ in range(3):
            block(step)
    times: dict[str, list[float]] = {name: [] for name in arms}
    order = random.Random(0)  # a new order each round: no arm always follows the same one
    for _ in range(args.blocks):
        for name in order.sample(list(arms), len(arms)):
            times[name].append(block(arms[name]))
    fw.teardown()

    model = model_for(point)
    flops = model_flops(model).training
    name = measure.device_name(args.device)
    peak = peaks.peak_for(name, peaks.dtype_for_precision(point.precision), cache.load_measured())
    print(f"{args.model} seq {args.seq} batch {args.batch} {args.precision} compile {args.compile or 'off'} on {name}")
    print(f"{args.blocks} blocks x {args.block} iterations per arm; model FLOPs {flops / 1e9:.3f} GFLOP per sample")
    rates = {}
    for arm, blocks in times.items():
        step_s = statistics.median(blocks) / args.block
        rates[arm] = args.batch * model.tokens / step_s
        mfu = peaks.mfu(args.batch * flops / step_s, peak, 1)
        print(f"  {arm:13s} step {step_s * 1e3:9.3f} ms  {rates[arm]:12,.0f} tokens/s  MFU {mfu:.2%}")
    print(f"MFU against: {peak.source if peak else 'no peak (hpcbench check --peak)'}")
    print(f"tokens/s hpcbench / plain: {rates['hpcbench'] / rates['plain']:.4f} (goal >= 0.98); "
          f"hpcbench / plain+ddp: {rates['hpcbench'] / rates['plain+ddp']:.4f}; the recording alone (hpcbench /"
          f" hpcbench-off): {rates['hpcbench'] / rates['hpcbench-off']:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
