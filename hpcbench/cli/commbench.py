"""`python -m hpcbench.commbench`: all-reduce time and bandwidth over message sizes.

    mpirun -n 4 python -m hpcbench.commbench [--sizes 4K,64K,1M,16M] [--iters 20] [--warmup 5] [-o FILE.h5]
    torchrun --nproc-per-node 8 -m hpcbench.commbench --device cuda --sizes 1M,64M,1G

Runs under any launcher: with an MPI launcher (mpirun, srun --mpi=pmix) it uses mpi4py's
`Allreduce` on numpy float32 buffers; under torchrun (no MPI) it uses torch.distributed
over gloo. With `--device cuda` it all-reduces buffers in GPU memory through NCCL
(torch.distributed; one GPU per local rank; ranks meet through torchrun's environment, or
through MPI under an MPI launcher), in place as torch's NCCL all-reduce is, and a size's
time ends when the device has finished the last operation. Each rank times `iters`
back-to-back all-reduces of each size after a barrier, once the first has given the right
sum; the reported time per operation is the ranks' average (as nccl-tests reports it by
default; `--average` picks min, max or rank 0 instead). Bandwidths as nccl-tests defines
them: algbw = bytes / time, busbw = algbw · 2(N−1)/N for all-reduce. Rank 0 prints the
table and writes the HDF5 file (layout: hpcbench.store.commfile), which
`python -m hpcbench.analyze report DIR --commbench FILE` fits α and β on.

This module is the command (options, the ranks' times combined, table and file); the
backends and the measuring loop the ranks run are `hpcbench.rank.commbench`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import hpcbench
from hpcbench.cli import failure, textable
from hpcbench.errors import HpcbenchError
from hpcbench.launchers import detect
from hpcbench.rank.collectives import library_version
from hpcbench.rank.commbench import ELEMENT, Timing, measure, open_collectives
from hpcbench.store.commfile import KIND, RESULT_DTYPE, VERSION, bus_bandwidth

PROG = "hpcbench.commbench"
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M"
AVERAGES = ("avg", "min", "max", "rank0")
_SIZE = re.compile(r"(\d+)([KMG]?)(I?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


class UsageError(HpcbenchError):
    exit_code = 2


def parse_sizes(text: str) -> list[int]:
    """'4K,1M,100' -> bytes (K, M, G are powers of 1024), each a multiple of 4 (float32 elements)."""
    sizes = []
    for part in text.split(","):
        m = _SIZE.fullmatch(part.strip())
        if not m:
            raise UsageError(f"--sizes: {part.strip()!r} is not a size (allowed: bytes like 4096, 4K, 1M, 1G)")
        n = int(m.group(1)) * _UNITS[m.group(2).upper()]
        if n < ELEMENT.itemsize or n % ELEMENT.itemsize:
            raise UsageError(f"--sizes: {part.strip()} is not a positive multiple of {ELEMENT.itemsize} bytes")
        sizes.append(n)
    return sizes


COMBINE: dict[str, Callable[[list[float]], float]] = {
    "avg": lambda v: float(np.mean(v)),
    "min": min,
    "max": max,
    "rank0": lambda v: v[0],
}


def results(timings: Sequence[Timing], average: str, ranks: int) -> np.ndarray:
    """One RESULT_DTYPE row per size: the ranks' times combined by `average`, and the bandwidths."""
    rows = np.zeros(len(timings), dtype=RESULT_DTYPE)
    for i, (n_bytes, count, times) in enumerate(timings):
        t = COMBINE[average](times)
        algbw, busbw = bus_bandwidth("allreduce", n_bytes, t, ranks)
        rows[i] = ("allreduce", ranks, n_bytes, count, t, min(times), max(times), algbw, busbw)
    return rows


def format_results(rows: np.ndarray) -> str:
    table = [["size (B)", "count", "type", "time (us)", "min (us)", "max (us)", "algbw (GB/s)", "busbw (GB/s)"]]
    for r in rows:
        table.append(
            [
                str(int(r["bytes"])), str(int(r["count"])), "float",
                f"{r['time_s'] * 1e6:.1f}", f"{r['time_min_s'] * 1e6:.1f}", f"{r['time_max_s'] * 1e6:.1f}",
                f"{r['algbw'] / 1e9:.3f}", f"{r['busbw'] / 1e9:.3f}",
            ]
        )  # fmt: skip
    return textable.render(table, right=True)


def write_results(path: Path, rows: np.ndarray, attrs: dict[str, Any]) -> None:
    """Write the file whole or not at all (temporary name in the same directory, then rename)."""
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in attrs.items():
                is_text_list = isinstance(value, list) and all(isinstance(v, str) for v in value)
                f.attrs[key] = np.array(value, dtype=h5py.string_dtype()) if is_text_list else value
            f.create_dataset("results", data=rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mpi_attrs(backend: str) -> dict[str, str]:
    """What says which algorithm an MPI all-reduce ran (analysis/model/mpi_rules.py): the library's
    version string and the Open MPI collective settings of the environment (JSON)."""
    if backend != "mpi":
        return {}
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith("OMPI_MCA_coll")}
    return {"mpi": library_version() or "", "mpi_environment": json.dumps(settings)}


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    """The micro-benchmark on this rank; `prog` names the command in usage and error lines."""
    p = argparse.ArgumentParser(prog=prog or f"python -m {PROG}", description="All-reduce time, algbw and busbw.")
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"message sizes in bytes, K/M/G = 1024^n (default {DEFAULT_SIZES})"
    )
    p.add_argument("--iters", type=int, default=20, help="timed operations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed operations before them (default 5)")
    p.add_argument("--average", choices=AVERAGES, default="avg", help="how the ranks' times combine (default avg)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPU buffers through NCCL")
    p.add_argument("-o", "--output", help="HDF5 file to write (rank 0)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        if args.iters < 1 or args.warmup < 0:
            raise UsageError(f"--iters must be >= 1 and --warmup >= 0 (got {args.iters}, {args.warmup})")
        renv = detect()
        coll = open_collectives(renv, args.device)
        rows = results(measure(coll, sizes, args.iters, args.warmup), args.average, coll.size)
        hosts = [str(h) for h in coll.allgather(renv.hostname)]
        if coll.rank == 0:
            print(f"# all-reduce, {coll.size} ranks on {len(set(hosts))} hosts, {coll.backend}, "
                  f"time = {args.average} over ranks", file=out)  # fmt: skip
            print(format_results(rows), file=out)
            if args.output:
                attrs = {
                    "kind": KIND, "version": VERSION, "ranks": coll.size, "hostnames": hosts,
                    "backend": coll.backend, "device": args.device, "average": args.average, "iterations": args.iters,
                    "warmup": args.warmup, "launcher": renv.source, "hpcbench_version": hpcbench.__version__,
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                }  # fmt: skip
                attrs.update(_mpi_attrs(coll.backend))
                write_results(Path(args.output), rows, attrs)
                print(f"wrote {args.output}", file=out)
        coll.barrier()
        coll.close()
        return 0
    except HpcbenchError as exc:
        return failure.report(exc, prog or PROG, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
