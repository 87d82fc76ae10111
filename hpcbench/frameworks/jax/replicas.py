"""Several devices in one JAX rank (`devices_per_rank` D > 1): `jax.pmap` over its local devices.

On the CPU a process sees D devices with `--xla_force_host_platform_device_count=D` in
`XLA_FLAGS`, set before jax is imported (`host_devices`). The rank's batch (D * batch_size
samples) is split over them; forward and backward are `pmap`ped over the local devices
(`devices=jax.local_devices()`: the mapped axis, `local`, is this process's alone), each
device computing its part's loss and pull-back, then its gradients, which `lax.pmean` over
`local` averages inside the process. Device 0's copy of the mean, a (1, *S) shard, is what the
exchange averages across ranks, once per rank as with one device (its mesh holds each
process's first device: `exchange.py`); the optimizer updates the weights there, and every
step's forward hands them to each device. BatchNorm's running statistics are averaged over
the devices too; Dropout's masks come from the replica's index in the job
(`rank * D + device`), as a rank of its own would have them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

AXIS = "local"


def host_devices(devices: int) -> None:
    """Make the CPU platform show `devices` devices (before jax is imported)."""
    if devices > 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()


class Replicas:
    """The forward and backward programs of a rank's D devices, and its batch split over them."""

    def __init__(self, train_loss: Callable[..., Any], rank: int, devices: int) -> None:
        import jax
        import jax.numpy as jnp

        self.devices = jax.local_devices()
        if len(self.devices) != devices:
            raise RuntimeError(f"JAX sees {len(self.devices)} local devices; the point drives {devices}")
        self.n = devices

        def forward(w: Any, state: Any, x: Any, y: Any, iteration: Any) -> Any:
            replica = rank * devices + jax.lax.axis_index(AXIS)

            def loss(w: Any) -> Any:
                return train_loss(w, state, x, y, iteration, replica)

            value, pullback, new_state = jax.vjp(loss, w, has_aux=True)
            return jax.lax.pmean(value, AXIS), pullback, jax.lax.pmean(new_state, AXIS)

        def backward(pullback: Any) -> Any:
            (grads,) = pullback(jnp.ones((), jnp.float32))
            return jax.lax.pmean(grads, AXIS)

        mapped = {"axis_name": AXIS, "devices": self.devices}
        self._split = jax.sharding.NamedSharding(
            jax.sharding.Mesh(self.devices, (AXIS,)), jax.sharding.PartitionSpec(AXIS)
        )
        self._forward = jax.pmap(forward, in_axes=(None, None, 0, 0, None), **mapped)
        self._backward = jax.pmap(backward, **mapped)

    def put(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        """The rank's batch on its devices: device d gets samples d*b .. d*b + b - 1."""
        import jax

        parts = (x.reshape(self.n, -1, *x.shape[1:]), y.reshape(self.n, -1, *y.shape[1:]))
        put: tuple[Any, Any] = jax.device_put(parts, self._split)
        return put

    def forward(self, w: Any, state: Any, x: Any, y: Any, iteration: int) -> tuple[Any, Any, list[Any]]:
        """(the rank's mean loss, the devices' pull-backs, the devices' mean BatchNorm state on device 0)."""
        loss, pullback, new_state = self._forward(w, state, x, y, iteration)
        return loss, pullback, [s.addressable_data(0)[0] for s in new_state]

    def backward(self, pullback: Any) -> list[Any]:
        """The devices' mean gradients, as device 0's (1, *S) shards."""
        return [g.addressable_data(0) for g in self._backward(pullback)]
