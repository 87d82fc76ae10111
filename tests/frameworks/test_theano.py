"""Theano 1.0.5 (the `legacy` environment) and PyTensor (`modern`) through the one `theano`
adapter on real ranks: compiled forward, backward and update functions, one mpi4py
all-reduce per gradient.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name the environment, so their ranks run there; their point files are read back here. The
first compile of a graph takes a minute or more on a busy machine (its C code and Theano's
compiled functions cached afterwards, in `$HPCBENCH_CACHE`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hpcbench.frameworks.jax import weights
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, skip_unless_required, spec_text
from tests.frameworks.cells import check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
TIMED = ("data", "forward", "backward", "comm", "update")  # no h2d: numpy goes into the functions
LIBRARIES = [pytest.param("legacy", "theano", id="theano"), pytest.param("modern", "pytensor", id="pytensor")]
VERSIONS = {"theano": "1.0.5", "pytensor": "3.0.7"}


def run_in(exe: Path, code: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ)
    )


def library_python(env: str, library: str) -> Path:
    """Environment `env`'s interpreter if `library` imports there the way the adapter imports
    it (a plain `import theano` fails without its flags: see `library.py`), with mpi4py;
    else skip, or fail with under CI (tests/conftest.py `skip_unless_required`)."""
    exe = env_python(env, "mpi4py")
    res = run_in(exe, "from hpcbench.frameworks.theano import library; print(library.load().name)", 240)
    found = res.stdout.strip().splitlines()[-1:] == [library]
    if res.returncode != 0 or not found:
        why = f"environment {env!r} does not use {library}: {(res.stdout + res.stderr).strip()[-300:]}"
        skip_unless_required(f"needs {library} in the {env} environment (bash envs/build.sh {env}): {why}")
    return exe


def check_cell(data: PointData, iterations: int = ITERATIONS + WARMUP, learns: bool = True) -> None:
    """Every phase on every rank; per rank and iteration one message per weight tensor,
    together exactly the model's gradient bytes, inside the iteration's backward..comm
    window; the ranks' weights agree and the loss is finite; with `learns`, the task was
    learnt (accuracy, falling loss)."""
    check_phases(data, iterations, TIMED, zero=("h2d",))
    it = data.iterations
    assert np.isfinite(it["loss"]).all()
    tensors = len(weights.initial(models.model(data.point.model), 0))  # BatchNorm: scale and shift, not its statistics
    check_messages(data, per_op=tensors)
    assert len(set(data.comm["name"].tolist())) == tensors
    check_weights_agree(data)
    ev = data.eval
    assert np.isfinite(ev["loss"]).all()
    if learns:
        accuracy = ev["correct"].sum() / ev["total"].sum()
        assert accuracy > 0.9, accuracy
        assert (it["loss"][:, -1] < it["loss"][:, 0]).all()


@pytest.mark.timeout(900)  # a first compile (nothing cached yet) on a busy machine
@pytest.mark.parametrize(("env", "library"), LIBRARIES)
def test_compiled_functions_exchange_every_gradient_and_ranks_agree(
    write_spec: Callable[..., Path], tmp_path: Path, env: str, library: str
) -> None:
    library_python(env, library)
    text = spec_text(
        f"{library}", {"ranks_per_node": [2]}, framework="theano", backend="mpi", env=env, model="mlp",
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    (data,) = run_sweep(write_spec, tmp_path / "out", text, timeout=880)
    check_cell(data)
    prov = data.provenance
    assert prov["theano_library"] == library and prov[library] == VERSIONS[library]
    assert prov[f"{library}_floatx"] == "float32"


# The models whose evaluation graph is compiled and run for its output shape (the others'
# parameters are counted): see the module doc for the compile times of the big ones.
SHAPED = ("lenet", "mlp", "autoencoder", "cifar10_quick", "alexnet", "tiny")
# Theano trains AlexNet and ResNet-50 on ranks. PyTensor refuses ResNet-50 (its Numba linker
# compiles it for over 20 minutes); its AlexNet trains too (about 5 minutes, mostly Numba's
# first compile), which CI leaves to the graph test below (Dropout, every layer kind) to keep
# its time: add ("modern", "pytensor", ("alexnet",)) here to run it.
BIG = [pytest.param("legacy", "theano", ("alexnet", "resnet50"), id="theano")]


@pytest.mark.timeout(1800)  # a first compile of AlexNet and ResNet-50 on a busy machine
@pytest.mark.parametrize(("env", "library", "names"), BIG)
def test_alexnet_and_resnet50_train_on_two_ranks(
    write_spec: Callable[..., Path], tmp_path: Path, env: str, library: str, names: tuple[str, ...]
) -> None:
    """The zoo's big models (Dropout; BatchNorm and residual blocks) through the real
    adapter: two ranks, a batch of 2 synthetic samples, 1 iteration after 1 of warm-up: two
    steps, the second on the weights the first's exchange and update gave (every message of
    both checked, the ranks' weights compared after them). Under load a ResNet-50 step takes
    5-17 s; compiling its functions (Theano's graph rewrites) about 50 s, or unpickling them
    from the cache of compiled functions (`frameworks/theano/compiled.py`) about 15 s."""
    library_python(env, library)
    text = spec_text(
        f"{library}-big", {"model": list(names)}, framework="theano", backend="mpi", env=env,
        ranks_per_node=2, dataset="synthetic", batch_size=2, iterations=1, warmup=1, optimizer="sgd", lr=0.001,
        threads=1,
    )  # fmt: skip
    cells = run_sweep(write_spec, tmp_path / "out", text, timeout=1780)
    assert sorted(c.point.model for c in cells) == sorted(names)
    for data in cells:
        check_cell(data, iterations=2, learns=False)
        assert data.provenance["theano_library"] == library


# A small tree made of zoo records: a residual block with an identity shortcut, one with a
# projection (BatchNorm of its own eps and momentum), a Concat of a 1x1 convolution, a
# padded max pool with a 1x3 convolution and an average pool, and two Dropouts.
TINY = models.Model(
    "tiny", (3, 12, 12), 5,
    (
        *models.conv_bn_relu(8, 3, pad=1),
        models.Residual((models.conv(8, 3, pad=1, bias=False), models.BatchNorm(), models.RELU, models.conv(8, 1))),
        models.RELU,
        models.Residual(
            (*models.conv_bn_relu(8, 3, 2, 1), models.conv(16, 1, bias=False), models.BatchNorm()),
            (models.conv(16, 1, 2, bias=False), models.BatchNorm(eps=1e-3, momentum=0.3)),
        ),
        models.RELU,
        models.Concat(
            (
                models.conv_relu(4, 1),
                (models.Pool("max", 3, 1, 1), models.conv(6, (1, 3), pad=(0, 1))),
                (models.Pool("avg", 3, 1, 1),),
            )
        ),
        models.GlobalAvgPool(), models.Flatten(), models.Dropout(0.5), models.Dense(7), models.RELU,
        models.Dropout(0.3), models.Dense(5),
    ),
)  # fmt: skip


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("env", "library"), LIBRARIES)
def test_graphs_have_the_model_trees_outputs_and_the_split_backward_the_full_gradient(env: str, library: str) -> None:
    """Every zoo model's graph holds its parameters and, for the models of at most 224x224
    inputs, gives the zoo's output shape; on a small tree of every kind of layer (and on
    LeNet) the layer-by-layer backward from the forward's saved tensors gives the gradient
    of the whole loss (with the same dropout masks); training moves the BatchNorms' running
    statistics as PyTorch does; masks are redrawn at every call. PyTensor compiles in
    FAST_COMPILE mode (no Numba)."""
    exe = library_python(env, library)
    code = f"""
import numpy as np
from hpcbench.frameworks.jax import weights
from hpcbench.frameworks.theano import layers, library
from hpcbench.workloads import zoo
from hpcbench.workloads.zoo import *  # the records TINY's repr names
TINY = {TINY!r}
lib = library.load(); T = lib.tensor
# PyTensor: no Numba compile; Theano: its default (CorrMM has only a C implementation, cached)
mode = "FAST_COMPILE" if lib.name == "pytensor" else None
fn = lambda inputs, outputs, **kw: lib.module.function(inputs, outputs, mode=mode, **kw)
rng = np.random.default_rng(0)
for m in [zoo.model(name) for name in zoo.IMAGE_NAMES] + [TINY]:
    steps = weights.steps(m)
    ws = [lib.module.shared(w, name=n) for n, w in weights.initial(m, 0)]
    state = [lib.module.shared(v, name=n) for n, v in weights.state(m)]
    x, y = T.tensor4("x", dtype="float32"), T.lvector("y")
    built = sum(w.get_value().size for w in ws)
    if m.name not in {SHAPED!r}:
        print(m.name, built, zoo.count_parameters(m), "-", "-", flush=True)
        continue
    batch = 4 if m.input[1] < 100 else 1
    xs = rng.standard_normal((batch, *m.input)).astype(np.float32)
    ys = np.arange(batch) % max(m.classes, 1)
    evaluation = layers.forward(lib, steps, ws, x, state, train=False)
    shape = fn([x], evaluation.output)(xs).shape
    agree = "-"
    if m.name in ("lenet", "tiny"):
        train = layers.forward(lib, steps, ws, x, state, seed=3)
        cost = layers.loss(lib, m.task, train.output, x, y)
        forward = fn([x, y], [cost, *train.saved], updates=train.updates)
        saved = [o.type() for o in train.saved]
        last = lib.module.grad(layers.loss(lib, m.task, saved[-1], x, y), saved[-1])
        grads = layers.backward(lib, steps, ws, x, saved, last)
        backward = fn([x, *saved, y], grads, on_unused_input="ignore")
        masks = [mask.type() for mask in train.masks]
        full = fn([x, y, *masks], lib.module.grad(cost, ws), givens=list(zip(train.masks, masks)))
        _, *acts = forward(xs, ys)
        drawn = [acts[train.saved.index(mask)] for mask in train.masks]
        split = backward(xs, *acts, ys)
        agree = all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(split, full(xs, ys, *drawn)))
        if m.name == "tiny":
            _, *again = forward(xs, ys)
            redrawn = [again[train.saved.index(mask)] for mask in train.masks]
            rates = [0.5, 0.3]
            for a, b, rate in zip(drawn, redrawn, rates):
                kept = np.unique(a)  # 0 and 1 / (1 - rate)
                agree = agree and (a != b).any() and len(kept) == 2 and np.allclose(kept, [0, 1 / (1 - rate)])
            # the first BatchNorm normalises conv0's output (acts[0]) with its batch's biased
            # variance and moves its running statistics twice (two calls), momentum 0.1
            c0 = acts[0]
            mean, biased, unbiased = c0.mean(axis=(0, 2, 3)), c0.var(axis=(0, 2, 3)), c0.var(axis=(0, 2, 3), ddof=1)
            normed = (c0 - mean[None, :, None, None]) / np.sqrt(biased[None, :, None, None] + 1e-5)
            agree = agree and np.allclose(acts[1], normed, atol=1e-4)
            agree = agree and np.allclose(state[0].get_value(), 0.19 * mean, atol=1e-5)
            agree = agree and np.allclose(state[1].get_value(), 0.81 + 0.19 * unbiased, rtol=1e-4)
        agree = str(bool(agree))
    print(m.name, built, zoo.count_parameters(m), tuple(shape[1:]) == zoo.shapes(m), agree, flush=True)
"""
    res = run_in(exe, code, timeout=880)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == [*models.IMAGE_NAMES, "tiny"]
    for name, built, expected, shape_ok, agree in rows:
        assert int(built) == int(expected), name
        assert shape_ok == ("True" if name in SHAPED else "-"), name
        assert agree == ("True" if name in ("lenet", "tiny") else "-"), name


@pytest.mark.timeout(600)
def test_compiled_functions_come_back_from_the_cache_on_the_build_at_hand(tmp_path: Path) -> None:
    """Theano's functions of the small tree (BatchNorm, Dropout, momentum slots): a second
    build of the same graphs unpickles them, on its own weights and dropout seed, and
    computes what functions compiled for that build compute; the key follows the graph (a
    learning rate, a layer's width) and not the seed; a damaged file is compiled again and
    replaced."""
    exe = library_python("legacy", "theano")
    code = f"""
import numpy as np
from pathlib import Path
from hpcbench.frameworks.jax import weights
from hpcbench.frameworks.theano import compiled, library
from hpcbench.frameworks.theano.adapter import function_specs
from hpcbench.workloads.zoo import *  # the records TINY's repr names
TINY = {TINY!r}
lib = library.load()
rng = np.random.default_rng(0)
xs = rng.standard_normal((4, *TINY.input)).astype(np.float32)
ys = np.arange(4) % TINY.classes

def graphs(seed, lr=0.01, model=TINY):
    ws = [lib.module.shared(w, name=n) for n, w in weights.initial(model, 5)]
    state = [lib.module.shared(v, name=n) for n, v in weights.state(model)]
    return function_specs(lib, model, ws, state, seed, "momentum", lr, 0.9), [*ws, *state]

def key(**kw):
    specs, given = graphs(**kw)
    return compiled.key(lib, specs, given)

def train(root, seed):
    specs, given = graphs(seed)
    built = compiled.functions(lib, specs, given, root=Path(root))
    fresh = all(np.array_equal(a.get_value(), b.get_value()) for a, b in zip(given, built.shared))
    f = built.functions
    out = []
    for _ in range(2):  # two steps: the second on the updated weights, with new masks
        loss, *acts = f["forward"](xs, ys)
        grads = f["backward"](xs, *acts, ys)
        f["update"](*grads)
        out += [np.float64(loss), *acts]
    out += [w.get_value() for w in built.shared[: len(given)]]  # weights and running statistics
    out += list(f["evaluate"](xs, ys))
    return built.loaded, fresh, out

def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))

files = lambda root: sorted(Path(root, "functions").glob("*.pkl"))
root = "{tmp_path}/cache"
a = train(root, 3)
b = train(root, 4)
d = train(root, 3)
(entry,) = files(root)  # one entry for both seeds
entry.write_bytes(b"not a pickle")
e = train(root, 4)
f = train(root, 4)
print("loaded", a[0], b[0], d[0], e[0], f[0])
print("fresh", all(run[1] for run in (a, b, d, e, f)))
print("seed4", same(b[2], e[2]) and same(f[2], e[2]), "seed3", same(a[2], d[2]), "differ", not same(a[2], b[2]))
print("files", len(files(root)))
wider = Model(TINY.name, TINY.input, TINY.classes, (*TINY.layers[:-4], Dense(9), *TINY.layers[-3:]))  # Dense(7)
print("keys", key(seed=3) == key(seed=4), key(seed=3) != key(seed=3, lr=0.02), key(seed=3) != key(seed=3, model=wider))
"""
    res = run_in(exe, code, timeout=580)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.splitlines()[-5:] == [
        # compiled, unpickled twice (another seed, the first again), compiled again over the
        # damaged file, unpickled from the file that replaced it
        "loaded False True True False True",
        "fresh True",  # every build's own initial weights and statistics, not the pickled ones
        "seed4 True seed3 True differ True",  # what its own compile computes; the seed matters
        "files 1",
        "keys True True True",
    ], res.stdout[-2000:] + res.stderr[-2000:]
