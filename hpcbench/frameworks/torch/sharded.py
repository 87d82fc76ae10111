"""Sharded data parallelism (ZeRO) through PyTorch's FSDP2 (`fully_shard`), every message timed.

Each transformer block (or, in a model without blocks, each top-level layer that has
parameters) is one FSDP unit, the whole model the root: a unit's parameters are
all-gathered before its forward (and, with ZeRO 3, again before its backward), its gradients
reduce-scattered as soon as its backward is done. FSDP's own collectives are replaced by
`set_custom_all_gather` / `set_custom_reduce_scatter` objects that call the same
torch.distributed functions through `mesh.Traced`, so every all-gather and reduce-scatter is
a `/comm` row of axis `fsdp`. With replicas too (HSDP: `dp` > 1), FSDP shards over the
`fsdp` group only and the post-reduce-scatter hook (`set_all_reduce_hook`) all-reduces each
unit's reduced shard over the `dp` group, timed the same way (axis `dp`), and averages it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from hpcbench.frameworks.torch.exchange import Exchange
from hpcbench.frameworks.torch.mesh import Mesh, Traced


class _AllGather(DefaultAllGather):
    def __init__(self, traced: Traced, name: str) -> None:
        self.traced, self.name = traced, name

    def __call__(  # FSDP calls with these keywords
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        return self.traced.all_gather(output_tensor, input_tensor, self.name, async_op)


class _ReduceScatter(DefaultReduceScatter):
    def __init__(self, exchange: Exchange, traced: Traced, name: str) -> None:
        self.exchange, self.traced, self.name = exchange, traced, name

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any, async_op: bool = False
    ) -> Any:
        self.exchange.gradient_ready()  # this unit's gradients are all computed: backward lasts until now
        return self.traced.reduce_scatter(output_tensor, input_tensor, op, self.name, async_op)


def units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules that become FSDP units before the root: the transformer blocks, else every
    top-level layer with parameters of its own."""
    from hpcbench.frameworks.torch import blocks

    found: list[tuple[str, torch.nn.Module]] = [(n, m) for n, m in model.named_modules() if isinstance(m, blocks.Block)]
    if found:
        return found
    return [(name, m) for name, m in model.named_children() if any(True for _ in m.parameters())]


class ShardedExchange(Exchange):
    kind = "fsdp"

    def __init__(self, world: int, mesh: Mesh, zero: int) -> None:
        super().__init__(world)
        self.mesh = mesh
        self.zero = zero

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        group = self.mesh.groups["fsdp"]
        device_mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=("fsdp",))
        shard = Traced(self, group, "fsdp")
        replicas = Traced(self, self.mesh.groups["dp"], "dp") if "dp" in self.mesh.groups else None
        reshard = self.zero == 3
        named = [*units(model), ("root", model)]
        for _, module in named:
            fully_shard(module, mesh=device_mesh, reshard_after_forward=reshard)
        for name, module in named:
            assert isinstance(module, FSDPModule)
            module.set_custom_all_gather(_AllGather(shard, name))
            module.set_custom_reduce_scatter(_ReduceScatter(self, shard, name))
            if replicas is not None:
                module.set_all_reduce_hook(self._averaged(replicas, name))
        return model

    def _averaged(self, replicas: Traced, name: str) -> Any:
        degree = self.mesh.layout.dp

        def hook(reduced: torch.Tensor) -> None:
            replicas.all_reduce(reduced, name)
            reduced.div_(degree)

        return hook
