"""Several devices in one TensorFlow rank (`devices_per_rank` D > 1): `tf.distribute.MirroredStrategy`.

The rank's devices are made before TensorFlow initialises (`make_devices`): on the CPU, D
logical CPU devices (`tf.config.set_logical_device_configuration`) sharing the rank's
intra-op pool; on CUDA, the rank's own D GPUs (local rank r: GPUs r*D .. r*D + D - 1).
A `MirroredStrategy` over them runs forward and backward on every device, each on its part
of the rank's batch (`batch_size` samples a device), and reduces the replicas' gradients
inside the process; the rank's exchange then carries that one reduced set across ranks,
as with one device (one message set per rank, not per device), and the optimizer applies
it once.

The weights are the rank's ordinary variables (not mirrored: the strategy is used for its
replicas and its in-process reduction, the cross-rank exchange stays the backend's): every
replica reads them, so the whole step stays one compiled `tf.function` stamped as with one
device. Each replica's loss is its batch's mean divided by D (Keras' own losses scale
themselves so inside a replica; `losses.unscaled` keeps theirs the plain mean), and the
replicas' gradients are summed (`ReduceOp.SUM`), TensorFlow's convention: the sum is the
mean gradient over the rank's D * batch_size samples, the reported loss their mean loss.
Forward ends when the last replica's loss is computed, backward when the replicas'
gradients are reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.tensorflow.allreduce import Gradients
from hpcbench.frameworks.tensorflow.stamps import stamp_after, stamped_gradients


def make_devices(tf: Any, device: str, devices: int, local_rank: int) -> None:
    """The rank's devices, before TensorFlow initialises: on CUDA its GPU (local rank r: GPU r,
    modulo the node's), or its block of `devices` GPUs; on the CPU no GPU, and `devices` > 1
    logical CPUs."""
    if device != "cuda":
        tf.config.set_visible_devices([], "GPU")
        if devices > 1:
            (cpu, *_) = tf.config.list_physical_devices("CPU")
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
        return
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if devices == 1:
        mine = [gpus[local_rank % len(gpus)]]
    else:
        mine = gpus[local_rank * devices : (local_rank + 1) * devices]
        if len(mine) < devices:
            first = local_rank * devices
            raise HpcbenchError(
                f"local rank {local_rank} drives GPUs {first}..{first + devices - 1}, and this node has "
                f"{len(gpus)}: gpus_per_node is ranks_per_node * devices_per_rank"
            )
    tf.config.set_visible_devices(mine, "GPU")
    for gpu in mine:
        tf.config.experimental.set_memory_growth(gpu, True)


def replicate(device: str, devices: int) -> tuple[Any, Gradients | None]:
    """(the strategy over the rank's devices, its `replicated_gradients`); (None, None) with one device."""
    if devices == 1:
        return None, None
    mirrored = strategy(device, devices)
    return mirrored, replicated_gradients(mirrored, devices)


def describe(mirrored: Any) -> str:
    """The provenance's `tf_replicas`: the strategy and its devices."""
    return f"MirroredStrategy over {', '.join(mirrored.extended.worker_devices)}"


def strategy(device: str, devices: int) -> Any:
    """A `MirroredStrategy` over the rank's devices (their names as this process knows them:
    a cluster's, `/job:worker/...`, under the multiworker backend)."""
    import tensorflow as tf

    kind = "GPU" if device == "cuda" else "CPU"
    names = [d.name for d in tf.config.list_logical_devices(kind)][:devices]
    return tf.distribute.MirroredStrategy(names, cross_device_ops=tf.distribute.ReductionToOneDevice())


def replicated_gradients(mirrored: Any, devices: int) -> Gradients:
    """Graph code with `stamped_gradients`' signature and result, on `devices` replicas:
    the batch split in `devices` parts, each replica's forward and backward on its part, the
    gradients summed inside the process by the strategy."""
    import tensorflow as tf

    total = tf.distribute.ReduceOp.SUM

    def gradients(
        forward: Callable[[Any, Any], Any], variables: list[Any], x: Any, y: Any, scale: Any = None
    ) -> tuple[Any, Any, list[Any], Any]:
        xs, ys = tf.split(x, devices), tf.split(y, devices)
        px = mirrored.experimental_distribute_values_from_function(lambda ctx: xs[ctx.replica_id_in_sync_group])
        py = mirrored.experimental_distribute_values_from_function(lambda ctx: ys[ctx.replica_id_in_sync_group])

        def replica(xr: Any, yr: Any) -> tuple[Any, Any, list[Any], Any]:
            def share(a: Any, b: Any) -> Any:  # this replica's share of the rank's mean loss
                return forward(a, b) / devices

            return stamped_gradients(share, variables, xr, yr, scale)

        loss, t_forward, grads, _ = mirrored.run(replica, args=(px, py))
        summed = [mirrored.reduce(total, g, axis=None) for g in grads]
        ends = mirrored.experimental_local_results(t_forward)
        return mirrored.reduce(total, loss, axis=None), tf.reduce_max(tf.stack(ends)), summed, stamp_after(summed)

    return gradients
