"""Bookkeeping collectives between the ranks of one job (never used inside a timed step).

The store needs a few collectives to build one shared file: agree on metadata, gather
blocks to one writer, abort everyone when one rank fails. They come from MPI when the job
was started by an MPI launcher, from the framework's own process group otherwise
(torchrun), or from nothing at all for a single process.

`Group` is the part of `Comm` that any group of ranks offers (the collective micro-benchmark's
groups, `hpcbench.rank.commbench`, are one); `MPIComm.allreduce_buffer` is the all-reduce of
numpy buffers that the micro-benchmark times.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol


class Group(Protocol):
    """A group of ranks: its size, this rank's place in it, a barrier and an all-gather of objects."""

    rank: int
    size: int

    def barrier(self) -> None: ...

    def allgather(self, obj: Any) -> list[Any]: ...


class Comm(Group, Protocol):
    """The bookkeeping collectives of a job."""

    @property
    def mpi_comm(self) -> Any | None:
        """The mpi4py communicator, if any (needed by parallel HDF5)."""

    def bcast(self, obj: Any, root: int = 0) -> Any: ...

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None: ...

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now. Does not return."""


class SelfComm:
    """The communicator of a job with one rank."""

    rank = 0
    size = 1

    @property
    def mpi_comm(self) -> Any | None:
        return None

    def barrier(self) -> None:
        pass

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return [obj]

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def abort(self, code: int = 1) -> None:
        sys.stderr.flush()
        os._exit(code)


class MPIComm:
    """mpi4py's COMM_WORLD. Importing mpi4py initialises MPI (thread level: multiple)."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()

    @property
    def mpi_comm(self) -> Any | None:
        return self._comm

    def barrier(self) -> None:
        self._comm.Barrier()

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._comm.bcast(obj, root=root)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        result: list[Any] | None = self._comm.gather(obj, root=root)
        return result

    def allgather(self, obj: Any) -> list[Any]:
        result: list[Any] = self._comm.allgather(obj)
        return result

    def allreduce_buffer(self, send: Any, recv: Any) -> None:
        """`recv` = the element-wise sum of every rank's `send` (numpy arrays of one shape and dtype)."""
        self._comm.Allreduce(send, recv, op=self._mpi.SUM)

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._comm.Abort(code)


def library_version() -> str | None:
    """The MPI library's own version string, or None when mpi4py is not importable."""
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:
            # Asking for the version is allowed before MPI_Init: do not initialise MPI in a
            # process that was not started by an MPI launcher.
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
        from mpi4py import MPI
    except ImportError:
        return None
    return str(MPI.Get_library_version()).replace("\0", "").strip().splitlines()[0]
