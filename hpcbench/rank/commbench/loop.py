"""The measuring loop: each size's all-reduce checked once, then timed on every rank."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from hpcbench.errors import HpcbenchError
from hpcbench.rank.commbench.backends import ELEMENT, Collectives


class WrongSum(HpcbenchError):
    """An all-reduce gave a wrong sum on some rank: a result that shows a problem (exit 1),
    raised on every rank alike (the ranks agree on it)."""

    exit_code = 1


class Timing(NamedTuple):
    """One message size: its bytes, its float32 elements, and every rank's time per all-reduce
    (s; in rank order, the same on every rank)."""

    bytes: int
    elements: int
    times: list[float]


def measure(coll: Collectives, sizes: Sequence[int], iters: int, warmup: int) -> list[Timing]:
    """Per size (bytes): one all-reduce whose sum is checked on every rank, `warmup` untimed
    ones, then `iters` back-to-back after a barrier, timed until the last has finished (on the
    device too); each rank's mean, gathered to every rank. A size's buffers are freed before
    the next size's are allocated: a rank holds BUFFERS buffers of one size at a time."""
    timings = []
    for n_bytes in sizes:
        count = n_bytes // ELEMENT.itemsize
        send, recv = coll.buffers(count)
        sums = coll.allgather(bool(coll.verify(send, recv)))  # every rank learns of a wrong sum anywhere
        if not all(sums):  # a wrong sum means the timings would be of something else
            wrong = ", ".join(str(rank) for rank, good in enumerate(sums) if not good)
            raise WrongSum(
                f"all-reduce of {n_bytes} bytes gave a wrong sum on rank(s) {wrong}; the {coll.backend} setup is broken"
            )
        for _ in range(warmup):
            coll.allreduce(send, recv)
        coll.sync()
        coll.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            coll.allreduce(send, recv)
        coll.sync()
        elapsed = (time.perf_counter() - start) / iters
        del send, recv  # before the next size's buffers
        timings.append(Timing(n_bytes, count, [float(v) for v in coll.allgather(elapsed)]))
    return timings
