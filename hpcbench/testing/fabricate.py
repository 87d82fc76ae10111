"""Point files with known contents, written through the real writer, without running ranks.

For tests with hand-computed answers and for the analysis scale benchmark. The store's
one-writer path (`GatherWriter`) gathers each rank's blocks at rank 0 and writes them; here
one process plays rank 0 of an N-rank job and hands the writer every rank's blocks as
the gathers' results, so the file is byte for byte what a real N-rank job would write.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import hpcbench
from hpcbench.rank.collectives import SelfComm
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.writer import FileMeta, GatherWriter


class _PlayedComm(SelfComm):
    """Rank 0 of `size` ranks whose gathers return blocks queued beforehand (one list per call)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.queue: collections.deque[list[Any]] = collections.deque()

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        blocks = self.queue.popleft()
        if len(blocks) != self.size:
            raise AssertionError(f"{len(blocks)} blocks queued for {self.size} ranks")
        return blocks

    def allgather(self, obj: Any) -> list[Any]:
        return [obj] * self.size

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)


def _by_rank(rows: np.ndarray | None, n_ranks: int) -> list[np.ndarray | None]:
    if rows is None or len(rows) == 0:
        return [None] * n_ranks
    return [rows[rows["rank"] == r] for r in range(n_ranks)]


def write_point_file(
    path: Path,
    point: Point,
    iterations: np.ndarray,
    *,
    comm: np.ndarray | None = None,
    resources: np.ndarray | None = None,
    evals: np.ndarray | None = None,
    energy: np.ndarray | None = None,
    hostnames: Sequence[str] | None = None,
    status: str = schema.STATUS_COMPLETE,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write `iterations` ((n_ranks, n_iters) ITERATION_DTYPE) and the tables as an n_ranks job's file."""
    n_ranks, n_iters = iterations.shape
    hosts = list(hostnames) if hostnames is not None else ["node0"] * n_ranks
    played = _PlayedComm(n_ranks)
    rank_rows = [
        np.array((r, r, 0, 1000 + r, 0, hosts[r].encode()[: schema.HOSTNAME_BYTES]), dtype=schema.RANK_DTYPE)
        for r in range(n_ranks)
    ]
    point_attrs = {k: v for k, v in point.as_dict().items() if v is not None and v != {}}
    point_attrs.update(id=point.id, json=point.to_json(), ranks=n_ranks)
    meta = FileMeta(
        root={"hpcbench_version": hpcbench.__version__, "sweep": "fabricated", "spec": "", "epoch_ns": 0},
        point=point_attrs,
        provenance={"hostnames": hosts, "writer": "gather", **(provenance or {})},
    )
    played.queue.append(rank_rows)
    writer = GatherWriter(path, played, meta, n_iters, rank_rows[0])
    played.queue.append([iterations[r] for r in range(n_ranks)])
    tables = {schema.COMM: comm, schema.RESOURCES: resources, schema.EVAL: evals, schema.ENERGY: energy}
    for name in schema.TABLES:
        played.queue.append(_by_rank(tables.get(name), n_ranks))
    writer.write_iterations(0, iterations[0], None)
    writer.close(status)
    return path
