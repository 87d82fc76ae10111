"""What the MXNet parameter servers run besides MXNet itself: the update counter of dist_async.

The workers pickle their optimizer to the servers (`KVStore.set_optimizer`); the servers
unpickle it, so this module must be importable there (the worker puts hpcbench on the
servers' PYTHONPATH). `VersionCounting` wraps the point's optimizer: every parameter key is
updated by it unchanged, and one extra key, `version_key`, counts the updates the servers
applied (+1 per update). In dist_async every push is applied on arrival, so the counter is
the number of pushes the servers have taken in; a worker that pulls it learns how many
updates happened since its previous pull (its staleness), and after a barrier it must be
workers × iterations.

Only `exchange.py` imports this module, lazily: it needs mxnet.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx


class VersionCounting(mx.optimizer.Optimizer):  # type: ignore[misc]  # mxnet has no type information
    def __init__(self, inner: Any, version_key: int) -> None:
        super().__init__(learning_rate=inner.lr)
        self.inner = inner
        self.version_key = version_key
        self.aggregate_num = 0  # one key per call, as a server updates one key at a time
        self.multi_precision = inner.multi_precision

    def _set_current_context(self, device_id: int) -> None:
        self.inner._set_current_context(device_id)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        if index == self.version_key:
            return None
        return self.inner.create_state_multi_precision(index, weight)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self.create_state_multi_precision(index, weight)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        if index == self.version_key:
            weight += 1.0
        else:
            self.inner.update_multi_precision(index, weight, grad, state)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self.update_multi_precision(index, weight, grad, state)
