"""JAX on real ranks: gradients averaged by `lax.pmean` across `jax.distributed` processes
(one all-reduce per tensor, or one fused), in the `modern` environment: mlp learns its task
under both exchanges; alexnet (Dropout) and resnet50 (BatchNorm, Residual) train a few tiny
steps. Every zoo model builds (shapes, parameters, gradients); the tree's layers (BatchNorm,
Dropout, Concat, Residual) agree with a numpy reference.

Sweeps run through the real sweep CLI of this interpreter, as a user runs them: the points
name `env: modern`, so their ranks run there; their point files are read back here.
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
from tests.conftest import ROOT, env_python, run_sweep, spec_text
from tests.frameworks.cells import PHASES, check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
BIG_ITERATIONS, BIG_WARMUP, BIG_TIMEOUT_S = 3, 1, 900  # alexnet and resnet50: a few steps, mostly compilation


def run_in(exe: Path, code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([str(exe), "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def check_exchange(data: PointData, iterations: int) -> None:
    """Every phase on every rank; per rank and iteration the messages carry exactly the
    model's gradient bytes (4 per learnt parameter: BatchNorm's scale and shift, not its
    running statistics), one per learnt tensor or one fused, inside the iteration's
    backward..comm window; the losses and test losses are finite and the ranks' weights
    agree."""
    point = data.point
    learnt = sum(step.learnt for step in weights.leaves(weights.steps(models.model(point.model))))
    tensors = learnt if point.backend == "pmean" else 1
    check_phases(data, iterations, PHASES)
    check_messages(data, per_op=tensors)
    check_weights_agree(data)
    assert np.isfinite(data.iterations["loss"]).all(), (point.model, data.iterations["loss"])
    assert np.isfinite(data.eval["loss"]).all(), (point.model, data.eval["loss"])
    prov = data.provenance
    assert prov["jax"] == "0.10.2" and prov["jax_devices"] == str(point.ranks)
    assert prov["jax_exchange"] == point.backend
    assert prov["comm_end"] == "wait"
    # XLA computes on a thread per CPU whatever `threads` says: the count the model is given
    assert prov["compute_threads"] == len(os.sched_getaffinity(0)) and point.threads == 1


def check_cell(data: PointData) -> None:
    """`check_exchange`, and the task was learnt."""
    check_exchange(data, ITERATIONS + WARMUP)
    ev, it = data.eval, data.iterations
    accuracy = ev["correct"].sum() / ev["total"].sum()
    assert accuracy > 0.9, (data.point.backend, accuracy)
    assert (it["loss"][:, -1] < it["loss"][:, 0]).all()


def test_pmean_per_tensor_and_fused_exchange_every_gradient(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    env_python("modern", "jax")
    text = spec_text(
        "jax", {"backend": ["pmean", "pmean_fused"]}, framework="jax", env="modern", ranks_per_node=2, model="mlp",
        batch_size=32, iterations=ITERATIONS, warmup=WARMUP, optimizer="momentum", lr=0.01, threads=1,
    )  # fmt: skip
    points = {p.point.backend: p for p in run_sweep(write_spec, tmp_path / "out", text)}
    assert sorted(points) == ["pmean", "pmean_fused"]
    for data in points.values():
        check_cell(data)
    # One message per weight tensor (mlp: 3 dense layers x (kernel, bias)), or one for all.
    per_tensor, fused = points["pmean"].comm, points["pmean_fused"].comm
    assert len(set(per_tensor["name"].tolist())) == 6
    assert set(fused["name"].tolist()) == {b"all"}
    assert len(fused) == 2 * (ITERATIONS + WARMUP)
    # The same data, weights and averages: both exchanges end with the same weights.
    a, b = (points[k].eval["param_checksum"][0] for k in ("pmean", "pmean_fused"))
    assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize(("model", "backend"), [("alexnet", "pmean"), ("resnet50", "pmean_fused")])
@pytest.mark.slow
@pytest.mark.timeout(BIG_TIMEOUT_S + 60)
def test_big_models_train_on_two_ranks(
    write_spec: Callable[..., Path], tmp_path: Path, model: str, backend: str
) -> None:
    """A few tiny steps (batch 2) of a full-size model: alexnet's Dropout, resnet50's
    BatchNorm and residual blocks train on real ranks, every learnt tensor exchanged (the
    BatchNorm running statistics are not). Compiling dominates: minutes on a small CPU."""
    env_python("modern", "jax")
    text = spec_text(
        "jax_big", {"backend": [backend]}, framework="jax", env="modern", ranks_per_node=2, model=model,
        batch_size=2, iterations=BIG_ITERATIONS, warmup=BIG_WARMUP, optimizer="momentum", lr=1e-4, threads=1,
    )  # fmt: skip
    (data,) = run_sweep(write_spec, tmp_path / "out", text, timeout=BIG_TIMEOUT_S)
    assert (data.point.model, data.point.backend) == (model, backend)
    check_exchange(data, BIG_ITERATIONS + BIG_WARMUP)
    names = set(data.comm["name"].tolist())
    if backend == "pmean":  # one message per learnt tensor: alexnet's 8 layers x (kernel, bias)
        assert len(names) == 16
    else:
        assert names == {b"all"}


BUILD = """
import numpy as np, jax
from hpcbench.workloads import zoo
from hpcbench.frameworks.jax import layers, weights
for name in zoo.NAMES:
    m = zoo.model(name)
    steps = weights.steps(m)
    w = [a for _, a in weights.initial(m, 0)]
    s = [a for _, a in weights.state(m)]
    x, y = np.zeros((2, *m.input), np.float32), np.zeros(2, np.int32)

    def train(w, s, x, y, key):
        def f(w):
            return layers.loss(steps, m.task, w, s, x, y, True, key)
        (loss, new_state), grads = jax.value_and_grad(f, has_aux=True)(w)
        return loss, new_state, grads

    loss, new_state, grads = jax.eval_shape(train, w, s, x, y, jax.random.key(0))
    out, kept = jax.eval_shape(lambda w, s, x: layers.apply(steps, w, s, x), w, s, x)
    shapes_ok = (
        loss.shape == () and tuple(out.shape[1:]) == zoo.shapes(m)
        and [g.shape for g in grads] == [a.shape for a in w]
        and [a.shape for a in new_state] == [a.shape for a in s] == [a.shape for a in kept]
    )
    bn = sum(isinstance(st.layer, zoo.BatchNorm) for st in weights.leaves(steps))
    print(name, sum(a.size for a in w), zoo.count_parameters(m), shapes_ok, len(s) == 2 * bn)
"""


def test_jax_models_have_the_parameters_and_outputs_of_the_model_trees() -> None:
    """Every zoo model traces in training (loss, gradients, BatchNorm state) and out of it:
    abstractly (`jax.eval_shape`), so the big models cost no compilation."""
    exe = env_python("modern", "jax")
    res = run_in(exe, BUILD)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == list(models.NAMES)
    for name, built, expected, shapes_ok, state_ok in rows:
        assert int(built) == int(expected), name
        assert shapes_ok == "True", name
        assert state_ok == "True", name


# A numpy reference of `layers.apply` (float64), and checks of a small tree against it and of
# the invariants of BatchNorm and Dropout.
LAYERS = """
import numpy as np, jax
from hpcbench.workloads import zoo
from hpcbench.frameworks.jax import layers, weights


def windows(x, kh, kw, stride, pad, fill):
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])), constant_values=fill)
    h, w = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    for a in range(kh):
        for b in range(kw):
            yield a, b, xp[:, :, a : a + stride * (h - 1) + 1 : stride, b : b + stride * (w - 1) + 1 : stride]


def reference(tree, w, state, x, train, mask):
    new_state = list(state)

    def leaf(step, x):
        layer = step.layer
        if isinstance(layer, zoo.Conv):
            k, patches = w[step.weight], windows(x, *layer.kernel, layer.stride, layer.pad, 0.0)
            out = sum(np.einsum("nchw,oc->nohw", p, k[:, :, a, b]) for a, b, p in patches)
            return out + w[step.weight + 1][None, :, None, None] if step.bias else out
        if isinstance(layer, zoo.Pool):
            fill = -np.inf if layer.kind == "max" else 0.0
            pad = (layer.pad, layer.pad)
            ps = np.stack([p for _, _, p in windows(x, layer.kernel, layer.kernel, layer.stride, pad, fill)])
            return ps.max(axis=0) if layer.kind == "max" else ps.sum(axis=0) / layer.kernel**2
        if isinstance(layer, zoo.BatchNorm):
            axes, shape = ((0, 2, 3), (1, -1, 1, 1)) if x.ndim == 4 else ((0,), (1, -1))
            if train:
                mean, var, n = x.mean(axis=axes), x.var(axis=axes), x.size // x.shape[1]
                m = layer.momentum
                new_state[step.state] = (1 - m) * state[step.state] + m * mean
                new_state[step.state + 1] = (1 - m) * state[step.state + 1] + m * var * n / (n - 1)
            else:
                mean, var = state[step.state], state[step.state + 1]
            norm = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + layer.eps)
            return norm * w[step.weight].reshape(shape) + w[step.weight + 1].reshape(shape)
        if isinstance(layer, zoo.Dropout):
            return np.where(mask(step, x.shape), x / (1 - layer.rate), 0.0) if train else x
        if isinstance(layer, zoo.Dense):
            return x @ w[step.weight] + (w[step.weight + 1] if step.bias else 0.0)
        if isinstance(layer, zoo.GlobalAvgPool):
            return x.mean(axis=(2, 3), keepdims=True)
        if isinstance(layer, zoo.Flatten):
            return x.reshape(len(x), -1)
        return np.maximum(x, 0.0) if layer.kind == "relu" else 1 / (1 + np.exp(-x))

    def sequence(steps, x):
        for step in steps:
            if isinstance(step.layer, zoo.Concat):
                x = np.concatenate([sequence(b, x) for b in step.branches], axis=1)
            elif isinstance(step.layer, zoo.Residual):
                x = sequence(step.branches[0], x) + sequence(step.branches[1], x)
            else:
                x = leaf(step, x)
        return x

    return sequence(tree, x), new_state


m = zoo.Model("tree", (3, 6, 6), 4, (
    zoo.conv(4, 3, pad=1), zoo.BatchNorm(), zoo.RELU,
    zoo.Residual((zoo.conv(4, 3, pad=1, bias=False), zoo.BatchNorm(1e-3, 0.3))),
    zoo.Concat(((zoo.conv(2, 1),), (zoo.Pool("max", 3, 1, 1), zoo.conv(3, 1)), (zoo.Pool("avg", 3, 1, 1),))),
    zoo.Residual((zoo.conv(6, 3, 2, 1),), (zoo.conv(6, 1, 2, bias=False), zoo.BatchNorm())),
    zoo.GlobalAvgPool(), zoo.Flatten(), zoo.Dense(8), zoo.BatchNorm(), zoo.Dropout(0.5), zoo.Dense(4),
))
tree = weights.steps(m)
assert weights.count(weights.initial(m, 0)) == zoo.count_parameters(m)
rng = np.random.default_rng(1)
w = [rng.standard_normal(a.shape).astype(np.float32) * 0.5 for _, a in weights.initial(m, 0)]
s = [(rng.standard_normal(a.shape) if n.endswith("mean") else rng.uniform(0.5, 2, a.shape)).astype(np.float32)
     for n, a in weights.state(m)]
x = rng.standard_normal((8, 3, 6, 6)).astype(np.float32)
key = jax.random.key(7)
train = jax.jit(lambda w, s, x, key: layers.apply(tree, w, s, x, True, key))
evaluate = jax.jit(lambda w, s, x: layers.apply(tree, w, s, x))


def mask(step, shape):
    return np.asarray(jax.random.bernoulli(jax.random.fold_in(key, step.index), 0.5, shape))


f64 = [a.astype(np.float64) for a in w], [a.astype(np.float64) for a in s], x.astype(np.float64)
for is_train in (True, False):
    out, new = train(w, s, x, key) if is_train else evaluate(w, s, x)
    want, want_state = reference(tree, *f64, is_train, mask)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)
    assert len(new) == len(s) == 8
    for got, ref in zip(new, want_state):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-5)
    print("reference", "train" if is_train else "eval", "ok")
again, _ = evaluate(w, s, x)
assert (np.asarray(again) == np.asarray(evaluate(w, s, x)[0])).all()
other, _ = train(w, s, x, jax.random.key(8))
assert not np.allclose(np.asarray(other), np.asarray(train(w, s, x, key)[0]))
print("determinism ok")

bn = zoo.Model("bn", (3, 5, 5), 0, (zoo.BatchNorm(),))
xb = (3 + 2 * rng.standard_normal((16, 3, 5, 5))).astype(np.float32)
ones = [a for _, a in weights.initial(bn, 0)]
out, (mean, var) = layers.apply(weights.steps(bn), ones, [a for _, a in weights.state(bn)], xb, True)
out = np.asarray(out)
assert np.abs(out.mean(axis=(0, 2, 3))).max() < 1e-4 and np.abs(out.var(axis=(0, 2, 3)) - 1).max() < 1e-3
n = 16 * 25
np.testing.assert_allclose(np.asarray(mean), 0.1 * xb.mean(axis=(0, 2, 3)), rtol=1e-5)
np.testing.assert_allclose(np.asarray(var), 0.9 + 0.1 * xb.var(axis=(0, 2, 3)) * n / (n - 1), rtol=1e-5)
print("batchnorm ok")

drop = zoo.Model("drop", (100000,), 0, (zoo.Dropout(0.3),))
xd = np.ones((2, 100000), np.float32)
out, _ = layers.apply(weights.steps(drop), [], [], xd, True, key)
out = np.asarray(out)
kept = out != 0
assert abs(kept.mean() - 0.7) < 0.01 and np.allclose(out[kept], 1 / 0.7)
assert (np.asarray(layers.apply(weights.steps(drop), [], [], xd)[0]) == xd).all()
print("dropout ok")
"""


def test_tree_layers_agree_with_a_numpy_reference() -> None:
    """A small tree (Conv, BatchNorm in images and flat, Residual with an identity and a
    projection shortcut, Concat of three branches, both pools, Dropout) against numpy, in
    training (batch statistics, running statistics updated PyTorch's way, the masks of the
    key folded with the layer's serial number) and out of it (running statistics, no
    dropout, deterministic); BatchNorm normalises per channel; Dropout keeps 1 - rate of the
    units, scaled by 1 / (1 - rate)."""
    exe = env_python("modern", "jax")
    res = run_in(exe, LAYERS)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:-1] == [
        "reference train ok", "reference eval ok", "determinism ok", "batchnorm ok", "dropout ok",
    ]  # fmt: skip
