"""PyTorch: DistributedDataParallel over gloo (CPU) or nccl (CUDA), MPI through mpi4py, Horovod.

Every backend trains the same module (built from `hpcbench.workloads.zoo`) on the same shard of
data through the same phase marks; how gradients travel is the backend's exchange
(`exchange.py`): DDP's buckets, one MPI all-reduce per parameter, or Horovod's fused
all-reduce. Each exchange keeps its backend's overlap of backward and communication, and the
recorder gets: backward = until the last gradient was ready, comm = what was still
outstanding after that, comm_total = the messages' summed times, one comm event per message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from hpcbench.frameworks.base import (
    ADAM,
    FRAMEWORKS,
    WEIGHT_DECAY,
    Framework,
    LauncherNeed,
    Problem,
    checksum,
    model_for,
)
from hpcbench.frameworks.torch import layouts
from hpcbench.frameworks.torch.comm import TorchComm
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.messages import CommRecorder
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

if TYPE_CHECKING:
    import torch

    from hpcbench.frameworks.torch.exchange import Exchange
    from hpcbench.frameworks.torch.mesh import Mesh
    from hpcbench.frameworks.torch.pipeline import Pipeline


@FRAMEWORKS.register
class TorchFramework(Framework):
    name = "torch"
    requires = ("torch",)
    backends = ("gloo", "nccl", "mpi", "horovod")
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {"mpi": ("mpi4py",), "horovod": ("horovod.torch",)}
    models = zoo.IMAGE_NAMES + zoo.TRANSFORMER_NAMES
    datasets = data.NAMES
    precisions = ("fp32", "tf32", "bf16", "fp16")
    optimizers = ("sgd", "momentum", "adam", "adamw")
    compile_modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    layouts = ("fsdp", "tp", "pp")
    traits: ClassVar[Mapping[str, Traits]] = {
        "gloo": Traits(grouping="buckets", sleeping_wait=True),  # DDP's buckets; gloo's waits sleep
        "nccl": Traits(grouping="buckets"),
        "mpi": Traits(mpi_exchange=True),  # one MPI all-reduce per parameter, progressed in MPI calls
        "horovod": Traits(grouping="fusion", background_thread=True),
    }
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {
        "mpi": LauncherNeed("it all-reduces the gradients through mpi4py"),
        "horovod": LauncherNeed("Horovod connects the ranks", horovod=True),
    }
    backend_devices: ClassVar[Mapping[str, tuple[str, str, str]]] = {
        "nccl": ("cuda", "nccl needs device: cuda", "gloo on cpu; gloo or nccl on cuda"),
        "mpi": ("cpu", "mpi exchanges host memory (mpi4py): device cuda is not supported", "device: cpu"),
    }

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        if point.precision == "tf32" and point.device != "cuda":
            yield "precision", "tf32 is a CUDA matmul mode (fp32 data on tensor cores)", "fp32, bf16, fp16 on cpu"
        yield from layouts.check(point)
        if point.compile is not None and point.backend in ("mpi", "horovod"):
            yield (
                "compile",
                f"the {point.backend} exchange hooks every gradient in Python, which torch.compile does not trace",
                "compile with gloo or nccl (DistributedDataParallel)",
            )

    def __init__(self) -> None:
        self._comm: Comm | None = None
        self._exchange: Exchange | None = None
        self._precision: Any = None  # autocast's dtype (None: fp32, no autocast)
        self._scaler: Any = None  # fp16's loss scaler
        self._attention = False  # the model has attention (its implementation is recorded)
        self._mesh: Mesh | None = None  # a `parallel` layout's groups
        self._split: set[str] = set()  # the parameters a tensor-parallel rank holds a part of

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        import torch

        from hpcbench.frameworks.torch.exchange import DDPExchange, HorovodExchange, MPIExchange

        if point.threads is not None:
            torch.set_num_threads(point.threads)
        if point.device == "cuda":
            torch.cuda.set_device(renv.local_rank)
            self.device = torch.device("cuda", renv.local_rank)
        else:
            self.device = torch.device("cpu")
        self.rank, self.size = renv.rank, renv.size
        if point.backend == "mpi":
            self._exchange = MPIExchange(renv.size, self.mpi_ranks(point, comm).mpi_comm)
        elif point.backend == "horovod":
            import horovod.torch as hvd

            hvd.init()
            if point.device == "cuda":
                torch.cuda.set_device(hvd.local_rank())
            self.rank, self.size = hvd.rank(), hvd.size()
            self._exchange = HorovodExchange(hvd.size())
            if comm is None:
                from hpcbench.frameworks._horovod import HorovodComm

                self._comm = HorovodComm(hvd)
        else:
            self._init_process_group(point, renv, comm)
            if point.parallel:
                self._exchange, self._mesh = layouts.exchange_for(point, renv)
            else:
                self._exchange = DDPExchange(renv.size)

    def _init_process_group(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.init_timeout_s())
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

    def bookkeeping_comm(self) -> Comm | None:
        return self._comm

    def build(self, point: Point) -> None:
        import torch

        from hpcbench.frameworks.torch import layers as torch_layers

        assert self._exchange is not None, "setup() first"
        spec = model_for(point)
        self.task = spec.task
        self._attention = any(isinstance(layer, zoo.Block) for layer in spec.layers)
        torch.manual_seed(point.seed)  # the same initial weights on every rank (and broadcast anyway)
        module = torch_layers.build(spec).to(self.device)
        mesh = self._mesh
        if mesh is not None and "tp" in mesh.groups:
            from hpcbench.frameworks.torch import tensor
            from hpcbench.frameworks.torch.mesh import Traced

            tensor.split(module, Traced(self._exchange, mesh.groups["tp"], "tp"), mesh.index("tp"), mesh.layout.tp)
            # FSDP replaces the parameters (names stay): the split ones are known by name
            self._split = {name for name, p in module.named_parameters() if getattr(p, tensor.SPLIT, False)}
        self.model = self._exchange.wrap(module, self.device)
        if point.compile is not None:
            self.model = torch.compile(self.model, mode=point.compile)  # type: ignore[assignment]
        self.loss_fn: Callable[[Any, Any], Any]
        if self.task == "reconstruct":
            self.loss_fn = torch.nn.MSELoss()
        else:  # classify; a sequence model's every token, the masked ones only for a masked-LM
            self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=data.IGNORED)
        self._set_precision(point)
        params = self.model.parameters()
        if point.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(params, lr=point.lr, betas=ADAM[:2], eps=ADAM[2])
        elif point.optimizer == "adamw":  # the fused kernel: one pass over all parameters
            self.optimizer = torch.optim.AdamW(params, lr=point.lr, weight_decay=WEIGHT_DECAY, fused=True)
        else:
            momentum = self.momentum if point.optimizer == "momentum" else 0.0
            self.optimizer = torch.optim.SGD(params, lr=point.lr, momentum=momentum)

        if mesh is None:
            shard = self.load_data(point, spec, self.rank, self.size)
        else:  # the peers of a tensor-parallel group read the same data
            shard = self.load_data(point, spec, mesh.layout.data_rank(self.rank), mesh.layout.data_ranks)
            test = layouts.even_test(shard.test)
            self._data = dataclasses.replace(self.rank_data, shard=data.Shard(shard.train, test, shard.classes))
            shard = self._data.shard
        # The whole shard as tensors once (sharing numpy's memory on the CPU; page-locked for
        # CUDA so that the copy to the device can be asynchronous): a step only indexes it.
        pin = self.device.type == "cuda"
        self._x = torch.from_numpy(shard.train.x)
        self._y = torch.from_numpy(shard.train.y)
        if pin:
            self._x, self._y = self._x.pin_memory(), self._y.pin_memory()

    def _set_precision(self, point: Point) -> None:
        """Mixed precision: autocast's dtype for bf16 and fp16 (fp32 master weights and
        gradients), a loss scaler for fp16; tf32: CUDA's matmuls on tensor cores."""
        import torch

        if point.precision == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        elif point.precision in ("bf16", "fp16"):
            self._precision = torch.bfloat16 if point.precision == "bf16" else torch.float16
            if point.precision == "fp16":
                self._scaler = torch.amp.GradScaler(self.device.type)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        if self._precision is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._precision)

    def _loss(self, out: Any, x: Any, y: Any) -> Any:
        if self.task == "reconstruct":
            return self.loss_fn(out, x.flatten(1))
        if self.task in ("lm", "mlm"):
            return self.loss_fn(out.flatten(0, 1).float(), y.flatten())
        return self.loss_fn(out, y)

    def step(self, rec: Recorder) -> Any:
        exchange = self._exchange
        assert exchange is not None
        exchange.begin_iteration(rec)  # a layout's messages begin in forward
        index = self.batches.next_index()
        if isinstance(index, slice):
            x, y = self._x[index], self._y[index]
        else:
            import torch

            at = torch.from_numpy(index)
            x, y = self._x.index_select(0, at), self._y.index_select(0, at)
            if self.device.type == "cuda":
                x, y = x.pin_memory(), y.pin_memory()
        rec.mark(Phase.DATA)
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        rec.mark(Phase.H2D)
        if exchange.kind == "pipeline":
            return self._pipeline_step(cast("Pipeline", exchange), x, y, rec)
        with self._autocast():
            loss = self._loss(self.model(x), x, y)
        rec.mark(Phase.FORWARD)
        scaler = self._scaler
        # the exchange's hooks mark the end of backward: the last gradient ready
        (loss if scaler is None else scaler.scale(loss)).backward()
        if exchange.ready:
            exchange.finish()
            rec.mark(Phase.COMM)
        else:
            rec.mark(Phase.BACKWARD)
        if exchange.total_ns:
            rec.add_comm(exchange.total_ns)
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)
            scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        rec.mark(Phase.UPDATE)
        return loss.detach()

    def _pipeline_step(self, pipeline: Pipeline, x: Any, y: Any, rec: Recorder) -> Any:
        """A pipeline stage's step: the schedule marks forward and backward, then the
        data-parallel all-reduce (comm) and the update."""
        loss = pipeline.run(x, y, rec, self._loss, self._autocast)
        if pipeline.ready:
            rec.mark(Phase.COMM)
        if pipeline.total_ns:
            rec.add_comm(pipeline.total_ns)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        rec.mark(Phase.UPDATE)
        return loss

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        import torch

        self.model.eval()
        if self._exchange is not None:  # a layout's messages of the test pass are not the training's
            self._exchange.comm = None
        with torch.no_grad():
            yield
        self.model.train()

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        import torch

        xt = torch.from_numpy(x).to(self.device)
        yt = torch.from_numpy(y).to(self.device)
        if self._exchange is not None and self._exchange.kind == "pipeline":
            with self._autocast():
                return cast("Pipeline", self._exchange).evaluate(xt, yt, self._loss)
        with self._autocast():
            out = self.model(xt)
            loss = float(self._loss(out, xt, yt)) * len(y)
        if self.task != "classify":
            return loss, 0
        return loss, int((out.argmax(dim=1) == yt).sum())

    def parameter_checksum(self) -> float:
        if self._mesh is None:
            return checksum(p.detach().cpu().numpy() for p in self.model.parameters())
        return layouts.mesh_checksum(self.model, self._mesh, self._exchange, self._split)

    def peak_device_memory(self) -> int | None:
        import torch

        return int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None

    def recorder(self, capacity: int, clock_offset: int, epoch_ns: int) -> Recorder:
        if self.device.type == "cuda":
            from hpcbench.trace.cuda import CudaRecorder

            return CudaRecorder(capacity, clock_offset, epoch_ns, self.device)
        return super().recorder(capacity, clock_offset, epoch_ns)

    def comm_recorder(self, rank: int, clock_offset: int, epoch_ns: int) -> CommRecorder:
        if self.device.type == "cuda":
            from hpcbench.trace.cuda import CudaCommRecorder

            return CudaCommRecorder(rank, clock_offset, epoch_ns, device=self.device)
        return super().comm_recorder(rank, clock_offset, epoch_ns)

    def versions(self) -> dict[str, str]:
        import torch

        out = {"torch": torch.__version__, "torch_threads": str(torch.get_num_threads())}
        if self._attention:
            out["attention"] = "torch.nn.functional.scaled_dot_product_attention"
        out["torch_autocast"] = str(self._precision).removeprefix("torch.") if self._precision is not None else "off"
        kind = self._exchange.kind if self._exchange is not None else ""
        out["torch_exchange"] = kind
        if self._mesh is not None:
            out["layout"] = self._mesh.layout.label()
        if kind == "ddp":
            import torch.distributed as dist

            out["torch_backend"] = str(dist.get_backend())
        elif kind == "horovod":
            import horovod

            out["horovod"] = horovod.__version__
        if self.device.type == "cuda":
            out["cuda"] = str(torch.version.cuda)
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
            out["gpu"] = torch.cuda.get_device_name(self.device)
        return out

    def comm_end(self) -> str:
        return self._exchange.comm_end if self._exchange is not None else super().comm_end()

    def teardown(self) -> None:
        import gc

        import torch.distributed as dist

        # DDP's reducer and the hook's futures keep the process group, and with it gloo's
        # worker threads, alive. Left to interpreter shutdown, those threads may release
        # Python objects after finalisation has begun and abort the process; so drop them
        # and join the threads now.
        for name in ("model", "optimizer", "loss_fn", "_x", "_y"):
            self.__dict__.pop(name, None)
        gc.collect()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        if self._exchange is not None and self._exchange.kind == "horovod":
            import horovod.torch as hvd

            hvd.shutdown()
