"""The measuring loop: each size's all-reduce checked once, then timed on every rank."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from hpcbench.errors import HpcbenchError
from hpcbench.rank.commbench.backends import ELEMENT, Collectives


class Timing(NamedTuple):
    """One message size: its bytes, its float32 elements, and every rank's time per all-reduce
    (s; in rank order, the same on every rank)."""

    bytes: int
    elements: int
    times: list[float]


def measure(coll: Collectives, sizes: Sequence[int], iters: int, warmup: int) -> list[Timing]:
    """Per size (bytes): one all-reduce whose sum is checked, `warmup` untimed ones, then
    `iters` back-to-back after a barrier, timed until the last has finished (on the device
    too); each rank's mean, gathered to every rank."""
    timings = []
    for n_bytes in sizes:
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
        timings.append(Timing(n_bytes, count, [float(v) for v in coll.allgather(elapsed)]))
    return timings
