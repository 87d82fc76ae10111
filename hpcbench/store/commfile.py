"""The HDF5 file the collective micro-benchmark (`hpcbench commbench`) writes.

::

    /            attrs: kind = "hpcbench-commbench", version, ranks, hostnames, backend,
                        average (how per-rank times became one: avg | min | max | rank0),
                        iterations, warmup, created, hpcbench_version; with backend "mpi"
                        also mpi (the MPI library's version string) and mpi_environment
                        (JSON: the OMPI_MCA_coll* settings the ranks ran with)
    /results     (n_sizes,) RESULT_DTYPE, one row per collective and message size

Bandwidths as nccl-tests defines them: algbw = bytes / time; busbw = algbw times the
collective's bus factor (all-reduce 2(p-1)/p, reduce-scatter and all-gather (p-1)/p,
broadcast and reduce 1). Reading it back needs no MPI (`read_results`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from hpcbench.errors import HpcbenchError

KIND = "hpcbench-commbench"
VERSION = 1

RESULT_DTYPE = np.dtype(
    [
        ("op", "S16"),
        ("ranks", "<i4"),
        ("bytes", "<i8"),
        ("count", "<i8"),  # elements (float32)
        ("time_s", "<f8"),  # per operation, the ranks' times combined as `average` says
        ("time_min_s", "<f8"),  # fastest rank
        ("time_max_s", "<f8"),  # slowest rank
        ("algbw", "<f8"),  # bytes / time_s, bytes per second
        ("busbw", "<f8"),  # algbw times the collective's bus factor (nccl-tests)
    ]
)


def _allreduce_factor(p: int) -> float:
    return 2 * (p - 1) / p


def _gather_factor(p: int) -> float:
    return (p - 1) / p


def _one(p: int) -> float:
    return 1.0


BUS_FACTOR: dict[str, Callable[[int], float]] = {  # busbw = algbw * factor, as nccl-tests defines it
    "allreduce": _allreduce_factor,
    "reducescatter": _gather_factor,
    "allgather": _gather_factor,
    "alltoall": _gather_factor,
    "broadcast": _one,
    "reduce": _one,
    "send": _one,
    "recv": _one,
}


def bus_bandwidth(op: str, n_bytes: float, seconds: float, p: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of one collective of n bytes over p ranks taking `seconds`."""
    if op not in BUS_FACTOR:
        raise HpcbenchError(f"unknown collective {op!r} (known: {', '.join(BUS_FACTOR)})")
    algbw = n_bytes / seconds
    return algbw, algbw * BUS_FACTOR[op](p)


def read_results(path: Path | str) -> np.ndarray:
    """The /results rows of a commbench file; refuses other files and newer versions."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("kind") != KIND or "results" not in f:
                raise HpcbenchError(f"{path}: not a commbench file (run hpcbench commbench -o FILE)")
            if int(f.attrs.get("version", 0)) > VERSION:
                raise HpcbenchError(f"{path}: commbench file version {f.attrs['version']} is newer than this hpcbench")
            rows: np.ndarray = f["results"][()]
    except OSError as exc:
        raise HpcbenchError(f"{path}: not a readable HDF5 file ({exc})") from None
    return rows
