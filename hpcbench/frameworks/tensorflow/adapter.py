"""TensorFlow 2 (Keras 3): MultiWorkerMirroredStrategy, parameter servers, Horovod.

Every backend runs the same custom training loop (no `model.fit`), with the same phase
boundaries:

- data: the next batch of this rank's shard (numpy; images already channels-last: the
  NCHW arrays of `hpcbench.workloads.datasets` are transposed once, in `build`, not per step);
- h2d: the batch becomes TensorFlow tensors (a copy on CPU, to the device on GPU);
- forward, backward, comm, update: one compiled `tf.function` (a `GradientTape` inside),
  as TensorFlow runs a training step natively: forward, backward, the gradient messages,
  the optimizer step.

Marks inside the compiled step come from the graph itself: `tf.timestamp` ops ordered by
control dependencies stamp the end of forward (the loss is computed; backward is made to
start after that stamp), the end of backward (every gradient is ready), and each message's
begin (its gradients are ready; the message op waits for the stamp) and end (its result is
there). The function returns them with the loss; they are turned into phase marks and comm
events after the step's last mark, between steps' work. Nothing waits for a mark, and a
message may overlap backward where packing allows (`bytes_per_pack`), as in the strategy.
`backward` lasts until the last gradient is ready, `comm` is the exchange still outstanding
after that, `comm_total` the messages' summed durations, `update` the optimizer step (and
the function's return). The stamps are on the wall clock (0.24 us resolution at today's
epoch), mapped to the recorder's clock with one pair of clock reads per step (`stamps.py`).

Splitting the step into separately called functions instead (forward under an eager tape,
then `tape.gradient`) made LeNet's forward + backward twice as slow here (the backward of a
function called under a tape is not optimised with its forward), which is why the marks
come from inside the graph.

Backends (`extra` options in brackets), each with its own module:

- `multiworker` (`allreduce.py`): `tf.distribute.MultiWorkerMirroredStrategy`, its cluster
  built from the rank environment. Gradients are averaged with the strategy's collective,
  `CollectiveReduceV2` (ring over gRPC), called directly so that every message can be
  timed, in packs of about `bytes_per_pack` bytes, last layer first [default 0: one pack
  holding every gradient, as the strategy does inside a `tf.function`].
- `horovod` (`allreduce.py`): `horovod.tensorflow`; the same packs, each one fused Horovod
  message. Initial weights are broadcast from rank 0. [`bytes_per_pack` as above.]
- `ps` (`ps.py`): parameter servers; see there for the architecture, the `servers` and
  `sync` options and what is checked in asynchronous mode.

On GPU, the stamps are host times at which the ops ran on the host: kernel launches are
asynchronous, so there the split between phases is approximate (the iteration's total is
not).

Models: the image models (`layers.py`) and the transformers (`blocks.py`: attention is
`keras.ops.dot_product_attention`, which on the TensorFlow backend is einsum, masked softmax
in float32, einsum: TensorFlow has no fused attention kernel, and Keras refuses
`flash_attention=True` there). Losses: a classifier's cross-entropy, the autoencoder's
squared error, a language model's mean token cross-entropy over every position ("lm") or
over the masked positions only ("mlm"); always in float32. A test batch's loss is the sum
of its samples' losses, a sequence's being its mean token loss.

Precision (`precision`): Keras' dtype policy, set for the model's build and restored at
teardown: fp32 `float32`; bf16 `mixed_bfloat16`; fp16 `mixed_float16`, the optimizer inside
`keras.optimizers.LossScaleOptimizer` (dynamic loss scaling: the loss is scaled before
backward, the gradients are exchanged scaled and unscaled by its step, which skips a step
whose gradients are not finite: alike on every rank, as they see the same averaged
gradients). Weights and gradients stay float32, so the messages carry 4 bytes a parameter
whatever the policy. tf32 (CUDA only) is float32 with TensorFloat-32 matmuls; fp32 on CUDA
turns them off (TensorFlow's default computes float32 matmuls in TensorFloat-32 on Ampere
and later). fp16 is refused with the parameter servers (their kernels apply the gradients
unscaled).

Compile (`compile: xla`): the loss (model and loss function) is a `tf.function(jit_compile=True)`
called inside the step, so XLA compiles forward and, as its gradient, backward; the
optimizer step is one too (all-reduce backends). The step itself is not: its `tf.timestamp`
stamps and the collectives (`CollectiveReduceV2`, Horovod's ops) have no XLA kernels.
Unset: the step is a plain `tf.function` (graph mode, Grappler-optimised).

Several devices per rank (`devices_per_rank` D > 1; `multiworker`, `horovod`: `replicas.py`):
a `MirroredStrategy` over D logical CPU devices (or the rank's D GPUs) runs forward and
backward on every device, on `batch_size` samples each, and sums the replicas' gradients in
the process; the backend's exchange then carries them across ranks once, as with one device.

Every rank is seeded identically (`point.seed`) so initial weights agree before any
broadcast. `threads` sets TensorFlow's intra- and inter-op pools (before any op runs).
`parameter_checksum` covers the trainable weights (the exchanged ones; batch-norm moving
statistics are per rank, as in the strategy without synchronised batch norm).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.base import FRAMEWORKS, Framework, LauncherNeed, Problem, checksum, model_for
from hpcbench.frameworks.tensorflow import losses, optimizers, replicas
from hpcbench.frameworks.tensorflow.stamps import Step
from hpcbench.rank.collectives import Comm
from hpcbench.rank.env import RankEnv
from hpcbench.spec import Point
from hpcbench.store.traits import Traits
from hpcbench.trace.recorder import Phase, Recorder
from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

EXTRA_KEYS = {
    "multiworker": ("bytes_per_pack",),
    "horovod": ("bytes_per_pack",),
    "ps": ("servers", "sync"),
}


# The Keras dtype policy of each precision (tf32: float32 layers, TensorFloat-32 matmuls on CUDA).
POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# The transformers' attention (blocks.py) and what it lowers to on the TensorFlow backend.
ATTENTION = "keras.ops.dot_product_attention (tensorflow backend: einsum, masked softmax in float32, einsum)"


def _int_option(point: Point, key: str, default: int, minimum: int) -> int:
    value = dict(point.extra).get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise HpcbenchError(f"extra.{key}: {value!r} is not an integer >= {minimum}")
    return value


@FRAMEWORKS.register
class TensorFlowFramework(Framework):
    name = "tensorflow"
    requires = ("tensorflow",)
    backends = ("multiworker", "ps", "horovod")
    backend_requires: ClassVar[dict[str, tuple[str, ...]]] = {"horovod": ("horovod.tensorflow",)}
    models = zoo.IMAGE_NAMES + zoo.TRANSFORMER_NAMES
    datasets = data.NAMES
    # Keras' mixed-precision policies (weights and gradients stay float32; fp16 with
    # `keras.optimizers.LossScaleOptimizer`); tf32: TensorFloat-32 matmuls on CUDA
    precisions = tuple(POLICIES)
    # xla: the loss (model and loss function) a `tf.function(jit_compile=True)`, so XLA
    # compiles forward and its backward; the optimizer step one too (all-reduce backends)
    compile_modes = ("xla",)
    traits: ClassVar[Mapping[str, Traits]] = {
        # the strategy's collective over gRPC, whose waits sleep; as the strategy does: one pack
        "multiworker": Traits(grouping="one_message", sleeping_wait=True),
        # workers push to and pull from servers that apply each worker's gradients at once
        "ps": Traits(parameter_server=True, asynchronous=True),
        "horovod": Traits(grouping="fusion", background_thread=True),
    }
    several_devices = ("multiworker", "horovod")  # a MirroredStrategy over the rank's devices (replicas.py)
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {
        "multiworker": LauncherNeed("its cluster addresses are exchanged over MPI"),
        "ps": LauncherNeed("its cluster addresses are exchanged over MPI"),
        "horovod": LauncherNeed("Horovod connects the ranks", horovod=True),
    }

    @classmethod
    def _check_numerics(cls, point: Point) -> Iterable[Problem]:
        """The precisions and compile mode of the point's device and backend: tf32 only on
        CUDA, fp16 not with the parameter servers (no loss scaling there)."""
        yield from super()._check_numerics(point)
        allowed = ", ".join(p for p in cls.precisions if p != "tf32" or point.device == "cuda")
        if point.precision == "tf32" and point.device != "cuda":
            why = f"tf32 is a CUDA matmul mode (TensorFloat-32): there is none on the {point.device}"
            yield "precision", why, allowed
        if point.compile == "xla" and point.devices_per_rank > 1:
            why = (
                "compile: xla with several devices per rank: each replica's compiled loss would read the rank's "
                "variables on another device, which XLA does not"
            )
            yield "compile", why, "compile unset with devices_per_rank > 1"
        if point.precision == "fp16" and point.backend == "ps":
            why = (
                "fp16 trains with Keras' LossScaleOptimizer, whose step the ps backend does not run "
                "(its servers apply the gradients with TensorFlow's raw optimizer kernels, unscaled)"
            )
            yield "precision", why, ", ".join(p for p in allowed.split(", ") if p != "fp16")

    @classmethod
    def check_point(cls, point: Point) -> Iterable[Problem]:
        yield from super().check_point(point)
        allowed = EXTRA_KEYS.get(point.backend, ())
        for key, value in point.extra:
            if key not in allowed:
                yield "extra", f"{key!r} is not an option of tensorflow/{point.backend}", ", ".join(allowed) or "none"
            elif key == "sync" and not isinstance(value, bool):
                yield "extra", f"sync: {value!r} is not a boolean", "true, false"
            elif key != "sync" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                yield "extra", f"{key}: {value!r} is not a non-negative integer", "integers >= 0 (servers >= 1)"
        if dict(point.extra).get("servers") == 0:
            yield "extra", "servers: 0 parameter servers", "integers >= 1"

    def __init__(self) -> None:
        self._comm: Comm | None = None  # the job's bookkeeping communicator (MPI or Horovod)
        self._own_comm: Comm | None = None  # one made here (Horovod without MPI)
        self._strategy: Any = None
        self._mirrored: Any = None  # the MirroredStrategy over the rank's devices (devices_per_rank > 1)
        self._hvd: Any = None
        self._ps: Any = None  # tf_ps.ParameterServers
        self._exchange: Any = None  # the ParameterServers or the AllReduce: `step(rec, x, y)`
        self.rank = 0
        self.size = 1
        self._restore_policy: Any = None  # the dtype policy before build set the point's

    # ----------------------------------------------------------------------------------
    # setup: the distributed runtime

    def setup(self, point: Point, renv: RankEnv, comm: Comm | None) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ logging, before it is imported
        import tensorflow as tf

        threads = point.threads or int(os.environ.get("OMP_NUM_THREADS") or 0)
        threads = threads or max(1, (os.cpu_count() or 1) // max(renv.local_size, 1))
        # Before any op runs: the pools are created with the first op and fixed after that.
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        self.threads = threads
        replicas.make_devices(tf, point.device, point.devices_per_rank, renv.local_rank)
        if point.device == "cuda":
            # TensorFlow computes float32 matmuls in TensorFloat-32 on Ampere and later by
            # default: fp32 means float32 here, tf32 asks for TensorFloat-32.
            tf.config.experimental.enable_tensor_float_32_execution(point.precision == "tf32")
        self._comm = comm
        self.rank, self.size = renv.rank, renv.size
        self._point = point

        if point.backend == "horovod":
            import horovod.tensorflow as hvd

            hvd.init()
            self._hvd = hvd
            self.rank, self.size = hvd.rank(), hvd.size()
            if comm is None:
                from hpcbench.frameworks._horovod import HorovodComm

                self._own_comm = self._comm = HorovodComm(hvd)
            return

        comm = self.mpi_ranks(point, comm)
        self.rank, self.size = comm.rank, comm.size
        if point.backend == "multiworker":
            from hpcbench.frameworks.tensorflow.allreduce import multiworker_strategy

            self._strategy = multiworker_strategy(comm)
        elif point.backend == "ps":
            from hpcbench.frameworks.tensorflow import ps as tf_ps

            servers = _int_option(point, "servers", 1, 1)
            sync = bool(dict(point.extra).get("sync", False))
            self._ps = tf_ps.ParameterServers(comm, renv, servers, sync, threads)
        else:
            raise HpcbenchError(f"unknown tensorflow backend {point.backend!r}")

    def bookkeeping_comm(self) -> Comm | None:
        return self._own_comm

    # ----------------------------------------------------------------------------------
    # build: model, optimizer, data, compiled functions

    def build(self, point: Point) -> None:
        import keras
        import tensorflow as tf

        from hpcbench.frameworks.tensorflow.allreduce import AllReduce

        tree = self.tree = model_for(point)
        train = self.load_data(point, tree, self.rank, self.size).train
        # The point's policy for the layers built now (a rank builds one model; teardown
        # restores the one before).
        self._restore_policy = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_dtype_policy(POLICIES[point.precision or "fp32"])
        keras.utils.set_random_seed(point.seed)  # the same initial weights on every rank
        self.model, self.optimizer = self._model_and_optimizer(point, tree)
        self.variables = list(self.model.trainable_variables)
        loss_fn = losses.loss_function(tree)
        model, optimizer, variables = self.model, self.optimizer, self.variables
        jit = point.compile == "xla"

        def evaluate(x: Any, y: Any) -> tuple[Any, Any]:
            return losses.evaluation(tree, loss_fn, x, y, model(x, training=False))

        def forward(x: Any, y: Any) -> Any:
            return loss_fn(x, y, model(x, training=True))

        def update(grads: list[Any]) -> None:
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        step = Step(
            tf.function(forward, jit_compile=True) if jit else forward,
            tf.function(update, jit_compile=True) if jit else update,
            optimizer.scale_loss if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else None,
        )
        x_spec = tf.TensorSpec((point.rank_batch, *train.x.shape[1:]), tf.as_dtype(train.x.dtype))
        y_spec = tf.TensorSpec((point.rank_batch, *train.y.shape[1:]), tf.as_dtype(train.y.dtype))
        # any batch size: the test's last batch may be short (one trace for both)
        any_batch = [tf.TensorSpec((None, *spec.shape[1:]), spec.dtype) for spec in (x_spec, y_spec)]
        self._evaluate = tf.function(evaluate, input_signature=any_batch, jit_compile=jit)
        if self._ps is not None:
            capacity = point.iterations_for(self.batches.steps_per_epoch)
            self._ps.attach(model, step.forward, x_spec, y_spec, point, capacity)
            self._exchange = self._ps
        else:
            bytes_per_pack = _int_option(point, "bytes_per_pack", 0, 0)
            specs = (x_spec, y_spec)
            # with several devices, the step's forward and backward on each (replicas.py)
            self._mirrored, gradients = replicas.replicate(point.device, point.devices_per_rank)
            self._exchange = AllReduce(model, step, specs, bytes_per_pack, self.size, self._hvd, gradients)

    def _model_and_optimizer(self, point: Point, tree: zoo.Model) -> tuple[Any, Any]:
        """The Keras model and its optimizer, built (in the strategy's scope with one device)."""
        from hpcbench.frameworks.tensorflow import layers as tf_layers

        scoped = self._strategy is not None and point.devices_per_rank == 1
        with self._strategy.scope() if scoped else contextlib.nullcontext():
            model = tf_layers.build(tree)
            optimizer = optimizers.optimizer(point, self.momentum)
            optimizer.build(model.trainable_variables)
        return model, optimizer

    def prepare_split(self, split: data.Split) -> data.Split:
        """Channels-last once, for the whole shard: the step's data phase stays a view."""
        if split.x.ndim != 4:
            return split
        return data.Split(np.ascontiguousarray(split.x.transpose(0, 2, 3, 1)), split.y)

    # ----------------------------------------------------------------------------------
    # the timed step

    def step(self, rec: Recorder) -> Any:
        import tensorflow as tf

        x, y = self.batches.next()
        rec.mark(Phase.DATA)
        xt = tf.constant(x)
        yt = tf.constant(y)
        rec.mark(Phase.H2D)
        # One compiled graph: forward, backward, exchange, update, as TensorFlow runs a
        # training step natively. Its phase boundaries come back as timestamps taken inside
        # the graph (`tf.timestamp` ops ordered by control dependencies), so nothing waits
        # for a mark and the exchange may overlap backward where packing allows it.
        return self._exchange.step(rec, xt, yt)

    # ----------------------------------------------------------------------------------
    # after training

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        import tensorflow as tf

        loss, correct = self._evaluate(tf.constant(x), tf.constant(y))
        return float(loss), int(correct)

    def parameter_checksum(self) -> float:
        return checksum(v.numpy() for v in self.variables)

    def versions(self) -> dict[str, str]:
        import keras
        import tensorflow as tf

        out = {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "tf_backend": self._point.backend,
            "tf_intra_op_threads": str(tf.config.threading.get_intra_op_parallelism_threads()),
            "tf_inter_op_threads": str(tf.config.threading.get_inter_op_parallelism_threads()),
        }
        point = self._point
        out["precision"] = point.precision or "fp32"
        out["dtype_policy"] = str(keras.mixed_precision.dtype_policy().name)
        if point.device == "cuda":
            out["tf32_execution"] = str(tf.config.experimental.tensor_float_32_execution_enabled())
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            out["loss_scaling"] = "keras.optimizers.LossScaleOptimizer (dynamic)"
        out["compile"] = "xla: tf.function(jit_compile=True) of the loss and its backward" if point.compile else "none"
        if point.compile and self._ps is None:
            out["compile"] += ", and of the optimizer step"
        if point.model in zoo.TRANSFORMER_NAMES:
            out["attention"] = ATTENTION
        if self._strategy is not None:
            out["tf_strategy"] = type(self._strategy).__name__
        if self._mirrored is not None:
            out["tf_replicas"] = replicas.describe(self._mirrored)
        if self._hvd is not None:
            import horovod

            out["horovod"] = horovod.__version__
            out["horovod_controller"] = "mpi" if self._hvd.mpi_enabled() and self._hvd.mpi_built() else "gloo"
        if self._ps is not None:
            out.update(self._ps.describe())
        return out

    def teardown(self) -> None:
        # Every rank's last collective has returned, but a peer may still be reading the
        # last chunk from this rank's server: leave together.
        if self._comm is not None and self.size > 1:
            self._comm.barrier()
        if self._ps is not None:
            self._ps.close()
        if self._hvd is not None:
            self._hvd.shutdown()
        if self._restore_policy is not None:
            import keras

            keras.mixed_precision.set_dtype_policy(self._restore_policy)
