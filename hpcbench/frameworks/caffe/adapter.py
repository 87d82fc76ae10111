"""Caffe 1.0 (CPU, pycaffe): the net from prototxt, gradients all-reduced blob by blob over MPI.

The model is built from the zoo's description as prototxt (`prototxt.py`) and loaded by an
SGD solver (`caffe.SGDSolver`: plain SGD, or momentum 0.9; a fixed learning rate, no weight
decay); Caffe's fillers draw the weights from the point's seed, then rank 0's are broadcast.
The learnt blobs (those of Convolution, InnerProduct and Scale layers; BatchNorm's running
statistics are not learnt) are checked against the zoo's parameter count. A test net in
Caffe's TEST phase shares every layer's blobs with the training net (`share_with`) for the
evaluation (running statistics in BatchNorm, no dropout).

A step, driven from Python so that every phase is timed apart:

- data: the batch copied into the `data` (and `label`) input blobs;
- forward: `clear_param_diffs` (Caffe adds gradients to the blobs' diffs), `net.forward()`;
- backward: `net.backward()`: every learnt blob's `diff` holds its gradient;
- comm: for each learnt layer, last first, each of its blobs (weights, bias) summed over the
  ranks in place by one `Allreduce` through mpi4py on the `diff` view, each timed as a
  message named `LAYER.weight` / `LAYER.bias`; then divided by the ranks;
- update: `solver.apply_update()` (the solver's update on the averaged diffs).

Adam is not offered: pycaffe's `apply_update` does not advance the solver's iteration, which
Caffe's Adam counts for its bias correction (`solver.step` would, but it runs forward and
backward inside, untimed apart). Caffe here is a CPU build: no `h2d` phase (0 s). Backward
and communication do not overlap.

caffe is imported only inside methods: this module is registered in interpreters without it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks._mpi import HostMPIFramework
from hpcbench.frameworks.base import FRAMEWORKS, Problem, checksum, model_for, transformers_refused
from hpcbench.frameworks.caffe import prototxt
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import zoo

OPTIMIZERS = ("sgd", "momentum")
BLOB_NAMES = ("weight", "bias")


@FRAMEWORKS.register
class CaffeFramework(HostMPIFramework):
    name = "caffe"
    requires = ("caffe", "mpi4py")
    traits: ClassVar[Mapping[str, Traits]] = {"mpi": Traits(mpi_exchange=True)}  # blocking, after backward
    cpu_only = "the caffe environment's Caffe is a CPU build"
    refusals: ClassVar[Mapping[str, str]] = transformers_refused(
        "Caffe 1.0 has no attention, layer-norm or embedding-lookup layers"
    )

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        if point.optimizer not in OPTIMIZERS:
            yield (
                "optimizer",
                f"{point.optimizer!r} is not offered with caffe (pycaffe's apply_update does not advance the "
                "iteration that Caffe's Adam counts)",
                ", ".join(OPTIMIZERS),
            )

    def __init__(self) -> None:
        self._dir: Path | None = None

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        self.join(point, renv, comm)
        import caffe

        caffe.set_mode_cpu()

    def build(self, point: Point) -> None:
        import caffe

        model = self._model = model_for(point)
        text = prototxt.net(model, point.batch_size)
        self._output, self._loss_weight = text.output, text.loss_weight
        folder = self._dir = Path(tempfile.mkdtemp(prefix="hpcbench-caffe-"))
        net_path = folder / "net.prototxt"
        net_path.write_text(text.text)
        solver_path = folder / "solver.prototxt"
        solver_path.write_text(prototxt.solver(str(net_path), point.optimizer, point.lr, self.momentum, point.seed))
        self.solver = caffe.SGDSolver(str(solver_path))
        net = self.net = self.solver.net
        kinds = [(name, layer.type) for name, layer in net.layer_dict.items()]
        self._learnt = [
            (f"{name}.{BLOB_NAMES[i]}", blob)
            for name in prototxt.learnt(kinds)
            for i, blob in enumerate(net.params.get(name, ()))
        ]
        built = sum(int(blob.data.size) for _, blob in self._learnt)
        if built != zoo.count_parameters(model):
            raise HpcbenchError(
                f"caffe built {built} parameters for {model.name}, the zoo counts {zoo.count_parameters(model)}"
            )
        for _, blob in self._learnt:
            self.mpi.Bcast(blob.data, root=0)
        self.test_net = caffe.Net(str(net_path), caffe.TEST)
        self.test_net.share_with(net)
        self.load_data(point, model, self.rank, self.size)

    def _exchange(self, rec: Recorder) -> None:
        """Every learnt blob's gradient summed over the ranks in place, last layer first, each
        timed; then averaged."""
        self.allreduce.average(rec, [(name, blob.diff) for name, blob in reversed(self._learnt)])

    def step(self, rec: Recorder) -> Any:
        net = self.net
        x, y = self.batches.next()
        net.blobs[prototxt.DATA].data[...] = x
        if self._model.classes:
            net.blobs[prototxt.LABEL].data[...] = y
        rec.mark(Phase.DATA)
        net.clear_param_diffs()
        loss = float(net.forward()[prototxt.LOSS]) * self._loss_weight
        rec.mark(Phase.FORWARD)
        net.backward()
        rec.mark(Phase.BACKWARD)
        self._exchange(rec)
        rec.mark(Phase.COMM)
        self.solver.apply_update()
        rec.mark(Phase.UPDATE)
        return loss

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        net, classes = self.test_net, self._model.classes
        if net.blobs[prototxt.DATA].data.shape[0] != len(x):
            net.blobs[prototxt.DATA].reshape(len(x), *x.shape[1:])
            if classes:
                net.blobs[prototxt.LABEL].reshape(len(x))
            net.reshape()
        net.blobs[prototxt.DATA].data[...] = x
        if classes:
            net.blobs[prototxt.LABEL].data[...] = y
        loss = float(net.forward()[prototxt.LOSS]) * self._loss_weight * len(x)
        return loss, int((net.blobs[self._output].data.argmax(axis=1) == y).sum()) if classes else 0

    def parameter_checksum(self) -> float:
        return checksum(blob.data for _, blob in self._learnt)

    def versions(self) -> dict[str, str]:
        import caffe

        return {"caffe": str(caffe.__version__), "caffe_mode": "cpu", "caffe_optimizer_update": "apply_update"}

    def teardown(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
