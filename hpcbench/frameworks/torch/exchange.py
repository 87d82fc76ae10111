"""How PyTorch ranks exchange gradients, one class per backend, each timing every message.

Every exchange keeps the overlap of backward and communication that its backend has and
reports, per iteration: when the last gradient became ready (the end of `backward`: each
hook marks it, the last mark stands, on the device too where the recorder times one), the
summed duration of all messages (`comm_total`), and one comm event per message. The worker's
`comm` phase is what is still outstanding after backward: the wait in `finish`.

- `DDPExchange` (gloo, nccl): DistributedDataParallel's buckets, timed by a communication
  hook that does what DDP's default hook does (average by all-reduce).
- `MPIExchange` (mpi): one non-blocking MPI all-reduce per parameter (mpi4py), started by a
  hook the moment the parameter's gradient is accumulated (wait-free back-propagation, as in
  MPI-based frameworks); completions are collected before the update. The PyPI wheel of
  torch has no MPI process group, hence mpi4py on the tensors' host memory (CPU only).
- `HorovodExchange` (horovod): `horovod.torch`'s asynchronous all-reduce per parameter from
  the same hooks (what `hvd.DistributedOptimizer` does); Horovod fuses them into buffers on
  its background thread. A message ends when `synchronize` returns it; handles are waited
  on in the order they were started, so an end is the moment its completion was seen.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from hpcbench.store import schema
from hpcbench.trace.messages import CommRecorder
from hpcbench.trace.recorder import Phase, Recorder


class Exchange:
    """Per-iteration state shared by the backends' hooks."""

    kind: ClassVar[str] = "none"
    comm_end: ClassVar[str] = schema.COMM_END_COMPLETION  # what a message's recorded end is (Framework.comm_end)

    def __init__(self, world: int) -> None:
        self.world = world
        self.ready = False  # a gradient was handed to the exchange in this iteration
        self.total_ns = 0
        self.rec: Recorder | None = None
        self.comm: CommRecorder | None = None
        self.iteration = 0

    def begin_iteration(self, rec: Recorder) -> None:
        self.ready = False
        self.total_ns = 0
        self.rec = rec
        self.comm = rec.comm
        self.iteration = rec.iteration

    def gradient_ready(self) -> int:
        """A hook's gradient is ready: backward has lasted until now (the last call stands).
        Returns the host time, for the message's start."""
        self.ready = True
        if self.rec is not None:
            self.rec.mark(Phase.BACKWARD)
        return time.perf_counter_ns()

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The module to train (DDP wraps it; the others attach hooks to its parameters)."""
        return model

    def finish(self) -> None:
        """Wait for what is still outstanding after backward (the `comm` phase)."""


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class DDPExchange(Exchange):
    kind = "ddp"

    def __init__(self, world: int, group: Any = None) -> None:
        super().__init__(world)
        self.group = group  # the data-parallel group of a layout (None: every rank)

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, process_group=self.group, **_no_buffer_sync(model))
        ddp.register_comm_hook(self, _timed_allreduce)
        return ddp


def _no_buffer_sync(model: torch.nn.Module) -> dict[str, Any]:
    """DDP's arguments for never broadcasting buffers, neither before every forward nor at
    construction: BatchNorm statistics stay per rank, as with the MPI and Horovod exchanges,
    so all backends measure the same work. (Parameters are still broadcast at construction.)

    torch 2.13 deprecates `broadcast_buffers=False` (a FutureWarning on every rank) for
    `forward_sync_buffers=False`, which no longer covers the sync at construction: there the
    buffers are left out by naming them as ignored (they are not parameters, so nothing else
    DDP does changes). Older torch has only `broadcast_buffers`, which does both."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" not in inspect.signature(DistributedDataParallel).parameters:
        return {"broadcast_buffers": False}
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, buffers)  # type: ignore[no-untyped-call]
    return {"forward_sync_buffers": False}


def _timed_allreduce(state: DDPExchange, bucket: Any) -> Any:
    import torch.distributed as dist

    t0 = state.gradient_ready()
    tensor = bucket.buffer()
    slot = -1
    comm = state.comm
    if comm is not None:
        nbytes = tensor.numel() * tensor.element_size()
        slot = comm.begin(state.iteration, "allreduce", f"bucket{bucket.index()}", _dtype_name(tensor), nbytes, t0)
    tensor.div_(state.world)
    future = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()

    def done(fut: Any) -> Any:
        t1 = time.perf_counter_ns()
        state.total_ns += t1 - t0
        if comm is not None:
            comm.end(slot, t1)
        return fut.value()[0]

    return future.then(done)


# DDP checks a hook's annotations at run time against dist.GradBucket / Future; postponed
# annotations are strings to it. mypy has read them; drop them for that check.
_timed_allreduce.__annotations__.clear()


class _PerParameter(Exchange, ABC):
    """Starts one message per parameter from a post-accumulate-grad hook."""

    comm_end = schema.COMM_END_WAIT  # `finish` sees the ends, waiting in the order the messages started

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self._pending: list[tuple[Any, int, int]] = []  # (handle, comm slot, t0)
        self._names: list[str] = []

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        self.broadcast(model)
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._hook_for(len(self._names)))  # type: ignore[no-untyped-call]
                self._names.append(name)
        self._pending = []
        return model

    def _hook_for(self, index: int) -> Any:
        def hook(param: torch.Tensor) -> None:
            t0 = self.gradient_ready()
            grad = param.grad
            assert grad is not None
            slot = -1
            if self.comm is not None:
                nbytes = grad.numel() * grad.element_size()
                slot = self.comm.begin(self.iteration, "allreduce", self._names[index], _dtype_name(grad), nbytes, t0)
            self._pending.append((self.start(index, grad), slot, t0))

        return hook

    def broadcast(self, model: torch.nn.Module) -> None:
        """Rank 0's initial weights to every rank."""

    @abstractmethod
    def start(self, index: int, grad: torch.Tensor) -> Any:
        """Start averaging `grad` in place; returns a handle for `wait`."""

    @abstractmethod
    def wait(self, handle: Any) -> None:
        """Block until the message of `handle` is complete (and averaged)."""

    def finish(self) -> None:
        comm = self.comm
        for handle, slot, t0 in self._pending:
            self.wait(handle)
            t1 = time.perf_counter_ns()
            self.total_ns += t1 - t0
            if comm is not None:
                comm.end(slot, t1)
        self._pending.clear()


class MPIExchange(_PerParameter):
    kind = "mpi"

    def __init__(self, world: int, mpi_comm: Any) -> None:
        super().__init__(world)
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = mpi_comm
        self._grads: dict[int, torch.Tensor] = {}

    def broadcast(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for param in model.parameters():
                self._comm.Bcast(param.detach().numpy(), root=0)

    def start(self, index: int, grad: torch.Tensor) -> Any:
        self._grads[index] = grad
        return index, self._comm.Iallreduce(self._mpi.IN_PLACE, grad.numpy(), op=self._mpi.SUM)

    def wait(self, handle: Any) -> None:
        index, request = handle
        request.Wait()
        self._grads.pop(index).div_(self.world)


class HorovodExchange(_PerParameter):
    kind = "horovod"

    def __init__(self, world: int) -> None:
        super().__init__(world)
        import horovod.torch as hvd

        self._hvd = hvd

    def broadcast(self, model: torch.nn.Module) -> None:
        self._hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def start(self, index: int, grad: torch.Tensor) -> Any:
        return self._hvd.allreduce_async_(grad, name=self._names[index], op=self._hvd.Average)

    def wait(self, handle: Any) -> None:
        self._hvd.synchronize(handle)
