"""The data of a rank that drives several devices (`devices_per_rank` D > 1).

Such a rank reads what its D devices would read as ranks of their own: the shards of data
ranks `rank * D + d` of `size * D`, each device's part of every batch (`batch_size` samples)
the batch that shard gives, so 2 ranks of 2 devices see, batch for batch, what 4 ranks of
one device see. The shards' training splits are interleaved batch by batch (cut to the
batches every shard holds), their test splits concatenated.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hpcbench.workloads import datasets as data


def rank_shard(load: Callable[[int, int], data.Shard], rank: int, size: int, devices: int, batch: int) -> data.Shard:
    """The shard of a rank of `devices` devices, each reading batches of `batch`; `load(r, n)`
    is data rank r's shard of n."""
    if devices == 1:
        return load(rank, size)
    shards = [load(rank * devices + d, size * devices) for d in range(devices)]
    steps = min(len(s.train) for s in shards) // batch
    if steps < 1:
        raise data.DataError(f"a device's shard holds fewer samples than a batch of {batch}")

    def interleaved(arrays: list[np.ndarray]) -> np.ndarray:
        parts = [a[: steps * batch].reshape(steps, batch, *a.shape[1:]) for a in arrays]
        return np.stack(parts, axis=1).reshape(steps * batch * devices, *arrays[0].shape[1:])

    train = data.Split(interleaved([s.train.x for s in shards]), interleaved([s.train.y for s in shards]))
    test = data.Split(np.concatenate([s.test.x for s in shards]), np.concatenate([s.test.y for s in shards]))
    return data.Shard(train, test, shards[0].classes)
