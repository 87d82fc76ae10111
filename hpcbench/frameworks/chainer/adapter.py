"""Chainer 7.8 with ChainerMN: data-parallel training over MPI.

Set-up: `chainermn.create_communicator(backend, mpi_comm=...)` on the bookkeeping MPI
communicator: `naive` on the CPU (one mpi4py all-reduce per parameter, the only one that
works without a GPU), `pure_nccl` on GPUs (every gradient packed into one NCCL all-reduce;
`device: cuda`, one GPU per rank, needs cupy: written for it, not run here). The model is
built from the zoo's description (`layers.py`), its weights drawn by Chainer's initialisers
from numpy's generator seeded with the point's seed, then `bcast_data(model)` from rank 0.
The optimizer (SGD, MomentumSGD 0.9, Adam) is wrapped by `create_multi_node_optimizer`.

A step: forward and loss, `cleargrads` and `backward`, then the multi-node optimizer's
`update()`: the communicator averages the gradients (`exchange.TimedMean` times each
message and marks the end of `comm`), then the actual optimizer updates (`update`).
ChainerMN's multi-node optimizer broadcasts the weights instead of updating on its first
call (when it first sees the parameters); `build` makes that call's check itself after its
own broadcast, so every timed step trains. Chainer on numpy is synchronous: every phase
has ended when its call returns (on a GPU the marks are host times, so the split between
phases there is approximate; the messages are synchronised). Backward and communication do
not overlap. `h2d` is the copy to the GPU (0 s on the CPU).

chainer is imported only inside methods (with `layers.py`, which needs it): this module is
registered in interpreters without it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import (
    FRAMEWORKS,
    Framework,
    LauncherNeed,
    Problem,
    checksum,
    model_for,
    no_settings,
    transformers_refused,
)
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.registry import import_error
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

MODULES = ("chainer", "chainermn", "mpi4py")
_CHAINERMN = LauncherNeed("ChainerMN communicates over MPI")


def import_chainer() -> Any:
    """Import chainer and chainermn; returns chainer.

    Chainer's import-time environment check imports `numpy.distutils`, which under numpy
    < 1.24 needs the standard library's distutils (`distutils.msvccompiler`), while
    setuptools >= 60 puts its own distutils in its place through an import hook: chainer
    then fails to import. The hook is removed first (Python < 3.12 still has the standard
    library's distutils; nothing of hpcbench uses distutils). The deprecation warnings the
    check raises (pkg_resources, distutils) are not shown.
    """
    if "chainer" not in sys.modules and "distutils" not in sys.modules and sys.version_info < (3, 12):
        try:
            import _distutils_hack
        except ImportError:
            pass
        else:
            _distutils_hack.remove_shim()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        import chainer
        import chainermn  # noqa: F401 - imported here, under the same fix

    return chainer


@FRAMEWORKS.register
class ChainerFramework(Framework):
    name = "chainer"
    requires = ()  # MODULES, imported by `unavailable` after the fix of `import_chainer`
    backends = ("naive", "pure_nccl")
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {"pure_nccl": ("cupy",)}
    models = zoo.IMAGE_NAMES
    refusals: ClassVar[Mapping[str, str]] = transformers_refused(
        "Chainer 7.8.1 (its last release, 2019) has no fused attention and no bf16 training: a transformer built "
        "of its primitives would misreport it"
    )
    datasets = data.NAMES
    traits: ClassVar[Mapping[str, Traits]] = {
        "naive": Traits(mpi_exchange=True),  # one mpi4py all-reduce per parameter, after backward
        "pure_nccl": Traits(grouping="one_message"),  # every gradient packed into one NCCL all-reduce
    }
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {"naive": _CHAINERMN, "pure_nccl": _CHAINERMN}
    backend_devices: ClassVar[Mapping[str, tuple[str, str, str]]] = {
        "pure_nccl": ("cuda", "pure_nccl needs device: cuda", "naive on cpu; pure_nccl on cuda"),
        "naive": ("cpu", "naive exchanges host memory: device cuda is not supported", "pure_nccl on cuda"),
    }

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        yield from no_settings(point, "chainer")

    @classmethod
    def unavailable(cls, backend: str) -> str | None:
        try:
            import_chainer()
        except Exception as exc:  # noqa: BLE001 - any import failure makes chainer unavailable
            return f"chainer: {type(exc).__name__}: {exc}"
        return import_error((*MODULES, *cls.backend_requires.get(backend, ())))

    def __init__(self) -> None:
        self._rank, self._size, self._local_rank = 0, 1, 0
        self._communicator: Any = None
        self._backend = ""

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        mpi = self.mpi_ranks(point, comm).mpi_comm
        import_chainer()
        import chainermn

        self._rank, self._size, self._local_rank = renv.rank, renv.size, renv.local_rank
        self._backend = point.backend
        self._communicator = chainermn.create_communicator(point.backend, mpi_comm=mpi)
        if self._communicator.size != renv.size or self._communicator.rank != renv.rank:
            raise HpcbenchError(
                f"ChainerMN sees rank {self._communicator.rank} of {self._communicator.size}, "
                f"the launcher {renv.rank} of {renv.size}"
            )

    def build(self, point: Point) -> None:
        import chainer
        import chainer.functions as F
        import chainermn

        from hpcbench.frameworks.chainer import layers
        from hpcbench.frameworks.chainer.exchange import TimedMean

        model = self._model = model_for(point)
        np.random.seed(point.seed)  # Chainer's initialisers draw from numpy's global generator
        net = self.net = layers.build(model)
        synchronize = None
        if point.device == "cuda":
            import cupy

            chainer.backends.cuda.get_device_from_id(self._local_rank).use()
            net.to_gpu(self._local_rank)
            synchronize = cupy.cuda.Stream.null.synchronize
        self._xp = net.xp
        self._timed = TimedMean(self._communicator, fused=point.backend == "pure_nccl", synchronize=synchronize)
        if point.optimizer == "adam":
            actual = chainer.optimizers.Adam(alpha=point.lr)
        elif point.optimizer == "momentum":
            actual = chainer.optimizers.MomentumSGD(lr=point.lr, momentum=self.momentum)
        else:
            actual = chainer.optimizers.SGD(lr=point.lr)
        self.optimizer = chainermn.create_multi_node_optimizer(actual, self._communicator)
        self.optimizer.setup(net)
        self._communicator.bcast_data(net)
        self.optimizer.is_changed(net)  # the parameters are known: the first update trains
        if model.classes:
            self._loss = F.softmax_cross_entropy
        else:
            self._loss = lambda out, x: F.mean_squared_error(out, F.reshape(x, (x.shape[0], -1)))
        self.load_data(point, model, self._rank, self._size)

    def step(self, rec: Recorder) -> Any:
        import chainer

        x, y = self.batches.next()
        rec.mark(Phase.DATA)
        if self._xp is not np:
            x, y = self._xp.asarray(x), self._xp.asarray(y)
            rec.mark(Phase.H2D)
        out = self.net(x)
        loss = self._loss(out, y if self._model.classes else x)
        rec.mark(Phase.FORWARD)
        self.net.cleargrads()
        loss.backward()
        rec.mark(Phase.BACKWARD)
        self._timed.rec = rec
        self.optimizer.update()  # averages (marks comm), then the actual optimizer's update
        rec.mark(Phase.UPDATE)
        return float(chainer.backends.cuda.to_cpu(loss.array))

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        import chainer

        with chainer.using_config("train", False), chainer.no_backprop_mode():
            yield

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        from chainer.backends import cuda

        xs, ys = self._xp.asarray(x), self._xp.asarray(y)
        out = self.net(xs)
        loss = float(cuda.to_cpu(self._loss(out, ys if self._model.classes else xs).array)) * len(y)
        return loss, int((cuda.to_cpu(out.array).argmax(axis=1) == y).sum()) if self._model.classes else 0

    def parameter_checksum(self) -> float:
        from chainer.backends import cuda

        return checksum(cuda.to_cpu(p.array) for _, p in sorted(self.net.namedparams()))

    def versions(self) -> dict[str, str]:
        import chainer

        return {
            "chainer": chainer.__version__,
            "chainermn_communicator": type(self._communicator).__name__ if self._communicator is not None else "",
            "chainer_backend": self._backend,
        }
