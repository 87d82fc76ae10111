"""The all-reduce backends of the TensorFlow adapter: `multiworker` and `horovod`.

- `multiworker`: `tf.distribute.MultiWorkerMirroredStrategy`, its cluster (`TF_CONFIG`)
  built from the rank environment, worker ports picked free on each rank and exchanged over
  the bookkeeping communicator (`multiworker_strategy`). Variables are created in the
  strategy's scope (mirrored; initial values broadcast from worker 0 by the strategy).
  Gradients are averaged with the strategy's collective, `CollectiveReduceV2` (ring over
  gRPC), called directly so that every message can be timed (`collective_pack`).
- `horovod`: `horovod.tensorflow`; each pack a `hvd.grouped_allreduce` (one fused Horovod
  message; a one-tensor pack is a plain `hvd.allreduce`: `horovod_pack`). Initial weights
  are broadcast from rank 0.

Both pack the gradients the same way (`packs`): reverse order (last layer first), packs of
about `bytes_per_pack` bytes [default 0: one pack holding every gradient, as the strategy
does inside a `tf.function`], each pack one all-reduce of its concatenation. `AllReduce`
compiles the step (`all_reduce_step`: forward, backward, the packs' messages, the optimizer
step in one `tf.function`, stamped inside the graph) and records its marks and messages.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hpcbench.frameworks.tensorflow.cluster import worker_addresses
from hpcbench.frameworks.tensorflow.stamps import Messages, Step, stamp_after, stamped_gradients
from hpcbench.rank.collectives import Comm
from hpcbench.trace.recorder import Phase, Recorder

# Collective group of the gradient all-reduces: any key the strategy does not use itself
# (its own groups count up from 1).
GROUP_KEY = 0x4842  # "HB"

Exchange = Callable[[int, list[Any]], list[Any]]  # graph code averaging pack k over every worker
# graph code: (forward, variables, x, y, scale) -> (loss, forward end, gradients, backward end)
Gradients = Callable[[Callable[[Any, Any], Any], list[Any], Any, Any, Any], tuple[Any, Any, list[Any], Any]]


def packs(sizes: Sequence[int], bytes_per_pack: int, itemsize: int = 4) -> list[list[int]]:
    """Indices of the gradients in each message: reverse order (the last layer's gradients
    are ready first), packs of at least `bytes_per_pack` bytes (0: one pack), as TensorFlow's
    `group_by_size` packs them."""
    order = list(range(len(sizes)))[::-1]
    if bytes_per_pack <= 0:
        return [order] if order else []
    out: list[list[int]] = []
    filled = 0
    for i in order:
        if not out or filled > bytes_per_pack:
            out.append([])
            filled = 0
        out[-1].append(i)
        filled += sizes[i] * itemsize
    return out


def multiworker_strategy(comm: Comm) -> Any:
    """`MultiWorkerMirroredStrategy` over every rank (ring all-reduce), its `TF_CONFIG` from
    the gathered addresses; one rank: a local strategy."""
    import tensorflow as tf

    if comm.size > 1:
        workers = worker_addresses(comm)
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": comm.rank}}
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    else:
        os.environ.pop("TF_CONFIG", None)  # one worker: a local strategy
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def collective_pack(size: int, n_packs: int) -> Exchange:
    """Graph code averaging one pack over every worker: one `CollectiveReduceV2` (the
    strategy's all-reduce) of the pack's concatenation."""
    import tensorflow as tf

    # Instance keys must be unique per collective and equal on every worker: a counter
    # advanced inside the graph (no per-step host work), n_packs per step.
    counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="hpcbench_instance_key")

    def allreduce(k: int, grads: list[Any]) -> list[Any]:
        if k == 0:
            counter.assign_add(n_packs)
        key = counter.read_value() - n_packs + (k + 1)
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0) if len(grads) > 1 else tf.reshape(grads[0], [-1])
        reduced = tf.raw_ops.CollectiveReduceV2(
            input=flat, group_size=size, group_key=GROUP_KEY, instance_key=key, ordering_token=[],
            merge_op="Add", final_op="Div", communication_hint="ring", timeout_seconds=0.0,
        )  # fmt: skip
        parts = tf.split(reduced, [int(np.prod(g.shape)) for g in grads]) if len(grads) > 1 else [reduced]
        return [tf.reshape(p, g.shape) for p, g in zip(parts, grads, strict=True)]

    return allreduce


def horovod_pack(hvd: Any) -> Exchange:
    """Graph code averaging one pack with Horovod: one fused message (grouped all-reduce)."""

    def allreduce(k: int, grads: list[Any]) -> list[Any]:
        if len(grads) == 1:
            return [hvd.allreduce(grads[0], op=hvd.Average, name=f"hpcbench.grad.{k}")]
        return list(hvd.grouped_allreduce(grads, op=hvd.Average, name=f"hpcbench.pack.{k}"))

    return allreduce


def all_reduce_step(
    forward: Callable[[Any, Any], Any],
    update: Callable[[list[Any]], Any],
    variables: list[Any],
    scale: Callable[[Any], Any] | None,
    groups: list[list[int]],
    exchange: Exchange,
    x_spec: Any,
    y_spec: Any,
    gradients: Gradients | None = None,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The compiled training step of the all-reduce backends: loss and timestamps.
    `forward(x, y)` is the loss (an XLA-compiled function of its own under `compile: xla`:
    its backward is compiled too), `update(gradients)` the optimizer step, `scale` the
    loss scaling (fp16) or None; `gradients` forward and backward on the rank's several
    devices (replicas.py), else `stamped_gradients` on its one."""
    import tensorflow as tf

    local = gradients or stamped_gradients

    def train(x: Any, y: Any) -> tuple[Any, Any]:
        loss, t_forward, grads, t_backward = local(forward, variables, x, y, scale)
        reduced: list[Any] = [None] * len(variables)
        begins, ends = [], []
        for k, group in enumerate(groups):
            pack = [grads[i] for i in group]
            t0 = stamp_after(pack)  # the pack is ready: its message starts
            with tf.control_dependencies([t0]):
                out = exchange(k, [tf.identity(g) for g in pack])
            t1 = stamp_after(out)
            begins.append(t0)
            ends.append(t1)
            for i, r in zip(group, out, strict=True):
                reduced[i] = r
        update(reduced)
        return loss, tf.stack([t_forward, t_backward, *begins, *ends])

    compiled: Callable[[Any, Any], tuple[Any, Any]] = tf.function(train, input_signature=[x_spec, y_spec])
    return compiled


class AllReduce:
    """The gradient exchange of the all-reduce backends: its packs, their messages and the
    compiled step (built after the model and optimizer)."""

    def __init__(
        self,
        model: Any,
        step: Step,
        specs: tuple[Any, Any],
        bytes_per_pack: int,
        size: int,
        hvd: Any = None,
        gradients: Gradients | None = None,
    ) -> None:
        variables = list(model.trainable_variables)
        sizes = [int(np.prod(v.shape)) for v in variables]
        groups = packs(sizes, bytes_per_pack)
        names = [v.path for v in variables]
        self.messages = Messages(
            op=["allreduce"] * len(groups),
            name=[names[g[0]] if len(g) == 1 else f"pack{k}" for k, g in enumerate(groups)],
            nbytes=[4 * sum(sizes[i] for i in g) for g in groups],
        )
        exchange: Exchange
        if hvd is not None:
            # Horovod does not broadcast by itself (Keras 3: its variables' `value` are the tf.Variables).
            hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
            exchange = horovod_pack(hvd)
        else:
            exchange = collective_pack(size, len(groups))
        self._train = all_reduce_step(
            step.forward, step.update, variables, step.scale, groups, exchange, *specs, gradients
        )

    def step(self, rec: Recorder, x: Any, y: Any) -> Any:
        """One compiled step on tensors `x`, `y`, then its marks and messages; returns the loss."""
        loss, stamps = self._train(x, y)
        rec.mark(Phase.UPDATE)
        self.messages.record(rec, stamps.numpy())
        return loss
