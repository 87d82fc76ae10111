"""JAX on real ranks: gradients averaged by `lax.pmean` across `jax.distributed` processes
(one all-reduce per tensor, or one fused), in the `modern` environment: mlp learns its task
under both exchanges; alexnet (Dropout) and resnet50 (BatchNorm, Residual) train a few tiny
steps; the tiny GPT learns byte-level text in fp32 and in bf16 mixed precision. Every zoo
model builds (shapes, parameters, gradients; the transformers abstractly, at their published
sizes); the tree's layers (BatchNorm, Dropout, Concat, Residual) and the transformers' (causal
and grouped-query attention, RoPE, pre- and post-norm, the ViT stem) agree with a numpy
reference; planning refuses what JAX does not run (fp16, tf32, a compile mode).

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
from hpcbench.frameworks.jax.adapter import JaxFramework
from hpcbench.spec import Point
from hpcbench.store.reader import PointData
from hpcbench.workloads import zoo as models
from tests.conftest import ROOT, env_python, run_sweep, spec_text
from tests.frameworks.cells import PHASES, check_learns_tokens, check_messages, check_phases, check_weights_agree

pytestmark = pytest.mark.mpi

ITERATIONS, WARMUP = 30, 2
BIG_ITERATIONS, BIG_WARMUP, BIG_TIMEOUT_S = 1, 1, 900  # alexnet and resnet50: two steps, mostly compilation


# The transformer tests' programs are tiny: compiling them is most of their time, which XLA's
# lowest optimisation level roughly halves (the same numbers, to rounding).
QUICK_XLA = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}


def run_in(
    exe: Path, code: str, timeout: float = 240, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(environ or {})}
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
    """Two tiny steps (batch 2) of a full-size model, the second on the weights the first's
    exchange and update gave: alexnet's Dropout, resnet50's BatchNorm and residual blocks
    train on real ranks, every learnt tensor exchanged (the BatchNorm running statistics are
    not). Compiling dominates: minutes on a small CPU, its programs kept in JAX's persistent
    compilation cache for the next run."""
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
    # XLA's programs went to the compilation cache the provenance names (JAX keeps those that
    # took a second or more to compile: ResNet-50's forward takes about 20 s here)
    cache = Path(data.provenance["jax_compilation_cache"])
    assert cache.is_absolute() and cache.is_dir(), data.provenance
    if model == "resnet50":
        assert sorted(cache.glob("jit_forward-*")), sorted(cache.iterdir())


BUILD = """
import numpy as np, jax
from hpcbench.workloads import zoo
from hpcbench.frameworks.jax import layers, weights
for name in zoo.IMAGE_NAMES:
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
    """Every image model of the zoo traces in training (loss, gradients, BatchNorm state) and out of it:
    abstractly (`jax.eval_shape`), so the big models cost no compilation."""
    exe = env_python("modern", "jax")
    res = run_in(exe, BUILD)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == list(models.IMAGE_NAMES)
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


# ----------------------------------------------------------------------------------------
# Transformers (blocks.py).

TOKEN_ITERATIONS, TOKEN_WARMUP = 40, 2


def test_tiny_gpt_learns_text_on_two_ranks_in_fp32_and_bf16(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """gpt_tiny on byte-level text (seq_len 32) on 2 real ranks, in fp32 and in bf16 mixed
    precision: the loss falls on every rank, every gradient is exchanged in float32 (the
    master weights' dtype: 4 bytes a parameter, bf16 included), the ranks agree on their
    weights, the provenance names the precision and the attention."""
    env_python("modern", "jax")
    text = spec_text(
        "jax_gpt", {"precision": ["fp32", "bf16"]}, framework="jax", env="modern", ranks_per_node=2,
        backend="pmean_fused", model="gpt_tiny", dataset="text", seq_len=32, batch_size=8,
        iterations=TOKEN_ITERATIONS, warmup=TOKEN_WARMUP, optimizer="adam", lr=3e-3, threads=1, environ=QUICK_XLA,
    )  # fmt: skip
    points = {str(p.point.precision): p for p in run_sweep(write_spec, tmp_path / "out", text)}
    assert sorted(points) == ["bf16", "fp32"]
    for precision, data in points.items():
        check_phases(data, TOKEN_ITERATIONS + TOKEN_WARMUP, PHASES)
        check_messages(data, per_op=1, itemsize=4)
        check_weights_agree(data)
        check_learns_tokens(data)
        prov = data.provenance
        assert prov["precision"] == precision
        assert prov["jax_compute_dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[precision]
        assert prov["attention"] == "jax.nn.dot_product_attention (implementation: xla)"
        assert prov["xla_flags"] == f"{QUICK_XLA['XLA_FLAGS']} --xla_cpu_multi_thread_eigen=false"
    # byte-level text from uniform (ln 256 = 5.5 nats): clearly learnt in 40 steps
    for data in points.values():
        assert (data.iterations["loss"][:, -5:].mean(axis=1) < 3.6).all(), data.iterations["loss"][:, -5:]
        assert (data.eval["loss"] < 3.8).all(), data.eval["loss"]


# Every transformer traced abstractly at its published size (its parameters, its loss and
# float32 gradients), then a float64 numpy forward of the transformers, reading the weights
# in build order, against the tiny designs.
TRANSFORMERS = """
import numpy as np, jax, jax.numpy as jnp
from hpcbench.workloads import zoo
from hpcbench.frameworks.jax import blocks

for name in zoo.TRANSFORMER_NAMES:
    m = zoo.model(name)
    net = blocks.Network(m)
    w = net.abstract()
    x = jax.ShapeDtypeStruct((2, *m.input), jnp.int32 if m.tokens else jnp.float32)
    y = x if m.tokens else jax.ShapeDtypeStruct((2,), jnp.int32)
    out = jax.eval_shape(net.apply, w, x)
    ok = tuple(out.shape[1:]) == zoo.shapes(m) and out.dtype == jnp.float32
    if name.endswith("_tiny"):  # the loss and its float32 gradients (the same code at any size)
        loss, grads = jax.eval_shape(jax.value_and_grad(blocks.Network(m, "bf16").loss), w, x, y)
        ok = ok and loss.shape == () and [(g.shape, g.dtype) for g in grads] == [(a.shape, jnp.float32) for a in w]
    print("built", name, net.parameters(), zoo.count_parameters(m), ok)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def reference(model, weights, x):
    w, table, h = iter(weights), None, x

    def norm(rec, h):
        if rec.kind == "rms":
            return h / np.sqrt(np.mean(h * h, -1, keepdims=True) + rec.eps) * next(w)
        return (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + rec.eps) * next(w) + next(w)

    def matrix(h, bias):
        out = h @ next(w)
        return out + next(w) if bias else out

    def rope(t, theta):  # rotate half: pairs (i, i + d/2), frequencies theta^(-2i/d)
        d = t.shape[-1]
        angles = np.arange(t.shape[1])[:, None] * theta ** (-np.arange(0, d, 2) / d)[None]
        angles = np.concatenate([angles, angles], -1)[None, :, None]
        return t * np.cos(angles) + np.concatenate([-t[..., d // 2 :], t[..., : d // 2]], -1) * np.sin(angles)

    def attention(rec, h):
        b, s, d = h.shape
        hd, kv = d // rec.heads, rec.groups * (d // rec.heads)
        qkv = matrix(h, rec.bias)
        q = qkv[..., :d].reshape(b, s, rec.heads, hd)
        k, v = (qkv[..., d + i * kv : d + (i + 1) * kv].reshape(b, s, rec.groups, hd) for i in (0, 1))
        if rec.rotary:
            q, k = rope(q, rec.rope_theta), rope(k, rec.rope_theta)
        share = rec.heads // rec.groups  # query head n reads K/V head n // share
        k, v = np.repeat(k, share, axis=2), np.repeat(v, share, axis=2)
        logits = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(hd)
        if rec.causal:
            logits = np.where(np.tril(np.ones((s, s), bool)), logits, -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        out = np.einsum("bhst,bthd->bshd", p / p.sum(-1, keepdims=True), v).reshape(b, s, d)
        return matrix(out, rec.bias)

    def mlp(rec, h):
        if rec.kind == "swiglu":
            gate, up = np.split(h @ next(w), 2, axis=-1)
            return (gate / (1 + np.exp(-gate)) * up) @ next(w)
        return matrix(gelu(matrix(h, rec.bias)), rec.bias)

    for rec in model.layers:
        if isinstance(rec, zoo.Embedding):
            table = next(w)
            h = table[h] + (next(w)[0] if rec.types else 0)
        elif isinstance(rec, zoo.Positions):
            h = h + next(w)[: h.shape[1]]
        elif isinstance(rec, zoo.Patches):
            kernel, bias, cls, positions = next(w), next(w), next(w), next(w)
            b, c, hh, ww = h.shape
            p = rec.patch
            cut = h.reshape(b, c, hh // p, p, ww // p, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)
            h = np.concatenate([np.broadcast_to(cls, (b, 1, rec.dim)), cut @ kernel.reshape(rec.dim, -1).T + bias], 1)
            h = h + positions
        elif isinstance(rec, zoo.Norm):
            h = norm(rec, h)
        elif isinstance(rec, zoo.Block) and rec.pre_norm:
            h = h + attention(rec.attention, norm(rec.norm, h))
            h = h + mlp(rec.mlp, norm(rec.norm, h))
        elif isinstance(rec, zoo.Block):
            h = norm(rec.norm, h + attention(rec.attention, h))
            h = norm(rec.norm, h + mlp(rec.mlp, h))
        elif isinstance(rec, zoo.Dense):
            h = matrix(h, rec.bias)
        elif isinstance(rec, zoo.Activation):
            h = gelu(h)
        elif isinstance(rec, zoo.TokenHead):
            h = h @ (table.T if rec.tied else next(w)) + (next(w) if rec.bias else 0)
        elif isinstance(rec, zoo.Pooling):
            h = h[:, 0] if rec.kind == "first" else h.mean(1)
    assert next(w, None) is None, "every weight read"
    return h


def cross_entropy(logits, y):
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, np.maximum(y, 0)[..., None], -1)[..., 0]


rng = np.random.default_rng(0)
for name in ("gpt_tiny", "llama_tiny", "bert_tiny", "vit_tiny"):
    m = zoo.model(name, (16,)) if zoo.model(name).tokens else zoo.model(name)
    net = blocks.Network(m)
    w = [
        (rng.standard_normal(a.shape) * 0.2 + (1.0 if n.endswith("scale") else 0.0)).astype(np.float32)
        for n, a in net.initial(0)
    ]
    if m.tokens:
        x = rng.integers(0, m.classes - 1, (3, 16))
        y = rng.integers(0, m.classes, (3, 16))
        if m.task == "mlm":
            y = np.where(rng.random((3, 16)) < 0.3, y, -1)
    else:
        x, y = rng.standard_normal((3, *m.input)).astype(np.float32), rng.integers(0, m.classes, 3)
    want = reference(m, [a.astype(np.float64) for a in w], x)
    low = blocks.Network(m, "bf16")
    # one program a model: the fp32 and bf16 logits; the losses of the reference's logits
    logits = jax.jit(lambda w, x: (net.apply(w, x), low.apply(w, x)))
    got, got16 = logits(w, x)
    ref = jnp.asarray(want, jnp.float32)
    loss, (loss_sum, correct) = net.criterion(ref, y), net.test_sums(ref, y)
    first_two = net.test_sums(ref, y, 2)[0]  # a padded batch's: its first two samples counted
    scale = np.abs(want).max()
    assert np.abs(np.asarray(got) - want).max() < 1e-5 * scale, name
    assert np.abs(np.asarray(got16) - want).max() < 5e-2 * scale, name
    nll = cross_entropy(want, y)
    counted = y >= 0
    if m.task == "mlm":  # the masked positions only
        mean, per_sample = nll[counted].mean(), (nll * counted).sum(1) / np.maximum(counted.sum(1), 1)
    else:
        mean, per_sample = nll.mean(), nll.mean(axis=-1) if m.tokens else nll
    np.testing.assert_allclose(float(loss), mean, rtol=1e-4)
    np.testing.assert_allclose(float(loss_sum), per_sample.sum(), rtol=1e-4)
    np.testing.assert_allclose(float(first_two), per_sample[:2].sum(), rtol=1e-4)
    assert int(correct) == (0 if m.tokens else int((want.argmax(-1) == y).sum()))
    print("agrees", name)
"""


def test_jax_transformers_have_the_zoo_parameters_and_agree_with_a_numpy_reference() -> None:
    """Every transformer of the zoo, at its published size, builds exactly the parameters
    `zoo.count_parameters` counts (GPT-2 124,439,808; Llama 3.2 1B 1,235,814,400; ...) and
    traces its loss and float32 gradients: abstractly (`jax.eval_shape`), nothing allocated.
    The four tiny designs agree with a float64 numpy forward: causal attention (GPT), grouped
    query attention with RoPE, RMSNorm and SwiGLU (Llama), post-norm, token types and the
    masked-LM head (BERT), the patch stem and class token (ViT); bf16 mixed precision stays
    within bf16's rounding; the training loss is the mean token cross-entropy (masked-LM:
    over the masked positions only), the test loss sums each counted sample's mean."""
    exe = env_python("modern", "jax")
    res = run_in(exe, TRANSFORMERS, environ=QUICK_XLA)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    built = [r[1:] for r in rows if r[0] == "built"]
    assert [r[0] for r in built] == list(models.TRANSFORMER_NAMES)
    for name, parameters, expected, ok in built:
        assert int(parameters) == int(expected), name
        assert ok == "True", name
    tiny = ("gpt_tiny", "llama_tiny", "bert_tiny", "vit_tiny")
    assert [r for r in rows if r[0] != "built"] == [["agrees", name] for name in tiny]


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"precision": "fp16"}, "precision", "no standard loss scaling"),
        ({"precision": "tf32"}, "precision", "CUDA matmul mode"),
        ({"precision": "bf16", "model": "lenet"}, "precision", "image models in fp32 only"),
        ({"compile": "default"}, "compile", "JAX always compiles its step with XLA"),
        ({"model": "gpt_tiny", "dataset": "cifar10", "data_dir": "/d"}, "dataset", "reads tokens"),
        ({"seq_len": 4096}, "seq_len", "positions"),
    ],
)
def test_planning_refuses_what_jax_does_not_run(fields: dict[str, object], field: str, says: str) -> None:
    point = Point(**{"framework": "jax", "backend": "pmean", "model": "gpt_tiny", **fields})  # type: ignore[arg-type]
    problems = list(JaxFramework.check_point(point))
    assert [p[0] for p in problems] == [field], problems
    assert says in problems[0][1], problems


def test_planning_accepts_the_transformers_in_fp32_and_bf16() -> None:
    for name in models.TRANSFORMER_NAMES:
        for precision in (None, "fp32", "bf16"):
            point = Point(framework="jax", backend="pmean", model=name, precision=precision)
            assert list(JaxFramework.check_point(point)) == [], (name, precision)
