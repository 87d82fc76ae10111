"""PyTorch: DistributedDataParallel over gloo (CPU) or nccl (CUDA).

Gradient exchange is timed from inside DDP with a communication hook that does what
DDP's default hook does (average by all-reduce) and notes when each bucket became ready
and when its all-reduce completed. The step therefore keeps DDP's overlap of backward
and all-reduce, and the recorder gets: backward = until the last bucket was ready,
comm = what was still outstanding after that, comm_total = the buckets' summed times.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hpcbench.comm import Comm
from hpcbench.frameworks.base import FRAMEWORKS, Framework, Problem
from hpcbench.rankenv import RankEnv
from hpcbench.spec import Point
from hpcbench.trace.comm import CommRecorder
from hpcbench.trace.recorder import Phase, Recorder

if TYPE_CHECKING:
    import torch

SYNTHETIC_POOL = 8  # distinct synthetic batches per rank, cycled


class _HookState:
    """Written by the comm hook (the all-reduce completion runs on the backend's thread)."""

    __slots__ = ("comm", "dtypes", "iteration", "last_ready_ns", "names", "total_ns", "world")

    def __init__(self, world: int) -> None:
        self.world = world
        self.last_ready_ns = 0
        self.total_ns = 0
        self.comm: CommRecorder | None = None
        self.iteration = 0
        self.names: dict[int, str] = {}  # bucket index -> message name, made once
        self.dtypes: dict[Any, str] = {}

    def reset(self) -> None:
        self.last_ready_ns = 0
        self.total_ns = 0


def _timed_allreduce(state: _HookState, bucket: Any) -> Any:
    import torch.distributed as dist

    t0 = time.perf_counter_ns()
    state.last_ready_ns = t0
    tensor = bucket.buffer()
    slot = -1
    comm = state.comm
    if comm is not None:
        index = bucket.index()
        name = state.names.get(index) or state.names.setdefault(index, f"bucket{index}")
        dtype = state.dtypes.get(tensor.dtype) or state.dtypes.setdefault(tensor.dtype, str(tensor.dtype)[6:])
        slot = comm.begin(state.iteration, "allreduce", name, dtype, tensor.numel() * tensor.element_size(), t0)
    tensor.div_(state.world)
    future = dist.all_reduce(tensor, async_op=True).get_future()

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


class TorchComm:
    """Bookkeeping collectives over a gloo group, for jobs without MPI (torchrun)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = dist.new_group(backend="gloo")
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    @property
    def mpi_comm(self) -> Any | None:
        return None

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self._group)
        return box[0]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.size if self.rank == root else None
        self._dist.gather_object(obj, out, dst=root, group=self._group)
        return out

    def allgather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def abort(self, code: int = 1) -> None:
        os._exit(code)  # torchrun ends the other workers of the group


@FRAMEWORKS.register
class TorchFramework(Framework):
    name = "torch"
    requires = ("torch",)
    backends = ("gloo", "nccl")
    models = ("lenet", "mlp")

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        if point.backend == "nccl" and point.device != "cuda":
            yield "backend", "nccl needs device: cuda", "gloo on cpu; gloo or nccl on cuda"

    def __init__(self) -> None:
        self._hook = _HookState(1)
        self._pool: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._next = 0
        self._comm: Comm | None = None

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        import torch
        import torch.distributed as dist

        if point.threads is not None:
            torch.set_num_threads(point.threads)
        if point.device == "cuda":
            torch.cuda.set_device(renv.local_rank)
            self.device = torch.device("cuda", renv.local_rank)
        else:
            self.device = torch.device("cpu")
        timeout = datetime.timedelta(seconds=float(os.environ.get("HPCBENCH_INIT_TIMEOUT_S", "300")))
        if comm is not None:
            # Rendezvous through MPI: rank 0 opens a store on a free port and tells the others.
            # The host's own name, not the launcher's node name: Slurm node names need not resolve.
            host = os.environ.get("HPCBENCH_MASTER_ADDR") or (socket.gethostname() if renv.size > 1 else "127.0.0.1")
            if comm.rank == 0:
                store = dist.TCPStore(  # type: ignore[attr-defined]
                    host, 0, renv.size, is_master=True, timeout=timeout, wait_for_workers=False
                )
                comm.bcast((host, store.port))
            else:
                host, port = comm.bcast(None)
                store = dist.TCPStore(  # type: ignore[attr-defined]
                    host, port, renv.size, is_master=False, timeout=timeout
                )
            dist.init_process_group(point.backend, store=store, rank=renv.rank, world_size=renv.size, timeout=timeout)
        else:
            dist.init_process_group(point.backend, init_method="env://", timeout=timeout)
            self._comm = TorchComm()
        self._hook = _HookState(dist.get_world_size())

    def bookkeeping_comm(self) -> Comm | None:
        return self._comm

    def build(self, point: Point) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from hpcbench.frameworks import _torch_models

        rank = dist.get_rank()
        torch.manual_seed(point.seed)  # same initial weights on every rank (DDP broadcasts anyway)
        shape, classes = _torch_models.INPUTS[point.model]
        model = _torch_models.BUILDERS[point.model](classes).to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=ids)
        self.model.register_comm_hook(self._hook, _timed_allreduce)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        params = self.model.parameters()
        if point.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(params, lr=point.lr)
        else:
            momentum = 0.9 if point.optimizer == "momentum" else 0.0
            self.optimizer = torch.optim.SGD(params, lr=point.lr, momentum=momentum)

        gen = torch.Generator().manual_seed(point.seed * 100_003 + rank)
        pin = self.device.type == "cuda"
        for _ in range(SYNTHETIC_POOL):
            x = torch.randn((point.batch_size, *shape), generator=gen)
            y = torch.randint(0, classes, (point.batch_size,), generator=gen)
            self._pool.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))

    def step(self, rec: Recorder) -> Any:
        x, y = self._pool[self._next % SYNTHETIC_POOL]
        self._next += 1
        rec.mark(Phase.DATA)
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        rec.mark(Phase.H2D)
        loss = self.loss_fn(self.model(x), y)
        rec.mark(Phase.FORWARD)
        hook = self._hook
        hook.reset()
        hook.comm, hook.iteration = rec.comm, rec.iteration
        loss.backward()
        if hook.last_ready_ns:
            rec.mark_at(Phase.BACKWARD, hook.last_ready_ns)
            rec.mark(Phase.COMM)
            rec.add_comm(hook.total_ns)
        else:
            rec.mark(Phase.BACKWARD)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        rec.mark(Phase.UPDATE)
        return loss.detach()

    def recorder(self, capacity: int, clock_offset: int, epoch_ns: int) -> Recorder:
        if self.device.type == "cuda":
            from hpcbench.trace.cuda import CudaRecorder

            return CudaRecorder(capacity, clock_offset, epoch_ns, self.device)
        return super().recorder(capacity, clock_offset, epoch_ns)

    def versions(self) -> dict[str, str]:
        import torch
        import torch.distributed as dist

        out = {
            "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads()),
            "torch_backend": dist.get_backend(),
        }
        if self.device.type == "cuda":
            out["cuda"] = str(torch.version.cuda)
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
            out["gpu"] = torch.cuda.get_device_name(self.device)
        return out

    def teardown(self) -> None:
        import gc

        import torch.distributed as dist

        # DDP's reducer and the hook's futures keep the process group, and with it gloo's
        # worker threads, alive. Left to interpreter shutdown, those threads may release
        # Python objects after finalisation has begun and abort the process; so drop them
        # and join the threads now.
        for name in ("model", "optimizer", "loss_fn"):
            self.__dict__.pop(name, None)
        self._pool.clear()
        gc.collect()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
