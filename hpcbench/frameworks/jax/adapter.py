"""JAX on CPU: one process per rank, gradients averaged with `lax.pmean` across processes.

Set-up: `JAX_PLATFORMS=cpu` (before jax is imported), then `jax.distributed.initialize`
with rank 0's host and a free port agreed over MPI (`rank.net.free_port`, the bookkeeping
communicator's broadcast), the launcher's rank as process id. Every process then sees one
local and `size` global CPU devices; the exchange's mesh holds them all (`exchange.py`).

Several devices per rank (`devices_per_rank` D > 1, `replicas.py`): D host-platform CPU
devices (`--xla_force_host_platform_device_count`, before jax is imported), forward and
backward `pmap`ped over them on `batch_size` samples each, their gradients averaged in the
process (`lax.pmean` over the local axis), then exchanged across ranks once, as with one.

Every image model of the zoo is a pure function of its weights and its BatchNorm state
(`layers.py`, walking the layer tree `weights.py` gives: Concat, Residual, BatchNorm and
Dropout included); every transformer one of its weights (`blocks.py`: attention through
`jax.nn.dot_product_attention`, JAX's fused scaled dot-product attention, causal and
grouped-query). Initial weights come from the point's seed and are broadcast from rank 0
over MPI anyway. A step runs three compiled programs and the exchange:

- forward: `jax.vjp` of the training loss, returning the loss, the pull-back (its
  residuals) and the BatchNorm running statistics moved towards the batch's (kept for the
  next step and for evaluation); Dropout's masks come from the point's seed folded with
  the rank, the iteration and the layer's serial number;
- backward: the pull-back applied to 1, every gradient as this process's shard (1, *S);
- comm: the exchange's `pmean` (one per tensor, or one fused: the backend);
- update: the optimizer (SGD, momentum 0.9, Adam) on the averaged gradients.

The learnt weights (BatchNorm's scale and shift among them) are exchanged, so the messages
carry 4 bytes per parameter of `zoo.count_parameters`; the BatchNorm running statistics are
each rank's own, from its own batches: never exchanged, not in the parameter checksum.
Evaluation runs the model out of training: running statistics, no dropout; a short last
test batch is padded (its padding not counted), so one compiled test program serves all.

Precision: fp32, or (transformers) bf16 mixed precision: the fp32 master weights are cast
to bfloat16 inside the differentiated loss, so the gradients come back float32 and the
messages still carry 4 bytes a parameter; norm statistics, softmax and loss stay fp32.
fp16 is refused (JAX ships no loss scaling), tf32 too (a CUDA matmul mode; this adapter
runs on the CPU), and any `compile` mode: JAX always compiles its step with XLA. The
provenance records `precision`, `jax_compute_dtype` and, for a transformer, `attention`.

XLA's compiled programs are kept in JAX's persistent compilation cache,
`$HPCBENCH_CACHE/jax` (`compilation_cache_dir`; `JAX_COMPILATION_CACHE_DIR` wins; the
provenance's `jax_compilation_cache`): the ranks of a later point or run of the same
program load it instead of compiling again; JAX keys it by the program and its versions.

JAX dispatches asynchronously: a phase ends when its results are ready (the step waits for
them there, before dispatching the next phase, which needs them anyway). Gradients all
come out of one backward program, so backward and communication do not overlap.
`threads: 1` sets `--xla_cpu_multi_thread_eigen=false` (`XLA_FLAGS`, recorded), which JAX
0.10's CPU runtime no longer heeds: it computes on a thread per CPU the process may run on
(`rank_cpus` shows it), and says so in the provenance's `compute_threads`, which the
model's CPU contention counts.

jax is imported only inside methods (with `layers.py` and `exchange.py`, which need it):
this module is registered in interpreters without it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import (
    ADAM,
    FRAMEWORKS,
    Framework,
    LauncherNeed,
    Problem,
    checksum,
    cpu_problems,
    model_for,
)
from hpcbench.frameworks.jax import weights as jax_weights
from hpcbench.frameworks.jax.replicas import Replicas, host_devices
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.rank.net import free_port
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

_COORDINATOR = LauncherNeed("the coordinator's address is agreed over MPI")
ATTENTION = "jax.nn.dot_product_attention"  # the transformers' attention (blocks.py)
_NO_COMPILE = "JAX always compiles its step with XLA (jax.jit): there is no eager mode to switch from"


@FRAMEWORKS.register
class JaxFramework(Framework):
    name = "jax"
    requires = ("jax",)
    backends = ("pmean", "pmean_fused")
    models = zoo.IMAGE_NAMES + zoo.TRANSFORMER_NAMES
    datasets = data.NAMES
    # bf16: mixed precision (fp32 master weights cast to bfloat16 in the step; blocks.py),
    # for the transformers; no compile modes: every step is compiled (_check_numerics)
    precisions = ("fp32", "bf16")
    # every message's collective is a program of its own, which waits for the process's
    # runtime threads; waiting ranks sleep in the CPU collectives (Gloo)
    traits: ClassVar[Mapping[str, Traits]] = {
        "pmean": Traits(sleeping_wait=True, waits_per_message=True),
        "pmean_fused": Traits(grouping="one_message", sleeping_wait=True, waits_per_message=True),
    }
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {"pmean": _COORDINATOR, "pmean_fused": _COORDINATOR}
    several_devices = ("pmean", "pmean_fused")  # `pmap` over the rank's local devices (replicas.py)

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        yield from cpu_problems(point, "jax", "jax runs on the CPU here (JAX_PLATFORMS=cpu; no CUDA build of jaxlib)")

    @classmethod
    def _check_numerics(cls, point: Point) -> Iterable[Problem]:
        """fp32, or bf16 mixed precision for a transformer; tf32 (a CUDA matmul mode) and fp16
        (no standard loss scaling in JAX) are refused with their reasons, and any compile
        mode: JAX always compiles."""
        precision, allowed = point.precision, ", ".join(cls.precisions)
        if precision == "tf32":
            yield "precision", "tf32 is a CUDA matmul mode; jax runs on the CPU here", allowed
        elif precision == "fp16":
            yield (
                "precision",
                "jax has no standard loss scaling for fp16 (JAX itself ships none; jmp and optax are not part "
                "of it): train in bf16, which needs none",
                allowed,
            )
        elif precision == "bf16" and point.model not in zoo.TRANSFORMER_NAMES:
            why = "jax trains the image models in fp32 only (its bf16 mixed precision is for the transformers)"
            yield "precision", why, "fp32"
        elif precision is not None and precision not in cls.precisions:
            yield "precision", f"{cls.name} does not train in {precision}", allowed
        if point.compile is not None:
            yield "compile", f"{point.compile!r}: {_NO_COMPILE}", "none: leave compile unset"

    def __init__(self) -> None:
        self._rank, self._size = 0, 1
        self._coordinator = ""
        self._mpi: Any = None
        self._backend = ""
        self._iteration = 0
        self._precision = "fp32"
        self._model: zoo.Model | None = None

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        comm = self.mpi_ranks(point, comm)
        os.environ["JAX_PLATFORMS"] = "cpu"  # before jax is imported
        if point.threads == 1:
            flags = os.environ.get("XLA_FLAGS", "")
            os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
        host_devices(point.devices_per_rank)  # before jax is imported too
        import jax

        if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # else the user's own
            jax.config.update("jax_compilation_cache_dir", str(compilation_cache_dir()))
        self._rank, self._size, self._mpi = renv.rank, renv.size, comm.mpi_comm
        self._backend = point.backend
        if renv.size > 1:
            # The host's own name, not the launcher's node name: Slurm node names need not resolve.
            if comm.rank == 0:
                host = os.environ.get("HPCBENCH_MASTER_ADDR") or socket.gethostname()
                self._coordinator = comm.bcast(f"{host}:{free_port()}")
            else:
                self._coordinator = comm.bcast(None)
            timeout = int(self.init_timeout_s())
            jax.distributed.initialize(self._coordinator, renv.size, renv.rank, initialization_timeout=timeout)
        if jax.process_count() != renv.size or jax.process_index() != renv.rank:
            raise HpcbenchError(
                f"JAX sees process {jax.process_index()} of {jax.process_count()}, "
                f"the launcher rank {renv.rank} of {renv.size}"
            )

    def build(self, point: Point) -> None:
        import jax
        import jax.numpy as jnp

        from hpcbench.frameworks.jax.exchange import PmeanExchange

        model = self._model = model_for(point)
        self._precision = point.precision or "fp32"
        if model.name in zoo.TRANSFORMER_NAMES:
            named, train_loss, evaluate = _transformer(model, self._precision, point.seed)
        else:
            named, train_loss, evaluate = _tree(model, point.seed)
        for _, w in named:
            self._mpi.Bcast(w, root=0)  # the same weights everywhere, whatever the seed did
        self._names = [n for n, _ in named]
        # Committed to this process's device from the start, as every program's outputs are:
        # an uncommitted first input would compile every program a second time at step 2.
        device = self._device = jax.local_devices()[0]
        self.weights: list[Any] = [jax.device_put(w, device) for _, w in named]
        # BatchNorm's running statistics: this rank's own, never exchanged.
        self.bn_state: list[Any] = [jax.device_put(s, device) for _, s in jax_weights.state(model)]
        self._exchange = PmeanExchange(point.backend == "pmean_fused", self._names, [w.shape for _, w in named])

        rank = self._rank
        self._replicas = Replicas(train_loss, rank, point.devices_per_rank) if point.devices_per_rank > 1 else None

        def forward(w: Any, state: Any, x: Any, y: Any, iteration: Any) -> Any:
            def loss(w: Any) -> Any:
                return train_loss(w, state, x, y, iteration, rank)

            loss_value, pullback, new_state = jax.vjp(loss, w, has_aux=True)
            return loss_value, pullback, new_state

        def backward(pullback: Any) -> Any:
            (grads,) = pullback(jnp.ones((), jnp.float32))
            return [g[None] for g in grads]

        self._forward = jax.jit(forward)
        self._backward = jax.jit(backward)
        self._update, state = _optimizer(point.optimizer, point.lr, self.momentum, self.weights)
        self._state = jax.device_put(state, device)
        self._evaluate = jax.jit(evaluate)
        self.load_data(point, model, self._rank, self._size)

    def step(self, rec: Recorder) -> Any:
        import jax

        x, y = self.batches.next()
        rec.mark(Phase.DATA)
        several = self._replicas  # the rank's devices, or None: one device
        xd, yd = several.put(x, y) if several else (jax.device_put(x, self._device), jax.device_put(y, self._device))
        jax.block_until_ready((xd, yd))
        rec.mark(Phase.H2D)
        loss, pullback, bn_state = (several.forward if several else self._forward)(
            self.weights, self.bn_state, xd, yd, self._iteration
        )
        jax.block_until_ready((loss, bn_state))
        rec.mark(Phase.FORWARD)
        self.bn_state, self._iteration = bn_state, self._iteration + 1
        grads = several.backward(pullback) if several else self._backward(pullback)
        jax.block_until_ready(grads)
        rec.mark(Phase.BACKWARD)
        averaged = self._exchange.exchange(rec, grads)
        rec.mark(Phase.COMM)
        self.weights, self._state = self._update(self.weights, self._state, averaged)
        jax.block_until_ready(self.weights)
        rec.mark(Phase.UPDATE)
        return loss.addressable_data(0)[0] if several else loss  # the devices' mean

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """A short last batch is padded to the test batch (its first sample repeated, not
        counted), so the compiled test program serves every batch."""
        n, size = len(y), self.rank_data.eval_batch
        if n < size:
            x, y = (np.concatenate([a, np.repeat(a[:1], size - n, axis=0)]) for a in (x, y))
        loss_sum, correct = self._evaluate(self.weights, self.bn_state, x, y, n)
        return float(loss_sum), int(correct)

    def parameter_checksum(self) -> float:
        """The learnt weights' checksum (not the BatchNorm running statistics: each rank's own)."""
        return checksum(np.asarray(w) for w in self.weights)

    def peak_device_memory(self) -> int | None:
        """XLA's allocator peak on this rank's first local device (a GPU's; a CPU has no
        such statistics: None)."""
        import jax

        stats = jax.local_devices()[0].memory_stats()
        return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None

    def versions(self) -> dict[str, str]:
        import jax
        import jaxlib

        out = {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "jax_devices": str(jax.device_count()),
            "jax_local_devices": str(jax.local_device_count()),
            "jax_coordinator": self._coordinator,
            "jax_exchange": self._backend,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "precision": self._precision,  # what the step computed in (fp32 master weights either way)
            "jax_compute_dtype": "bfloat16" if self._precision == "bf16" else "float32",
            "jax_compilation_cache": str(jax.config.jax_compilation_cache_dir or ""),
        }
        if self._model is not None and self._model.name in zoo.TRANSFORMER_NAMES:
            out["attention"] = f"{ATTENTION} (implementation: xla)"
        collectives = getattr(jax.config, "jax_cpu_collectives_implementation", None)
        if collectives is not None:
            out["jax_cpu_collectives"] = str(collectives)
        return out

    def compute_threads(self, point: Point) -> int:
        """XLA's CPU client sizes its intra-op pool by the CPUs the process may run on,
        whatever `threads` and `--xla_cpu_multi_thread_eigen` say."""
        return len(os.sched_getaffinity(0))

    def comm_end(self) -> str:
        return schema.COMM_END_WAIT  # a message ends when its result is seen ready, waited for in dispatch order

    def teardown(self) -> None:
        import jax

        if self._size > 1:
            jax.distributed.shutdown()


def compilation_cache_dir() -> Path:
    """Where XLA's compiled programs are kept across processes (JAX's persistent compilation
    cache): `$HPCBENCH_CACHE/jax` (default ~/.cache/hpcbench/jax). JAX keys each program by
    its HLO, compile options, devices and the jax and jaxlib versions, so a changed model,
    batch or version compiles again; the ranks of a later point or run of the same program
    load it instead (ResNet-50's training step: about 20 s of compiling on a 2-core machine)."""
    return Path(os.environ.get("HPCBENCH_CACHE") or Path.home() / ".cache" / "hpcbench") / "jax"


def _tree(model: zoo.Model, seed: int) -> tuple[list[tuple[str, np.ndarray]], Any, Any]:
    """An image model's (initial weights, train_loss(w, state, x, y, iteration, replica) ->
    (loss, new BatchNorm state): Dropout's masks from the replica (the rank, or with several
    devices the rank's device's place in the job), evaluate(w, state, x, y, valid) -> (loss summed over the first
    `valid` samples, those correctly classified)): the layer tree of `weights.py` through
    `layers.py`."""
    import jax
    import jax.numpy as jnp

    from hpcbench.frameworks.jax import layers

    steps, task = jax_weights.steps(model), model.task

    def train_loss(w: Any, state: Any, x: Any, y: Any, iteration: Any, replica: Any) -> Any:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), replica), iteration)
        return layers.loss(steps, task, w, state, x, y, True, key)

    def evaluate(w: Any, state: Any, x: Any, y: Any, valid: Any) -> Any:
        out, _ = layers.apply(steps, w, state, x)
        counted = jnp.arange(x.shape[0]) < valid  # out of training every sample is on its own
        losses = jax.vmap(lambda o, a, b: layers.criterion(task, o[None], a[None], b[None]))(out, x, y)
        hits = (jnp.argmax(out, axis=1) == y) & counted if task == "classify" else jnp.zeros_like(counted)
        return jnp.sum(jnp.where(counted, losses, 0.0)), jnp.sum(hits)

    return jax_weights.initial(model, seed), train_loss, evaluate


def _transformer(model: zoo.Model, precision: str, seed: int) -> tuple[list[tuple[str, np.ndarray]], Any, Any]:
    """A transformer's (initial weights, train_loss, evaluate) as `_tree`'s, through
    `blocks.py` at `precision` (no BatchNorm state: the state passes through unchanged)."""
    from hpcbench.frameworks.jax import blocks

    network = blocks.Network(model, precision)

    def train_loss(w: Any, state: Any, x: Any, y: Any, iteration: Any, replica: Any) -> Any:
        return network.loss(w, x, y), state

    def evaluate(w: Any, state: Any, x: Any, y: Any, valid: Any) -> Any:
        return network.evaluate(w, x, y, valid)

    return network.initial(seed), train_loss, evaluate


def _optimizer(kind: str, lr: float, momentum: float, weights: list[Any]) -> tuple[Any, Any]:
    """(compiled update(weights, state, grads) -> (weights, state), initial state)."""
    import jax
    import jax.numpy as jnp

    def flat(g: Any) -> Any:
        return g.reshape(g.shape[1:])  # this process's shard (1, *S) of the averaged gradient

    if kind == "adam":
        b1, b2, eps = ADAM

        def adam(w: Any, state: Any, grads: Any) -> Any:
            m, v, t = state
            t = t + 1
            g = [flat(g) for g in grads]
            m = [b1 * a + (1 - b1) * b for a, b in zip(m, g, strict=True)]
            v = [b2 * a + (1 - b2) * b * b for a, b in zip(v, g, strict=True)]
            scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
            w = [p - scale * a / (jnp.sqrt(b) + eps) for p, a, b in zip(w, m, v, strict=True)]
            return w, (m, v, t)

        zeros = [jnp.zeros_like(w) for w in weights]
        return jax.jit(adam), (zeros, [jnp.zeros_like(w) for w in weights], jnp.zeros((), jnp.float32))
    if kind == "momentum":

        def sgd_momentum(w: Any, state: Any, grads: Any) -> Any:
            velocity = [momentum * b + flat(g) for b, g in zip(state, grads, strict=True)]
            return [p - lr * b for p, b in zip(w, velocity, strict=True)], velocity

        return jax.jit(sgd_momentum), [jnp.zeros_like(w) for w in weights]

    def sgd(w: Any, state: Any, grads: Any) -> Any:
        return [p - lr * flat(g) for p, g in zip(w, grads, strict=True)], state

    return jax.jit(sgd), ()
