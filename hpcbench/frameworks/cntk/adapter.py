"""CNTK 2.7: forward, backward and update in CNTK, gradients all-reduced per tensor over MPI.

CNTK 2.7 (its last release) runs on Python 3.6 only; the rank runs hpcbench's worker, which
needs Python >= 3.10. So the rank (the `cntk` environment's own interpreter: mpi4py, the
HDF5 point file, the recorders) starts one CNTK process beside it (`bridge.py`, `child.py`;
the environment's `bin/cntk-python`, made by envs/build-cntk.sh) and a step is:

- data: the next batch copied into the memory both processes share;
- forward: CNTK's forward pass of the batch (training mode), kept for backward;
- backward: CNTK's backward pass from the kept state, the gradients of the mean loss
  written into the shared memory;
- comm: one `Allreduce(IN_PLACE)` (sum) per gradient tensor through mpi4py, last layer first,
  each timed as a message (`allreduce`, the parameter's name), then divided by the ranks;
- update: CNTK's learner (SGD, momentum 0.9 in the classic form, Adam) applies the averaged
  gradients.

So this measures CNTK's compute and an MPI exchange of its gradients, not CNTK's own
`data_parallel_distributed_learner`: that learner aggregates inside CNTK's C++ code, where no
message can be timed from outside, and needs the CNTK process to be the MPI rank, which then
cannot be the worker that writes the point file. Each phase includes one command's round
trip to the CNTK process (tens of microseconds). The weights are CNTK's initialisers' (He
normal, biases zero) from the point's seed, broadcast from rank 0 before training.
Parameter counts are checked against the zoo's: a network that differs is an error.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError, one_line
from hpcbench.frameworks._mpi import HostMPIFramework
from hpcbench.frameworks.base import FRAMEWORKS, checksum, model_for, transformers_refused
from hpcbench.frameworks.cntk import bridge
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.registry import import_error
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import zoo

_PROBE = "import warnings; warnings.simplefilter('ignore'); import cntk; print(cntk.__version__)"


@FRAMEWORKS.register
class CntkFramework(HostMPIFramework):
    name = "cntk"
    requires = ("mpi4py",)
    traits: ClassVar[Mapping[str, Traits]] = {"mpi": Traits(mpi_exchange=True)}  # blocking, after backward
    cpu_only = "cntk runs on the CPU here (gradients exchanged from host memory)"
    refusals: ClassVar[Mapping[str, str]] = transformers_refused(
        "CNTK 2.7 (its last release, 2019) has no fused attention and no bf16 training"
    )

    @classmethod
    def unavailable(cls, backend: str) -> str | None:
        missing = import_error(cls.requires)
        if missing is not None:
            return missing
        exe = bridge.interpreter()
        if not exe.exists():
            return (
                f"CNTK runs in its own Python 3.6 ({exe} missing): bash envs/build.sh cntk, which needs a "
                f"Python 3.6 interpreter (pyenv's 3.6, or HPCBENCH_PYTHON36)"
            )
        try:
            proc = subprocess.run([str(exe), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{exe}: {one_line(str(exc))}"
        if proc.returncode != 0:
            return f"{exe} cannot import cntk: {one_line((proc.stderr.strip().splitlines() or ['?'])[-1])}"
        return None

    def __init__(self) -> None:
        self._child: bridge.Child | None = None
        self._shared: bridge.Shared | None = None
        self._version = ""

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        self.join(point, renv, comm)
        self._child = bridge.Child(bridge.interpreter())

    def build(self, point: Point) -> None:
        child = self._require_child()
        model = self._model = model_for(point)
        reply = child.call(
            "build", model=bridge.describe(model), optimizer=point.optimizer, lr=point.lr, seed=point.seed,
            batch=point.batch_size, momentum=self.momentum,
        )  # fmt: skip
        self._version = str(reply["version"])
        params = [(str(name), tuple(int(d) for d in shape)) for name, shape in reply["params"]]
        self._names = [name for name, _ in params]
        sizes = tuple(int(np.prod(shape)) for _, shape in params)
        if sum(sizes) != zoo.count_parameters(model):
            raise HpcbenchError(
                f"CNTK built {model.name} with {sum(sizes)} parameters, the model description has "
                f"{zoo.count_parameters(model)}"
            )
        shared = self._shared = bridge.Shared(bridge.Layout(sizes, point.batch_size, model.input), self.rank)
        child.call("attach", path=str(shared.path), batch=point.batch_size)
        child.call("get")
        self.mpi.Bcast(shared.weights_flat, root=0)  # every rank starts from rank 0's weights
        child.call("set")

        self.load_data(point, model, self.rank, self.size)

    def _require_child(self) -> bridge.Child:
        if self._child is None:
            raise HpcbenchError("cntk: build before setup")
        return self._child

    def _require_shared(self) -> bridge.Shared:
        if self._shared is None:
            raise HpcbenchError("cntk: step before build")
        return self._shared

    def _exchange(self, rec: Recorder, grads: list[np.ndarray]) -> None:
        """Every gradient summed over the ranks in place, last layer first, each timed; then averaged."""
        self.allreduce.each(rec, [(self._names[i], grads[i]) for i in reversed(range(len(grads)))])
        self.allreduce.scale([self._require_shared().grads_flat])

    def step(self, rec: Recorder) -> Any:
        child, shared = self._require_child(), self._require_shared()
        n = shared.put(*self.batches.next())
        rec.mark(Phase.DATA)
        loss = child.call("fwd", n=n)["loss"]
        rec.mark(Phase.FORWARD)
        child.call("bwd")
        rec.mark(Phase.BACKWARD)
        self._exchange(rec, shared.grads)
        rec.mark(Phase.COMM)
        child.call("upd")
        rec.mark(Phase.UPDATE)
        return float(loss)

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        reply = self._require_child().call("eval", n=self._require_shared().put(x, y))
        return float(reply["loss_sum"]), int(reply["correct"]) if self._model.classes else 0

    def parameter_checksum(self) -> float:
        shared = self._require_shared()
        self._require_child().call("get")
        return checksum(shared.weights)

    def versions(self) -> dict[str, str]:
        return {"cntk": self._version, "cntk_exchange": "mpi4py Allreduce per tensor"}

    def teardown(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
