"""What the micro-benchmark all-reduces in: MPI or torch.distributed over gloo on host buffers,
torch.distributed over NCCL on GPU buffers.

Each backend is a `hpcbench.rank.collectives.Group` (barrier, all-gather: the bookkeeping
between sizes) with the operations on buffers that the loop times. Under an MPI launcher
(or alone) the group is MPI's `MPIComm`, and its all-reduce `MPIComm.allreduce_buffer`;
under torchrun (no MPI) torch.distributed's default group over gloo. With `--device cuda`
the buffers are in GPU memory and all-reduced through NCCL (one GPU per local rank; ranks
meet through torchrun's environment, or through MPI under an MPI launcher), in place as
torch's NCCL all-reduce is.

`BUFFERS` buffers of a size are held at once (send and receive; the loop frees a size's before
the next's), and `Collectives.memory` says how much room there is for them, so that the
command refuses a size that cannot fit before any rank allocates it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.rank import env as rankenv
from hpcbench.rank.collectives import Group, MPIComm
from hpcbench.rank.commbench.memory import available_memory
from hpcbench.rank.net import free_port

ELEMENT = np.dtype(np.float32)
BUFFERS = 2  # buffers of one size that a rank holds at once: `buffers` (send, recv)


class Collectives(Group, Protocol):
    """The group of the benchmark's ranks and the operations on buffers it times."""

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

    def memory(self) -> tuple[str, int | None]:
        """Where this rank's buffers live, in words ('memory', 'GPU cuda:0 memory'; ranks on one
        host that name the same share it), and the bytes free there now (None: unknown)."""
        ...

    def close(self) -> None:
        """Release the backend (after the last collective)."""
        ...


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

    def memory(self) -> tuple[str, int | None]:
        return "memory", available_memory()

    def close(self) -> None:  # noqa: B027 - MPI ends with the interpreter
        pass


class _Mpi(_HostBuffers, MPIComm):
    """MPI's COMM_WORLD: its barrier and all-gather, and its all-reduce of numpy buffers."""

    backend = "mpi"

    def allreduce(self, send: np.ndarray, recv: np.ndarray) -> None:
        self.allreduce_buffer(send, recv)


class _TorchGroup:
    """torch.distributed's default group, which the backend starts and `close` ends."""

    size: int
    _dist: Any

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        self._dist.destroy_process_group()


class _Gloo(_TorchGroup, _HostBuffers):
    backend = "gloo"

    def __init__(self, renv: rankenv.RankEnv) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        dist.init_process_group("gloo", rank=renv.rank, world_size=renv.size)
        self.rank, self.size = renv.rank, renv.size

    def allreduce(self, send: np.ndarray, recv: np.ndarray) -> None:
        tensor = self._torch.from_numpy(recv)
        np.copyto(recv, send)
        self._dist.all_reduce(tensor)

    def barrier(self) -> None:
        self._dist.barrier()


class _Nccl(_TorchGroup):
    """torch.distributed over NCCL on buffers in GPU memory (what nccl-tests measures)."""

    backend = "nccl"

    def __init__(self, renv: rankenv.RankEnv) -> None:
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise HpcbenchError("--device cuda: needs torch with CUDA, which this Python cannot import") from None
        if not torch.cuda.is_available():
            raise HpcbenchError("--device cuda: no CUDA device is visible to this rank (use --device cpu)")
        self._torch, self._dist = torch, dist
        torch.cuda.set_device(renv.local_rank % torch.cuda.device_count())
        self._device = torch.device("cuda", torch.cuda.current_device())
        init = _rendezvous(renv)
        dist.init_process_group("nccl", init_method=init, rank=renv.rank, world_size=renv.size, device_id=self._device)
        self.rank, self.size = renv.rank, renv.size

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

    def memory(self) -> tuple[str, int | None]:
        free, _total = self._torch.cuda.mem_get_info(self._device)
        return f"GPU {self._device} memory", int(free)

    def barrier(self) -> None:
        self._dist.barrier(device_ids=[self._device.index])


def _rendezvous(renv: rankenv.RankEnv) -> str:
    """Where NCCL's ranks meet: torchrun's MASTER_ADDR/PORT; else rank 0's host and a free
    port, sent to the others through MPI; else (one rank) this host."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return "env://"
    if renv.mpi:
        comm = MPIComm()
        here = f"tcp://{renv.hostname}:{free_port()}" if comm.rank == 0 else None
        return str(comm.bcast(here, root=0))
    if renv.size == 1:
        return f"tcp://127.0.0.1:{free_port()}"
    raise HpcbenchError(
        f"--device cuda: {renv.size} ranks started by {renv.source} without MPI or MASTER_ADDR/MASTER_PORT; "
        "start them with torchrun or an MPI launcher"
    )


def open_collectives(renv: rankenv.RankEnv, device: str = "cpu") -> Collectives:
    """The backend for this rank: NCCL for `device` cuda; else MPI under an MPI launcher or
    alone, torch.distributed over gloo otherwise."""
    if device == "cuda":
        return _Nccl(renv)
    if renv.mpi or renv.size == 1:
        try:
            return _Mpi()
        except ImportError:
            where = "alone" if renv.size == 1 else f"under {renv.source}"
            raise HpcbenchError(f"commbench {where} all-reduces through MPI: it needs mpi4py, which this Python "
                                "cannot import") from None  # fmt: skip
    try:
        return _Gloo(renv)
    except ImportError:
        raise HpcbenchError(
            f"{renv.size} ranks started by {renv.source} without MPI: commbench needs an MPI launcher "
            "(mpirun, srun --mpi=pmix) or torch for torch.distributed over gloo"
        ) from None
