"""Run under mpirun by test_store_mpi.py: every rank writes known rows through a writer.

usage: write_point.py OUT.h5 WRITER N_ITERS FLUSH_EVERY [--die-after-blocks K | --die-creating]

--die-creating: every rank that lays out the new file is SIGKILLed once it has done so,
before the file's first flush (the moment a job killed at start-up can hit).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

from hpcbench.launchers import detect
from hpcbench.rank.collectives import Comm, MPIComm, SelfComm
from hpcbench.store import schema, writer
from hpcbench.store.writer import FileMeta, choose_writer, open_writer


def _die_creating() -> None:
    lay_out = writer._create_layout

    def lay_out_and_die(*args: object, **kwargs: object) -> None:
        lay_out(*args, **kwargs)  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGKILL)

    writer._create_layout = lay_out_and_die


def main() -> None:
    out, mode, n_iters, flush_every = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    die_after = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    if sys.argv[5:] == ["--die-creating"]:
        _die_creating()
    renv = detect()
    comm: Comm = MPIComm() if renv.mpi else SelfComm()
    kind = choose_writer(comm, mode)
    meta = FileMeta(
        root={"sweep": "store-test", "epoch_ns": 0},
        point={"id": "test", "json": '{"framework": "torch"}'},
        provenance={"writer": kind, "hostnames": comm.allgather(renv.hostname)},
    )
    row = np.array((comm.rank, renv.local_rank, 0, os.getpid(), 0, renv.hostname.encode()), dtype=schema.RANK_DTYPE)
    point = open_writer(out, comm, meta, n_iters, row, kind)
    for blocks, start in enumerate(range(0, n_iters, flush_every), start=1):
        n = min(flush_every, n_iters - start)
        rows = np.zeros(n, dtype=schema.ITERATION_DTYPE)
        it = np.arange(start, start + n)
        rows["samples"] = comm.rank * 1000 + it
        rows["forward"] = comm.rank + it / 100
        point.write_iterations(start, rows)
        if blocks == die_after:
            comm.barrier()
            if comm.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.barrier()  # rank 0 waits here until mpirun ends the job
    point.close(schema.STATUS_COMPLETE)


if __name__ == "__main__":
    main()
