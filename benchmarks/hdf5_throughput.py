"""HDF5 write throughput of the point-file writer against a raw numpy write of the same bytes.

    python benchmarks/hdf5_throughput.py [--iterations 1000000] [--block 10000] [--repeat 3]

Writes one rank's iteration rows (ITERATION_DTYPE) in blocks through the point-file writer,
the way the worker flushes them (blocks of `--block` iterations, a flush after each), and
the same bytes with numpy's tofile to a file in the same directory, fsync'd both. Prints
MB/s of both and their ratio (goal >= 50 %).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from hpcbench.rank.collectives import SelfComm
from hpcbench.store import schema
from hpcbench.store.writer import FileMeta, open_writer


def write_point(path: Path, blocks: list[np.ndarray], n_iters: int) -> None:
    meta = FileMeta(root={"epoch_ns": 0}, point={"id": "bench", "json": "{}"})
    row = np.zeros((), dtype=schema.RANK_DTYPE)
    writer = open_writer(path, SelfComm(), meta, n_iters, row, "gather")
    start = 0
    for block in blocks:
        writer.write_iterations(start, block)
        start += len(block)
    writer.close(schema.STATUS_COMPLETE)
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def write_raw(path: Path, blocks: list[np.ndarray]) -> None:
    with path.open("wb") as fh:
        for block in blocks:
            block.tofile(fh)
            fh.flush()
        os.fsync(fh.fileno())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--block", type=int, default=10_000, help="iterations per flush")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n_iters = args.iterations
    rng = np.random.default_rng(0)
    blocks = []
    for start in range(0, n_iters, args.block):
        block = np.zeros(min(args.block, n_iters - start), dtype=schema.ITERATION_DTYPE)
        block["t_end"] = rng.random(len(block))
        blocks.append(block)
    nbytes = sum(b.nbytes for b in blocks)
    times: dict[str, list[float]] = {"hdf5": [], "numpy": []}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for i in range(args.repeat):
            for kind in ("hdf5", "numpy") if i % 2 == 0 else ("numpy", "hdf5"):
                path = Path(tmp) / f"{kind}{i}"
                t0 = time.perf_counter()
                write_point(path, blocks, n_iters) if kind == "hdf5" else write_raw(path, blocks)
                times[kind].append(time.perf_counter() - t0)
    rate = {k: nbytes / statistics.median(v) / 1e6 for k, v in times.items()}
    print(f"{nbytes / 1e6:.0f} MB of iteration rows ({n_iters} iterations, a flush every {args.block})")
    print(f"numpy tofile: {rate['numpy']:.0f} MB/s; point-file writer: {rate['hdf5']:.0f} MB/s")
    print(f"HDF5 / raw: {rate['hdf5'] / rate['numpy']:.0%} (goal >= 50 %)")


if __name__ == "__main__":
    main()
