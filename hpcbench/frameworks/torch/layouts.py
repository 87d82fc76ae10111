"""A PyTorch point's parallel layout (spec/parallel.py): what the adapter refuses at planning,
the exchange and process groups it builds, the test split every rank runs alike, and the
checksum of weights that the ranks hold in parts. Imports torch only inside its functions:
planning reads `check` without it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hpcbench.frameworks.base import Problem, checksum
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

if TYPE_CHECKING:
    from hpcbench.frameworks.torch.exchange import Exchange
    from hpcbench.frameworks.torch.mesh import Mesh


def exchange_for(point: Point, renv: RankEnv) -> tuple[Exchange, Mesh]:
    """The exchange of a point with a `parallel` layout and its process groups: a pipeline
    stage's, FSDP's over the fsdp (and dp) groups, DDP's over the dp group, or none (every
    rank's data is its group's)."""
    from hpcbench.frameworks.torch.exchange import DDPExchange, Exchange
    from hpcbench.frameworks.torch.mesh import Mesh
    from hpcbench.frameworks.torch.pipeline import Pipeline
    from hpcbench.frameworks.torch.sharded import ShardedExchange

    layout = point.layout
    mesh = Mesh(layout, renv.rank)
    if layout.pp > 1:
        return Pipeline(renv.size, mesh), mesh
    if layout.fsdp > 1:
        return ShardedExchange(renv.size, mesh, layout.zero), mesh
    if layout.dp > 1:
        return DDPExchange(layout.dp, mesh.groups["dp"]), mesh
    return Exchange(renv.size), mesh


def even_test(test: data.Split) -> data.Split:
    """The test split cut to the shortest of every rank's: a sharded or split model's every
    forward is a collective, so every rank tests as many batches."""
    import torch
    import torch.distributed as dist

    length = torch.tensor([len(test)])
    dist.all_reduce(length, op=dist.ReduceOp.MIN)
    n = int(length)
    return data.Split(test.x[:n], test.y[:n])


def mesh_checksum(model: Any, mesh: Mesh, exchange: Exchange | None, split: set[str]) -> float:
    """The whole model's checksum, summed over the parts the ranks of this rank's replica
    hold (each FSDP shard, each tensor-parallel part, named in `split`; a weight the
    tensor-parallel group holds whole counted once): equal on replicas whose weights are equal."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from hpcbench.frameworks.torch.pipeline import Pipeline

    for module in model.modules():  # ZeRO 2 keeps the gathered weights after a forward
        if isinstance(module, FSDPModule):
            module.reshard()
    first = mesh.index("tp") == 0
    # the last stage's copy of the embedding table: counted on the first stage
    copy = exchange.tied if isinstance(exchange, Pipeline) and not exchange.first else None
    parts = []
    for name, p in model.named_parameters():
        if p is copy:
            continue
        if first or name.removeprefix("module.").removeprefix("_orig_mod.") in split:
            local = p.to_local() if hasattr(p, "to_local") else p
            parts.append(local.detach().cpu().numpy())
    total = torch.tensor([checksum(parts)], dtype=torch.float64)
    dist.all_reduce(total, group=mesh.replica)
    return float(total)


def check(point: Point) -> Iterable[Problem]:
    """A layout's split of a model: tensor and pipeline parallelism split transformer blocks
    (tp dividing the heads, key-value heads and MLP width; pp at most the blocks); a
    pipeline with neither sharding nor fp16's loss scaler; no compiler with a layout."""
    layout = point.layout
    if not point.parallel or layout.plain:
        return
    if point.compile is not None:
        yield (
            "compile",
            "torch.compile is not applied to a parallel layout's modules here",
            "compile unset with parallel",
        )
    if layout.pp > 1 and layout.fsdp > 1:
        yield "parallel.fsdp", "a pipeline's stages are not sharded here", "fsdp 1 with pp (dp and tp combine with it)"
    if layout.pp > 1 and point.precision == "fp16":
        yield "precision", "fp16's loss scaler is not run through the pipeline", "fp32, bf16 with pp"
    if (layout.tp == 1 and layout.pp == 1) or point.model not in zoo.NAMES:
        return
    split = "tp" if layout.tp > 1 else "pp"
    found = [layer for layer in zoo.model(point.model).layers if isinstance(layer, zoo.Block)]
    if not found:
        names = ", ".join(zoo.TRANSFORMER_NAMES)
        yield f"parallel.{split}", f"{point.model} has no transformer blocks to split", f"{split} with {names}"
        return
    if layout.pp > len(found):
        yield (
            "parallel.pp",
            f"pp {layout.pp} is more stages than {point.model}'s {len(found)} blocks",
            f"1 to {len(found)}",
        )
    tp = layout.tp
    if tp == 1:
        return
    block = found[0]
    sizes = {"heads": block.attention.heads, "key-value heads": block.attention.groups, "MLP width": block.mlp.hidden}
    for what, size in sizes.items():
        if size % tp:
            yield (
                "parallel.tp",
                f"tp {tp} does not divide {point.model}'s {size} {what}",
                "a divisor of the heads, key-value heads and MLP width",
            )
            return
