"""The TensorFlow backends' in-graph timestamps, and how they become phase marks and comm events.

A compiled training step stamps its own phase ends and messages with `tf.timestamp` ops
ordered by control dependencies (`stamped_gradients` for forward and backward, `stamp_after`
for a message's end) and returns the stamps with the loss; after the step's last mark,
`Messages.record` turns them into the recorder's marks and comm events. Nothing waits for a
stamp. The stamps are on the wall clock (0.24 us resolution at today's epoch), mapped to the
recorder's clock with one pair of clock reads per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcbench.trace.recorder import Phase, Recorder


@dataclass(frozen=True)
class Step:
    """What a backend's compiled step runs around its messages: `forward(x, y)`, the loss
    (under `compile: xla` an XLA-compiled function: its backward is compiled too);
    `update(gradients)`, the optimizer step on the model's trainable variables (the
    all-reduce backends); `scale`, the loss scaling backward starts from (fp16), or None."""

    forward: Callable[[Any, Any], Any]
    update: Callable[[list[Any]], Any]
    scale: Callable[[Any], Any] | None = None


class Messages:
    """The messages of one step (fixed at build) and how their in-graph timestamps become
    phase marks and comm events.

    `stamps` (seconds on the wall clock, float64, ~0.24 us resolution at today's epoch):
    [forward end, backward end, begin of message 0..n-1, end of message 0..n-1].
    """

    def __init__(self, op: Sequence[str], name: Sequence[str], nbytes: Sequence[int]) -> None:
        self.op = list(op)
        self.name = list(name)
        self.nbytes = list(nbytes)
        self.n = len(self.op)

    def record(self, rec: Recorder, stamps: np.ndarray) -> None:
        # Wall clock -> perf_counter_ns: one pair of reads per step (the two clocks drift
        # apart slowly, so the offset is not cached).
        offset = time.time_ns() - time.perf_counter_ns()
        ns = (stamps * 1e9).astype(np.int64) - offset
        n = self.n
        begins, ends = ns[2 : 2 + n], ns[2 + n :]
        rec.mark_at(Phase.FORWARD, int(ns[0]))
        backward = int(ns[1])
        rec.mark_at(Phase.BACKWARD, backward)
        if n:
            rec.mark_at(Phase.COMM, max(backward, int(ends.max())))
            rec.add_comm(int((ends - begins).sum()))
        comm = rec.comm
        if comm is not None:
            iteration = rec.iteration
            for k in range(n):
                slot = comm.begin(iteration, self.op[k], self.name[k], "float32", self.nbytes[k], int(begins[k]))
                comm.end(slot, int(ends[k]))


def stamp_after(deps: Sequence[Any]) -> Any:
    """Graph code: the time once every op in `deps` has run."""
    import tensorflow as tf

    with tf.control_dependencies(deps):
        return tf.timestamp()


def stamped_gradients(
    forward: Callable[[Any, Any], Any],
    variables: list[Any],
    x: Any,
    y: Any,
    scale: Callable[[Any], Any] | None = None,
) -> tuple[Any, Any, list[Any], Any]:
    """Graph code: forward (`forward(x, y)`: the loss) and backward, stamped at their ends.
    `scale` (a loss-scaling optimizer's `scale_loss`) scales the loss backward starts from.
    Returns (loss, forward end, gradients of `variables`, backward end: every gradient is ready)."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = forward(x, y)
        objective = loss if scale is None else scale(loss)
    t_forward = stamp_after([objective])
    # Backward starts from a seed gradient that waits for the forward stamp: otherwise
    # the scheduler may run backward before the (cheap, unneeded) loss reduction, and
    # the stamp would land after it.
    with tf.control_dependencies([t_forward]):
        seed = tf.ones_like(objective)
    grads = tape.gradient(objective, variables, output_gradients=seed)
    t_backward = stamp_after(grads)
    return loss, t_forward, grads, t_backward
