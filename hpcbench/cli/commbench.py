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
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

import hpcbench
from hpcbench.cli import failure, textable
from hpcbench.errors import HpcbenchError
from hpcbench.launchers import detect
from hpcbench.rank import env as rankenv
from hpcbench.rank.collectives import library_version
from hpcbench.rank.net import free_port
from hpcbench.store.commfile import KIND, RESULT_DTYPE, VERSION, bus_bandwidth

PROG = "hpcbench.commbench"
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M"
ELEMENT = np.dtype(np.float32)
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


class _Collectives(Protocol):
    """The few operations the benchmark needs, from MPI or from torch.distributed."""

    rank: int
    size: int
    backend: str

    def buffers(self, count: int) -> tuple[Any, Any]:
        """(send, recv) of `count` float32 elements, send all ones."""
        ...

    def allreduce(self, send: Any, recv: Any) -> None: ...

    def verify(self, send: Any, recv: Any) -> bool:
        """One all-reduce of `send` into `recv`: True if every element is the sum, `size`."""
        ...

    def sync(self) -> None:
        """Wait until the operations queued so far are done (a device's; nothing on the host)."""
        ...

    def close(self) -> None:
        """Release the backend (after the last collective)."""
        ...

    def barrier(self) -> None: ...

    def gather_float(self, value: float) -> list[float]: ...

    def allgather_str(self, value: str) -> list[str]: ...


class _HostBuffers(ABC):
    """numpy buffers, all-reduced out of place: what MPI and gloo time."""

    size: int

    @abstractmethod
    def allreduce(self, send: np.ndarray, recv: np.ndarray) -> None: ...

    def buffers(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        send = np.ones(count, dtype=ELEMENT)
        return send, np.empty_like(send)

    def verify(self, send: np.ndarray, recv: np.ndarray) -> bool:
        self.allreduce(send, recv)
        return bool(np.all(recv == self.size))

    def sync(self) -> None:  # noqa: B027 - host operations are done when they return
        pass

    def close(self) -> None:  # noqa: B027 - MPI ends with the interpreter
        pass


class _Mpi(_HostBuffers):
    def __init__(self) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank, self.size, self.backend = self._comm.Get_rank(), self._comm.Get_size(), "mpi"

    def allreduce(self, send: np.ndarray, recv: np.ndarray) -> None:
        self._comm.Allreduce(send, recv, op=self._mpi.SUM)

    def barrier(self) -> None:
        self._comm.Barrier()

    def gather_float(self, value: float) -> list[float]:
        return [float(v) for v in self._comm.allgather(value)]

    def allgather_str(self, value: str) -> list[str]:
        return [str(v) for v in self._comm.allgather(value)]


class _TorchObjects:
    """The bookkeeping collectives through torch.distributed's object collectives."""

    size: int
    _dist: Any

    def gather_float(self, value: float) -> list[float]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, value)
        return [float(v) for v in out]

    def allgather_str(self, value: str) -> list[str]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, value)
        return [str(v) for v in out]


class _Gloo(_TorchObjects, _HostBuffers):
    def __init__(self, renv: rankenv.RankEnv) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        dist.init_process_group("gloo", rank=renv.rank, world_size=renv.size)
        self.rank, self.size, self.backend = renv.rank, renv.size, "gloo"

    def allreduce(self, send: np.ndarray, recv: np.ndarray) -> None:
        tensor = self._torch.from_numpy(recv)
        np.copyto(recv, send)
        self._dist.all_reduce(tensor)

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        self._dist.destroy_process_group()


class _Nccl(_TorchObjects):
    """torch.distributed over NCCL on buffers in GPU memory (what nccl-tests measures)."""

    def __init__(self, renv: rankenv.RankEnv) -> None:
        import torch
        import torch.distributed as dist

        if not torch.cuda.is_available():
            raise HpcbenchError("--device cuda: no CUDA device is visible to this rank (use --device cpu)")
        self._torch, self._dist = torch, dist
        torch.cuda.set_device(renv.local_rank % torch.cuda.device_count())
        self._device = torch.device("cuda", torch.cuda.current_device())
        init = _rendezvous(renv)
        dist.init_process_group("nccl", init_method=init, rank=renv.rank, world_size=renv.size, device_id=self._device)
        self.rank, self.size, self.backend = renv.rank, renv.size, "nccl"

    def buffers(self, count: int) -> tuple[Any, Any]:
        send = self._torch.ones(count, dtype=self._torch.float32, device=self._device)
        return send, self._torch.empty_like(send)

    def allreduce(self, send: Any, recv: Any) -> None:
        self._dist.all_reduce(recv)  # in place: torch's NCCL all-reduce has no separate output

    def verify(self, send: Any, recv: Any) -> bool:
        recv.copy_(send)
        self._dist.all_reduce(recv)
        return bool((recv == self.size).all().item())

    def sync(self) -> None:
        self._torch.cuda.synchronize(self._device)

    def close(self) -> None:
        self._dist.destroy_process_group()

    def barrier(self) -> None:
        self._dist.barrier(device_ids=[self._device.index])


def _rendezvous(renv: rankenv.RankEnv) -> str:
    """Where NCCL's ranks meet: torchrun's MASTER_ADDR/PORT; else rank 0's host and a free
    port, sent to the others through MPI; else (one rank) this host."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return "env://"
    if renv.mpi:
        from mpi4py import MPI

        here = f"tcp://{renv.hostname}:{free_port()}" if MPI.COMM_WORLD.Get_rank() == 0 else None
        return str(MPI.COMM_WORLD.bcast(here, root=0))
    if renv.size == 1:
        return f"tcp://127.0.0.1:{free_port()}"
    raise HpcbenchError(
        f"--device cuda: {renv.size} ranks started by {renv.source} without MPI or MASTER_ADDR/MASTER_PORT; "
        "start them with torchrun or an MPI launcher"
    )


def _collectives(renv: rankenv.RankEnv, device: str = "cpu") -> _Collectives:
    if device == "cuda":
        return _Nccl(renv)
    if renv.mpi or renv.size == 1:
        return _Mpi()
    try:
        return _Gloo(renv)
    except ImportError:
        raise HpcbenchError(
            f"{renv.size} ranks started by {renv.source} without MPI: commbench needs an MPI launcher "
            "(mpirun, srun --mpi=pmix) or torch for torch.distributed over gloo"
        ) from None


COMBINE: dict[str, Callable[[list[float]], float]] = {
    "avg": lambda v: float(np.mean(v)),
    "min": min,
    "max": max,
    "rank0": lambda v: v[0],
}


def measure(coll: _Collectives, sizes: Sequence[int], iters: int, warmup: int, average: str) -> np.ndarray:
    """One RESULT_DTYPE row per size (the same on every rank)."""
    rows = np.zeros(len(sizes), dtype=RESULT_DTYPE)
    for i, n_bytes in enumerate(sizes):
        count = n_bytes // ELEMENT.itemsize
        send, recv = coll.buffers(count)
        if not coll.verify(send, recv):  # a wrong sum means the timings would be of something else
            raise HpcbenchError(f"all-reduce of {n_bytes} bytes gave a wrong sum; the {coll.backend} setup is broken")
        for _ in range(warmup):
            coll.allreduce(send, recv)
        coll.sync()
        coll.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            coll.allreduce(send, recv)
        coll.sync()
        elapsed = (time.perf_counter() - start) / iters
        times = coll.gather_float(elapsed)
        t = COMBINE[average](times)
        algbw, busbw = bus_bandwidth("allreduce", n_bytes, t, coll.size)
        rows[i] = ("allreduce", coll.size, n_bytes, count, t, min(times), max(times), algbw, busbw)
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
        coll = _collectives(renv, args.device)
        rows = measure(coll, sizes, args.iters, args.warmup, args.average)
        hosts = coll.allgather_str(renv.hostname)
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
