"""A rank's memory: its cap (the point's `memory_limit_gb`), telling an out-of-memory error
from any other failure, and what the rank had reached when it ran out.

A layout that runs out of memory is a result, not a crash: the rank that ran out writes one
account line (rank/failures.py) with the facts below and ends the job with `EXIT_CODE`; the
executor then records the point `out_of_memory` (store/status.py), and a resume leaves it.

The cap, applied before the model is built:

* on a CPU, `RLIMIT_DATA` (the process's heap and private anonymous mappings, what it holds
  already included; Linux 4.7 and later count mmap as well as brk). Not `RLIMIT_AS`, which
  the address reservations of frameworks and MPI trip long before any memory is used. An
  allocation past it fails cleanly: PyTorch's `DefaultCPUAllocator: can't allocate memory`,
  numpy's and Python's `MemoryError`;
* on a GPU under PyTorch, `torch.cuda.set_per_process_memory_fraction` (the caching
  allocator raises `torch.OutOfMemoryError` past it; device memory only);
* elsewhere (another framework on a GPU) it is not applied, and the provenance says so.
"""

from __future__ import annotations

import errno
import json
import resource
from dataclasses import asdict, dataclass
from typing import Any

EXIT_CODE = 76  # a rank ran out of memory (stop.EXIT_CODE, 75, is a stop on request)
GB = 2**30  # `memory_limit_gb` counts GiB, as `free -g` and Slurm's --mem=NG do

# Types whose name says memory ran out, wherever they are defined (no framework imported):
# torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), TensorFlow's ResourceExhaustedError
_OOM_TYPES = ("OutOfMemoryError", "ResourceExhaustedError")
# Messages of the generic error types the frameworks raise when an allocation fails
_OOM_TEXT = (
    "can't allocate memory",  # PyTorch's CPU allocator (RuntimeError)
    "out of memory",  # CUDA's and PyTorch's ("CUDA out of memory", "CUDA error: out of memory")
    "resource_exhausted",  # XLA's status code (JAX's XlaRuntimeError: "RESOURCE_EXHAUSTED: ...")
    "cudaerrormemoryallocation",
    "std::bad_alloc",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True if `exc`, or an exception it was raised from or while handling, says memory ran
    out: Python's (and numpy's) MemoryError, an OSError of ENOMEM, torch.OutOfMemoryError, the CPU allocator's
    RuntimeError, TensorFlow's ResourceExhaustedError, XLA's RESOURCE_EXHAUSTED."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or (isinstance(current, OSError) and current.errno == errno.ENOMEM):
            return True
        if any(t.__name__ in _OOM_TYPES for t in type(current).__mro__):
            return True
        if isinstance(current, Exception) and not isinstance(current, (KeyboardInterrupt, OSError)):
            text = str(current).lower()
            if any(words in text for words in _OOM_TEXT):
                return True
        current = current.__cause__ or current.__context__
    return False


def peak_rss_bytes() -> int:
    """The most resident memory this process has held (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def apply_limit(limit_gb: float | None, device: str, framework: str, gpu: int | None) -> str:
    """Cap this rank's memory at `limit_gb` GiB; what was applied, as the provenance records
    it ('' without a limit, "not applied: <why>" where it cannot be)."""
    if limit_gb is None:
        return ""
    limit = int(limit_gb * GB)
    if device == "cuda":
        if framework != "torch" or gpu is None:
            return f"not applied: {framework} on a GPU has no per-process cap here"
        import torch

        total = torch.cuda.get_device_properties(gpu).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), gpu)
        return f"{limit} bytes of GPU {gpu} (torch.cuda.set_per_process_memory_fraction)"
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and hard < limit:
        limit = hard
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return f"{limit} bytes (RLIMIT_DATA)"


def lift_limit() -> None:
    """Give back the room the cap took (soft RLIMIT_DATA up to the hard one), so that a rank
    that ran out can still write its account and end."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


@dataclass(frozen=True)
class OutOfMemory:
    """What a rank that ran out of memory knew: where, and how much it had reached."""

    rank: int
    phase: str  # the worker's stage: build, step, test pass, flush, ...
    iteration: int  # the iteration it was in (-1 before the loop)
    peak_rss_bytes: int  # the rank's peak resident memory
    device_peak_bytes: int  # its framework allocator's device peak (-1: none, e.g. on a CPU)
    limit_bytes: int  # the point's cap (-1: none)
    error: str  # the exception's last line

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> OutOfMemory:
        data: dict[str, Any] = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def summary(self) -> str:
        """One line: `rank 1 ran out of memory in step at iteration 3: peak RSS 1.21 GiB of 1.50 GiB`."""
        where = f"in {self.phase}" + (f" at iteration {self.iteration}" if self.iteration >= 0 else "")
        reached = f"peak RSS {self.peak_rss_bytes / GB:.2f} GiB"
        if self.device_peak_bytes >= 0:
            reached += f", device peak {self.device_peak_bytes / GB:.2f} GiB"
        if self.limit_bytes >= 0:
            reached += f" (limit {self.limit_bytes / GB:.2f} GiB)"
        return f"rank {self.rank} ran out of memory {where}: {reached}"
