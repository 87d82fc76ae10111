"""Gradient averaging across JAX processes with `lax.pmean`, every message timed.

The mesh holds every process's CPU device (one per process: `jax.devices()` after
`jax.distributed.initialize`; a process driving several, its first), on one axis. A gradient of shape S is given as this
process's shard (1, *S) of a global array (P, *S) and averaged by a `shard_map`ped
`lax.pmean` over the axis; XLA runs the cross-process all-reduce (Gloo on CPU).

- `pmean`: one all-reduce per gradient tensor, last layer first (the order back-propagation
  produces them). All are dispatched at once (JAX dispatches asynchronously and runs them in
  order); each message begins when it is dispatched and ends when its result is seen ready,
  waited for in dispatch order.
- `pmean_fused`: one `pmean` of the whole list of gradients, compiled into one program: one
  message of every gradient's bytes (named `all`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hpcbench.trace.recorder import Recorder

AXIS = "processes"
BACKENDS = ("pmean", "pmean_fused")


def _shard_map() -> Any:
    """`jax.shard_map` (jax >= 0.7), else its older home in jax.experimental."""
    found = getattr(jax, "shard_map", None)
    if found is None:
        from jax.experimental import shard_map as module

        found = module.shard_map
    return found


class PmeanExchange:
    """Averages lists of per-process gradient shards (1, *S) across the mesh."""

    def __init__(self, fused: bool, names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> None:
        # every process's first device, in process order (a rank driving several devices
        # averages their gradients first, on its first: replicas.py)
        first: dict[int, Any] = {}
        for device in jax.devices():
            first.setdefault(device.process_index, device)
        devices = [first[p] for p in sorted(first)]
        self.mesh = Mesh(devices, (AXIS,))
        self.size = len(devices)
        self.fused = fused
        self.names = list(names)
        self.shapes = [tuple(s) for s in shapes]
        self.nbytes = [4 * _numel(s) for s in self.shapes]
        self._sharding = NamedSharding(self.mesh, P(AXIS))
        spec = P(AXIS)
        shard_map = _shard_map()

        def mean(tree: Any) -> Any:
            return jax.lax.pmean(tree, AXIS)

        self._reduce = jax.jit(shard_map(mean, mesh=self.mesh, in_specs=(spec,), out_specs=spec))

    def _global(self, shard: Any, shape: tuple[int, ...]) -> Any:
        return jax.make_array_from_single_device_arrays((self.size, *shape), self._sharding, [shard])

    def exchange(self, rec: Recorder, shards: Sequence[Any]) -> list[Any]:
        """The averages of `shards` (this process's (1, *S) gradients), each message recorded
        on `rec`; returns this process's shards of the averages, in the order given."""
        if self.fused:
            t0 = time.perf_counter_ns()
            slot = _begin(rec, "all", sum(self.nbytes), t0)
            out = self._reduce([self._global(g, s) for g, s in zip(shards, self.shapes, strict=True)])
            jax.block_until_ready(out)
            _end(rec, slot, t0)
            return [o.addressable_data(0) for o in out]
        pending = []
        for i in reversed(range(len(shards))):
            t0 = time.perf_counter_ns()
            slot = _begin(rec, self.names[i], self.nbytes[i], t0)
            pending.append((i, self._reduce(self._global(shards[i], self.shapes[i])), slot, t0))
        averaged: list[Any] = [None] * len(shards)
        for i, result, slot, t0 in pending:
            result.block_until_ready()
            _end(rec, slot, t0)
            averaged[i] = result.addressable_data(0)
        return averaged


def _begin(rec: Recorder, name: str, nbytes: int, t0: int) -> int:
    """A float32 all-reduce message handed over at t0: its slot (-1 when not recorded)."""
    return rec.comm.begin(rec.iteration, "allreduce", name, "float32", nbytes, t0) if rec.comm is not None else -1


def _end(rec: Recorder, slot: int, t0: int) -> None:
    """The message of `slot` (begun at t0) is complete now."""
    t1 = time.perf_counter_ns()
    if rec.comm is not None:
        rec.comm.end(slot, t1)
    rec.add_comm(t1 - t0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
