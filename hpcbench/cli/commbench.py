"""`python -m hpcbench.commbench`: all-reduce time and bandwidth over message sizes.

    mpirun -n 4 python -m hpcbench.commbench [--sizes 4K,64K,1M,16M] [--iters 20] [--warmup 5] [-o FILE.h5 [--force]]
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

Before any rank measures or allocates, the ranks agree on what would be refused:
`-o FILE` follows the output policy of hpcbench.sweepdir.outputs (checked by rank 0: never a
sweep directory's own name, an existing file without `--force`, nor a directory, device,
FIFO, socket or link; written whole, mode 0666 less the umask), and a size whose buffers
(BUFFERS per rank) do not fit in the memory its host has available (MemAvailable, or free
GPU memory with `--device cuda`; shared by that host's ranks) is refused. Exit status: 0
done; 1 an all-reduce gave a wrong sum (the results show a broken setup); 2 bad input of
any kind (an option's value, a refused output or size, `--device cuda` without a GPU), one
line on stderr said by rank 0 where every rank finds the same, no traceback without -v.

This module is the command (options, the ranks' times combined, table and file); the
backends and the measuring loop the ranks run are `hpcbench.rank.commbench`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np

import hpcbench
from hpcbench.cli import failure, textable
from hpcbench.cli.pipes import quiet_on_closed_pipe
from hpcbench.errors import HpcbenchError, one_line
from hpcbench.launchers import detect
from hpcbench.rank.collectives import library_version
from hpcbench.rank.commbench import BUFFERS, ELEMENT, Collectives, Timing, WrongSum, measure, open_collectives
from hpcbench.rank.env import RankEnv
from hpcbench.store.commfile import KIND, RESULT_DTYPE, VERSION, bus_bandwidth
from hpcbench.sweepdir.outputs import OutputFile

PROG = "hpcbench.commbench"
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M"
AVERAGES = ("avg", "min", "max", "rank0")
_SIZE = re.compile(r"(\d+)([KMG]?)(I?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
OUTPUT_OPTION = "-o/--output"


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


def size_text(n: int) -> str:
    """Bytes as --sizes writes them: 1073741824 -> '1G', 4100 -> '4100'."""
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def _amount(n: float) -> str:
    """Bytes for a person: '14.6 GiB', '512.0 MiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def parse_count(option: str, text: str, least: int) -> int:
    """A whole number of operations, at least `least`; one line naming the option otherwise."""
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not a whole number") from None
    if value < least:
        raise UsageError(f"{option}: {value} is less than {least}")
    return value


Pool = tuple[str, str, "int | None"]  # a rank's (host, where its buffers live, bytes free there)


def memory_refusal(sizes: Sequence[int], pools: Sequence[Pool], names: Mapping[int, str] | None = None) -> str | None:
    """Why the largest size cannot be measured (None: it fits): every rank holds BUFFERS
    buffers of it, and the ranks of a host that name the same place for their buffers share
    what is free there (the least any of them saw). `names`: the sizes as the user wrote them."""
    largest = max(sizes)
    shared: dict[tuple[str, str], list[int | None]] = {}
    for host, where, free in pools:
        shared.setdefault((host, where), []).append(free)
    for (host, where), frees in shared.items():
        known = [f for f in frees if f is not None]
        if not known:
            continue
        free, ranks = min(known), len(frees)
        need = BUFFERS * largest * ranks
        if need > free:
            most = free // (BUFFERS * ranks)
            per = "its rank" if ranks == 1 else f"each of its {ranks} ranks"
            name = (names or {}).get(largest, size_text(largest))
            return (f"--sizes: {name} needs {_amount(need)} of {where} on host {host} ({BUFFERS} buffers of it on "
                    f"{per}), more than the {_amount(free)} available there; sizes up to {_amount(most)} "
                    "fit")  # fmt: skip
    return None


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
    """Write a commbench file at `path` (h5py; the command writes the claimed temporary file of
    its -o output, which is then put in place whole)."""
    import h5py

    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            is_text_list = isinstance(value, list) and all(isinstance(v, str) for v in value)
            f.attrs[key] = np.array(value, dtype=h5py.string_dtype()) if is_text_list else value
        f.create_dataset("results", data=rows)


def _mpi_attrs(backend: str) -> dict[str, str]:
    """What says which algorithm an MPI all-reduce ran (analysis/model/mpi_rules.py): the library's
    version string and the Open MPI collective settings of the environment (JSON)."""
    if backend != "mpi":
        return {}
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith("OMPI_MCA_coll")}
    return {"mpi": library_version() or "", "mpi_environment": json.dumps(settings)}


class _Agreed(Exception):
    """An error every rank knows of (found alike, or agreed through a collective): `error` on
    the rank that says it (rank 0), None on the others, which end with `code` alone, so that
    the error is one line whatever the number of ranks and no rank waits for another."""

    def __init__(self, error: BaseException | None, code: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.code = code


def _said_by_rank0(error: BaseException, rank: int, code: int = failure.BAD_INPUT) -> _Agreed:
    return _Agreed(error if rank == 0 else None, code)


class _Parser(argparse.ArgumentParser):
    """Its errors are one line on stderr, `NAME: error: ...` as the command's others (said by
    rank 0 alone: every rank finds the same), exit 2."""

    name = PROG
    quiet = False

    def error(self, message: str) -> NoReturn:
        if not self.quiet:
            print(f"{self.name}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(failure.BAD_INPUT)


def _where(coll: Collectives) -> tuple[str, int | None]:
    try:
        return coll.memory()
    except Exception:  # noqa: BLE001 - unknown room is no refusal: the allocation says it
        return "memory", None


def _claim(args: argparse.Namespace) -> tuple[OutputFile | None, BaseException | None]:
    """Rank 0's -o output, checked and claimed (folders made, temporary file); or why not."""
    if args.output is None:
        return None, None
    try:
        return OutputFile(args.output, option=OUTPUT_OPTION, force=args.force, hdf5=True), None
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank must learn of it
        return None, exc


def _run(args: argparse.Namespace, renv: RankEnv, out: TextIO) -> int:
    try:  # what every rank finds alike, before any collective
        sizes = parse_sizes(args.sizes)
        iters = parse_count("--iters", args.iters, 1)
        warmup = parse_count("--warmup", args.warmup, 0)
    except UsageError as exc:
        raise _said_by_rank0(exc, renv.rank) from None
    names = dict(zip(sizes, (part.strip() for part in args.sizes.split(",")), strict=True))
    coll = open_collectives(renv, args.device)
    with contextlib.ExitStack() as stack:
        # Before any rank measures or allocates: rank 0 claims the output, every rank says where
        # its buffers live and how much room is there; one all-gather, so every rank decides alike.
        output, refused = _claim(args) if coll.rank == 0 else (None, None)
        if output is not None:
            try:
                stack.enter_context(output)
            except Exception as exc:  # noqa: BLE001 - a folder that cannot be made or written
                refused = exc
        gathered = coll.allgather((renv.hostname, *_where(coll), refused is not None))
        hosts = [str(g[0]) for g in gathered]
        if gathered[0][3]:
            coll.close()
            raise _said_by_rank0(refused or UsageError(f"{OUTPUT_OPTION}: refused by rank 0"), coll.rank)
        too_large = memory_refusal(sizes, [(g[0], g[1], g[2]) for g in gathered], names)
        if too_large is not None:
            coll.close()
            raise _said_by_rank0(UsageError(too_large), coll.rank)
        try:
            rows = results(measure(coll, sizes, iters, warmup), args.average, coll.size)
        except WrongSum as exc:  # raised on every rank alike
            coll.close()
            raise _said_by_rank0(exc, coll.rank, failure.PROBLEM) from exc
        failed: BaseException | None = None
        if coll.rank == 0:
            print(f"# all-reduce, {coll.size} ranks on {len(set(hosts))} hosts, {coll.backend}, "
                  f"time = {args.average} over ranks", file=out)  # fmt: skip
            print(format_results(rows), file=out)
            if output is not None:
                attrs = {
                    "kind": KIND, "version": VERSION, "ranks": coll.size, "hostnames": hosts,
                    "backend": coll.backend, "device": args.device, "average": args.average, "iterations": iters,
                    "warmup": warmup, "launcher": renv.source, "hpcbench_version": hpcbench.__version__,
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                }  # fmt: skip
                attrs.update(_mpi_attrs(coll.backend))
                try:
                    write_results(output.temporary, rows, attrs)
                    output.commit()
                except Exception as exc:  # noqa: BLE001 - the other ranks wait to hear how it went
                    failed = exc
        if coll.allgather(failed is not None)[0]:  # in place of a barrier: every rank learns rank 0's outcome
            coll.close()
            raise _said_by_rank0(failed or UsageError(f"{OUTPUT_OPTION}: not written by rank 0"), coll.rank)
    if coll.rank == 0 and output is not None:
        print(f"wrote {args.output}", file=out)
    coll.close()
    return failure.OK


def _rank() -> int:
    """This process's rank as its launcher's variables say (0 where they say nothing)."""
    try:
        return detect().rank
    except Exception:  # noqa: BLE001 - then every rank speaks for itself
        return 0


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, prog: str | None = None) -> int:
    """The micro-benchmark on this rank; `prog` names the command in usage and error lines."""
    name = prog or PROG
    p = _Parser(prog=prog or f"python -m {PROG}", description="All-reduce time, algbw and busbw.")
    p.name, p.quiet = name, _rank() != 0
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"message sizes in bytes, K/M/G = 1024^n (default {DEFAULT_SIZES})"
    )
    p.add_argument("--iters", default="20", help="timed operations per size (default 20)")
    p.add_argument("--warmup", default="5", help="untimed operations before them (default 5)")
    p.add_argument("--average", choices=AVERAGES, default="avg", help="how the ranks' times combine (default avg)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: GPU buffers through NCCL")
    p.add_argument("-o", "--output", help="HDF5 file to write (rank 0): a new file, or an existing one with --force")
    p.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    args = p.parse_args(argv)

    def command() -> int:
        try:
            return _run(args, detect(), out)
        except _Agreed as agreed:
            if agreed.error is None:  # rank 0 says it
                return agreed.code
            if isinstance(agreed.error, HpcbenchError) and agreed.code != failure.BAD_INPUT:
                return failure.report(agreed.error, name, args.verbose, exit_code=agreed.code)
            raise agreed.error from None

    return failure.guarded(command, name, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
