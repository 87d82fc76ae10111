"""Bookkeeping collectives of PyTorch ranks that have no MPI between them (torchrun)."""

from __future__ import annotations

import os
from typing import Any


class TorchComm:
    """Bookkeeping collectives over a gloo group, for jobs without MPI (torchrun)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = dist.new_group(backend="gloo")
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    @property
    def mpi_comm(self) -> Any | None:
        return None

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self._group)
        return box[0]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.size if self.rank == root else None
        self._dist.gather_object(obj, out, dst=root, group=self._group)
        return out

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def abort(self, code: int = 1) -> None:
        os._exit(code)  # torchrun ends the other workers of the group
