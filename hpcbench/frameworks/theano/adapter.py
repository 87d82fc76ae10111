"""Theano 1.0.5 or PyTensor: compiled functions, one MPI all-reduce per gradient (mpi4py).

One adapter for both: Theano where it imports (the `legacy` environment), else PyTensor,
its maintained successor (`modern`); `library.py` sets each one's flags before importing it
and the provenance names the one used (`theano_library`). Every zoo model is built from the
zoo's description (`layers.py`: the layer tree and the weights of
`hpcbench.frameworks.jax.weights`, He-normal from the point's seed, broadcast from rank 0;
BatchNorms' running statistics as shared variables of their own, neither learnt nor
exchanged). Four compiled functions make a step:

- forward: (x, y) -> the loss and every tensor backward needs (each leaf layer's output,
  each Concat's and Residual's, each Dropout's mask); BatchNorms normalise with the batch's
  statistics and update their running ones, Dropout masks are drawn anew per call from
  streams seeded with the point's seed and the rank;
- backward: those tensors -> every weight's gradient, leaf by leaf from the saved tensors
  (no second forward pass);
- comm: one `Allreduce(IN_PLACE)` (sum) per gradient through mpi4py, last layer first, each
  timed as a message (`allreduce`, the weight's name), then divided by the ranks;
- update: a compiled optimizer step (SGD, momentum 0.9, Adam) on shared variables.

Evaluation compiles a fifth function (running statistics, no dropout). Inputs are numpy
arrays handed to the compiled functions (no `h2d` phase: 0 s). All gradients come out of
one backward function, so backward and communication do not overlap. The first compile of
a model takes 15-20 s per function for the plain models, half a minute for AlexNet's and
about 6 minutes for ResNet-50's in Theano on a busy 2-core machine; its C code is cached
per environment (`library.py`), and Theano's compiled functions too, keyed by their graphs
(`compiled.py`): a later build of the same graphs (the other ranks' of a later point,
another run) unpickles them (ResNet-50: about 13 s instead of 50 with the C code cached).
Theano's functions are compiled when made; PyTensor's Numba linker
compiles on the first call (`build` calls forward and backward once): AlexNet's in about
2 minutes, but ResNet-50's took over 20, so PyTensor refuses GoogLeNet, ResNet-50 and
Inception v3 (`PYTENSOR_TOO_SLOW`: at planning for the `modern` environment, else in
`build`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks._mpi import HostMPIFramework
from hpcbench.frameworks.base import ADAM, FRAMEWORKS, Problem, checksum, model_for, transformers_refused
from hpcbench.frameworks.jax import weights as zoo_weights
from hpcbench.frameworks.theano import compiled, library
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.registry import import_error
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import zoo

_SLOW = (
    "PyTensor's Numba linker compiles it for more than 20 minutes on first use (ResNet-50 on "
    "a 2-core machine: 7 minutes of graph rewrites, then over 12 minutes of Numba for the "
    "forward function alone); Theano (the legacy environment) compiles it in about 6"
)
PYTENSOR_TOO_SLOW = {"googlenet": _SLOW, "resnet50": _SLOW, "inception_v3": _SLOW}
PYTENSOR_MODELS = tuple(name for name in zoo.IMAGE_NAMES if name not in PYTENSOR_TOO_SLOW)


@FRAMEWORKS.register
class TheanoFramework(HostMPIFramework):
    name = "theano"
    requires = ()  # Theano or PyTensor, whichever imports: see `unavailable`
    traits: ClassVar[Mapping[str, Traits]] = {"mpi": Traits(mpi_exchange=True)}  # blocking, after backward
    cpu_only = "theano runs on the CPU here (gradients exchanged from host memory)"
    refusals: ClassVar[Mapping[str, str]] = transformers_refused(
        "Theano 1.0.5 and PyTensor compile graphs of batched dots and softmax: neither has a fused attention "
        "kernel, so a transformer would misreport them"
    )

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        if point.model in PYTENSOR_TOO_SLOW and _library_of(point) == "pytensor":
            yield (
                "model",
                PYTENSOR_TOO_SLOW[point.model],
                f"env legacy (Theano); with PyTensor: {', '.join(PYTENSOR_MODELS)}",
            )

    @classmethod
    def unavailable(cls, backend: str) -> str | None:
        missing = import_error(("mpi4py",))
        if missing is not None:
            return missing
        try:
            library.load()
        except ImportError as exc:
            return str(exc)
        return None

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        self.join(point, renv, comm)
        self.lib = library.load()

    def build(self, point: Point) -> None:
        lib = self.lib
        if lib.name == "pytensor" and point.model in PYTENSOR_TOO_SLOW:  # an environment planning could not tell
            raise HpcbenchError(f"theano (PyTensor) does not build {point.model}: {PYTENSOR_TOO_SLOW[point.model]}")
        model = self._model = model_for(point)
        named = zoo_weights.initial(model, point.seed)
        for _, w in named:
            self.mpi.Bcast(w, root=0)
        self._names = [n for n, _ in named]
        weights = [lib.module.shared(w, name=n) for n, w in named]
        state = [lib.module.shared(v, name=n) for n, v in zoo_weights.state(model)]

        # Dropout masks differ per rank (each trains on samples of its own) and per call.
        seed = point.seed * 1_000_003 + self.rank
        specs = function_specs(lib, model, weights, state, seed, point.optimizer, point.lr, self.momentum)
        # Compiled, or the same graphs' functions from the cache (Theano: `compiled.py`),
        # on shared variables of their own: the weights and statistics read back are theirs.
        built = compiled.functions(lib, specs, [*weights, *state])
        self.weights, self.state = built.shared[: len(weights)], built.shared[len(weights) : len(weights) + len(state)]
        fns = built.functions
        self._forward, self._backward, self._update, self._evaluate = (
            fns["forward"], fns["backward"], fns["update"], fns["evaluate"]
        )  # fmt: skip

        shard = self.load_data(point, model, self.rank, self.size)
        if lib.name == "pytensor":
            # PyTensor's Numba linker compiles a function on its first call (a minute for a
            # backward graph on a busy machine): call forward and backward once here, outside
            # the timed loop, on the first batch's shape (the weights are not updated, the
            # BatchNorms' running statistics are put back). Theano compiled them already.
            x0, y0 = shard.train.x[: point.batch_size], shard.train.y[: point.batch_size]
            before = [s.get_value() for s in self.state]
            _, *outs0 = self._forward(x0, y0)
            self._backward(x0, *outs0, y0)
            for i, value in enumerate(before):
                self.state[i].set_value(value)

    def _exchange(self, rec: Recorder, grads: list[Any]) -> list[np.ndarray]:
        """Every gradient summed over the ranks in place, last layer first, each timed; then averaged."""
        out = [np.ascontiguousarray(g, dtype=np.float32) for g in grads]
        self.allreduce.average(rec, [(self._names[i], out[i]) for i in reversed(range(len(out)))])
        return out

    def step(self, rec: Recorder) -> Any:
        x, y = self.batches.next()
        rec.mark(Phase.DATA)
        loss, *outs = self._forward(x, y)
        rec.mark(Phase.FORWARD)
        grads = self._backward(x, *outs, y)
        rec.mark(Phase.BACKWARD)
        averaged = self._exchange(rec, grads)
        rec.mark(Phase.COMM)
        self._update(*averaged)
        rec.mark(Phase.UPDATE)
        return float(loss)

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        loss, out = self._evaluate(x, y)
        return float(loss) * len(y), int((np.asarray(out).argmax(axis=1) == y).sum()) if self._model.classes else 0

    def parameter_checksum(self) -> float:
        return checksum(w.get_value() for w in self.weights)

    def versions(self) -> dict[str, str]:
        lib = self.lib
        return {"theano_library": lib.name, lib.name: lib.version, **lib.flags()}


def function_specs(
    lib: library.Library,
    model: zoo.Model,
    weights: list[Any],
    state: list[Any],
    seed: int,
    optimizer: str,
    lr: float,
    momentum: float,
) -> dict[str, compiled.Spec]:
    """The four functions of a step and the evaluation's, as graphs on the shared `weights`
    and `state` (`state`: the BatchNorms' running statistics); `seed` seeds the dropout
    masks' random streams."""
    from hpcbench.frameworks.theano import layers

    T = lib.tensor
    steps = zoo_weights.steps(model)
    x, y = T.tensor4("x", dtype="float32"), T.lvector("y")
    train = layers.forward(lib, steps, weights, x, state, seed=seed)
    cost = layers.loss(lib, model.task, train.output, x, y)
    saved = [o.type() for o in train.saved]  # the forward's saved tensors, given back to backward
    last = lib.module.grad(layers.loss(lib, model.task, saved[-1], x, y), saved[-1])
    grads = layers.backward(lib, steps, weights, x, saved, last)
    averaged = [w.type() for w in weights]
    evaluation = layers.forward(lib, steps, weights, x, state, train=False).output
    return {
        "forward": compiled.Spec([x, y], [cost, *train.saved], train.updates),
        "backward": compiled.Spec([x, *saved, y], grads, kwargs={"on_unused_input": "ignore"}),
        "update": compiled.Spec(averaged, [], _updates(lib, optimizer, lr, momentum, weights, averaged)),
        "evaluate": compiled.Spec([x, y], [layers.loss(lib, model.task, evaluation, x, y), evaluation]),
    }


def _library_of(point: Point) -> str | None:
    """The library a point's ranks import, where planning can tell: Theano in the `legacy`
    environment, PyTensor in `modern`; without an environment, this interpreter's."""
    if point.env is None:
        return library.available()
    return {"legacy": "theano", "modern": "pytensor"}.get(point.env)


def _updates(
    lib: library.Library, kind: str, lr: float, momentum: float, weights: list[Any], grads: list[Any]
) -> list[Any]:
    """(shared variable, new value) pairs of one optimizer step on the averaged gradients."""
    shared, T = lib.module.shared, lib.tensor
    lr_ = np.float32(lr)
    if kind == "adam":
        b1, b2, eps = (np.float32(v) for v in ADAM)
        t = shared(np.float32(0), name="adam.t")
        t1 = t + 1
        scale = lr_ * T.sqrt(1 - b2**t1) / (1 - b1**t1)
        out: list[Any] = [(t, t1)]
        for w, g in zip(weights, grads, strict=True):
            m = shared(np.zeros_like(w.get_value()), name=f"{w.name}.m")
            v = shared(np.zeros_like(w.get_value()), name=f"{w.name}.v")
            m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            out += [(m, m1), (v, v1), (w, w - scale * m1 / (T.sqrt(v1) + eps))]
        return out
    if kind == "momentum":
        out = []
        for w, g in zip(weights, grads, strict=True):
            velocity = shared(np.zeros_like(w.get_value()), name=f"{w.name}.velocity")
            v1 = np.float32(momentum) * velocity + g
            out += [(velocity, v1), (w, w - lr_ * v1)]
        return out
    return [(w, w - lr_ * g) for w, g in zip(weights, grads, strict=True)]
