"""Pipeline parallelism: the model's layers in `pp` contiguous stages, a batch in micro-batches
through a GPipe or 1F1B schedule, every activation and gradient sent between stages timed.

Stage s of p keeps the blocks s*L/p .. (s+1)*L/p - 1; the first stage also what comes before
the first block (embeddings), the last what comes after the last (norm, head, loss). A head
tied to the embedding table is untied across stages, as Megatron-LM does: the last stage
holds a copy, initialised equal, and after backward the two gradients are summed over the
pipeline's first and last ranks (an all-reduce of axis `pp`), so both stay equal.

Schedules over m micro-batches (each stage runs its own list; sends are non-blocking,
receives blocking, so any order consistent with the data flow cannot deadlock):

- `gpipe`: every forward, then every backward;
- `1f1b`: p - s - 1 forwards to fill the pipeline, then one forward and one backward in
  turn, then the backwards left.

Phases: `forward` lasts until the first backward begins (the schedule's warm-up), `backward`
the rest of the schedule, `comm` the data-parallel all-reduce of the stage's gradients (one
message over the `dp` group, after the schedule), `update` the optimizer. The training loss
is the last stage's (the others record NaN: sending it back would add a message to the
step); the test pass sends the last stage's result to every stage, outside the timed loop.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from hpcbench.frameworks.torch import blocks
from hpcbench.frameworks.torch.exchange import Exchange
from hpcbench.frameworks.torch.mesh import Mesh, Traced
from hpcbench.trace.recorder import Phase, Recorder


def stage_bounds(layers: list[nn.Module], stage: int, stages: int) -> tuple[int, int]:
    """The slice [lo, hi) of `layers` that `stage` of `stages` keeps."""
    at = [i for i, layer in enumerate(layers) if isinstance(layer, blocks.Block)]
    per, extra = divmod(len(at), stages)
    first = stage * per + min(stage, extra)
    count = per + (1 if stage < extra else 0)
    lo = 0 if stage == 0 else at[first]
    hi = len(layers) if stage == stages - 1 else at[first + count]
    return lo, hi


class Pipeline(Exchange):
    """One stage of a pipeline: its part of the model, the schedule, the tied weights' sum and
    the data-parallel all-reduce of its gradients."""

    kind = "pipeline"

    def __init__(self, world: int, mesh: Mesh) -> None:
        super().__init__(world)
        self.mesh = mesh
        layout = mesh.layout
        self.stage, self.stages = mesh.index("pp"), layout.pp
        self.microbatches, self.schedule = layout.microbatches, layout.schedule
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.pp = Traced(self, mesh.groups["pp"], "pp")
        self.dp = Traced(self, mesh.groups["dp"], "dp") if "dp" in mesh.groups else None
        self.ends = Traced(self, mesh.groups["ends"], "pp") if "ends" in mesh.groups else None
        self.tied: torch.Tensor | None = None  # the embedding table or the head's copy of it
        self.stage_module: nn.Module | None = None

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        layers = list(model.children())
        lo, hi = stage_bounds(layers, self.stage, self.stages)
        for layer in layers[lo:hi]:
            if isinstance(layer, blocks.TokenHead) and layer.tied_to and not self.first:
                layer.matrix = nn.Parameter(layer.tied_to[0].table.weight.detach().clone())
                layer.tied_to = []
                self.tied = layer.matrix
        if self.first and self.stages > 1 and any(isinstance(x, blocks.TokenHead) and x.tied_to for x in layers):
            self.tied = next(x for x in layers if isinstance(x, blocks.Embedding)).table.weight
        self.stage_module = nn.Sequential(*layers[lo:hi])
        return self.stage_module

    # -- the schedule

    def run(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        rec: Recorder,
        loss_of: Callable[[Any, Any, Any], Any],
        autocast: Callable[[], AbstractContextManager[Any]],
    ) -> Any:
        """One iteration's forwards (each under `autocast`) and backwards; returns the last
        stage's loss (else NaN)."""
        model = self.stage_module
        assert model is not None
        m = self.microbatches
        xs, ys = x.chunk(m), y.chunk(m)
        kept: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # a micro-batch's input and output
        sends: list[Any] = []
        total = torch.zeros((), device=x.device)

        def forward(i: int) -> None:
            nonlocal total
            inp = None if self.first else self._received(xs[i], model)
            with autocast():
                out = model(xs[i] if inp is None else inp)
                loss = loss_of(out, xs[i], ys[i]) / m if self.last else None
            if loss is not None:
                total = total + loss.detach()
                kept[i] = (inp, loss)
            else:
                sends.append(
                    self.pp.send(out.detach().float().contiguous(), self.mesh.peer("pp", self.stage + 1), f"act{i}")
                )
                kept[i] = (inp, out)

        def backward(i: int) -> None:
            inp, out = kept[i]
            if self.last:
                out.backward()  # type: ignore[no-untyped-call]
            else:
                grad = torch.empty(out.shape, dtype=torch.float32, device=out.device)
                self.pp.recv(grad, self.mesh.peer("pp", self.stage + 1), f"grad{i}")
                out.backward(grad.to(out.dtype))  # type: ignore[no-untyped-call]
            if inp is not None:
                assert inp.grad is not None
                sends.append(self.pp.send(inp.grad.contiguous(), self.mesh.peer("pp", self.stage - 1), f"grad{i}"))
            del kept[i]  # its graph is freed

        warmup = m if self.schedule == "gpipe" else min(self.stages - self.stage - 1, m)
        for i in range(warmup):
            forward(i)
        rec.mark(Phase.FORWARD)
        done = 0
        for i in range(warmup, m):
            forward(i)
            backward(done)
            done += 1
        for i in range(done, m):
            backward(i)
        for sent in sends:
            self.pp.wait(sent)
        rec.mark(Phase.BACKWARD)
        self._exchange()
        return total if self.last else torch.tensor(float("nan"))

    def _received(self, like: torch.Tensor, model: nn.Module) -> torch.Tensor:
        """The previous stage's activations of the micro-batch whose input is `like`."""
        shape = (*like.shape[:2], self._width(model))
        inp = torch.empty(shape, dtype=torch.float32, device=like.device)
        self.pp.recv(inp, self.mesh.peer("pp", self.stage - 1), "act")
        return inp.requires_grad_()

    @staticmethod
    def _width(model: nn.Module) -> int:
        for layer in model.modules():
            if isinstance(layer, blocks.Attention):
                return int(layer.q.in_features)
            if isinstance(layer, nn.LayerNorm | nn.RMSNorm):
                return int(layer.normalized_shape[0])
        raise ValueError("a stage without blocks or norms: no width for its input")

    def _exchange(self) -> None:
        """The tied weights' gradients summed over the pipeline's ends; the stage's gradients
        averaged over its data-parallel group (one message)."""
        model = self.stage_module
        assert model is not None
        if self.ends is not None and self.tied is not None and self.tied.grad is not None:
            self.ends.all_reduce(self.tied.grad, "tied")
        if self.dp is None:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.gradient_ready()
        self.dp.all_reduce(flat, "stage")
        flat.div_(self.mesh.layout.dp)
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()

    # -- the test pass

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, loss_of: Callable[[Any, Any, Any], Any]) -> tuple[float, int]:
        """One test batch through the stages; the last stage's (loss sum, correct) to all."""
        import torch.distributed as dist

        model = self.stage_module
        assert model is not None
        group = self.mesh.groups["pp"]
        out = model(x) if self.first else model(self._recv_plain(x, model))
        result = torch.zeros(2, dtype=torch.float64, device=x.device)
        if self.last:
            result[0] = float(loss_of(out, x, y)) * len(y)
            if out.dim() == 2:  # a classifier's logits
                result[1] = int((out.argmax(dim=1) == y).sum())
        else:
            dist.send(out.float().contiguous(), self.mesh.peer("pp", self.stage + 1), group=group)
        dist.broadcast(result, self.mesh.peer("pp", self.stages - 1), group=group)
        return float(result[0]), int(result[1])

    def _recv_plain(self, like: torch.Tensor, model: nn.Module) -> torch.Tensor:
        import torch.distributed as dist

        inp = torch.empty((*like.shape[:2], self._width(model)), dtype=torch.float32, device=like.device)
        dist.recv(inp, self.mesh.peer("pp", self.stage - 1), group=self.mesh.groups["pp"])
        return inp
