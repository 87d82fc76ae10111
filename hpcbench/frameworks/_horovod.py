"""Bookkeeping collectives over Horovod, for jobs that Horovod started without MPI.

`horovodrun` with its Gloo controller starts ranks that have no MPI communicator, so the
store's few collectives (agree on metadata, gather blocks to one writer, barrier) go
through Horovod's own object collectives instead. Generic over the framework binding:
pass `horovod.torch`, `horovod.tensorflow` or `horovod.mxnet` (each has `rank`, `size`,
`broadcast_object` and `allgather_object`), after its `init()`.

Never used inside a timed step: every call is a pickled object through a Horovod
collective (milliseconds).
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any


class HorovodComm:
    """The `hpcbench.rank.collectives.Comm` protocol over an initialised Horovod binding."""

    def __init__(self, hvd: Any) -> None:
        self._hvd = hvd
        self.rank: int = int(hvd.rank())
        self.size: int = int(hvd.size())
        # Horovod matches collectives across ranks by name: every rank makes the same calls
        # in the same order, so a per-communicator counter gives the same names everywhere.
        self._seq = itertools.count()

    def _name(self, what: str) -> str:
        return f"hpcbench.bookkeeping.{what}.{next(self._seq)}"

    @property
    def mpi_comm(self) -> Any | None:
        return None

    def barrier(self) -> None:
        self.allgather(None)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._hvd.broadcast_object(obj, root_rank=root, name=self._name("bcast"))

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        # Horovod has no gather: an allgather, kept only on the root.
        everything = self.allgather(obj)
        return everything if self.rank == root else None

    def allgather(self, obj: Any) -> list[Any]:
        return list(self._hvd.allgather_object(obj, name=self._name("allgather")))

    def abort(self, code: int = 1) -> None:
        # horovodrun stops the other ranks when one exits with an error.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
