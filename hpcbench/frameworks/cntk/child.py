# mypy: disable-error-code="import-not-found,import-untyped"
"""CNTK 2.7's side of the `cntk` adapter: one Python 3.6 process beside every rank.

Run as a script by `bridge.Child` (`cntk-python -I child.py CMD_FD REPLY_FD`), never imported
by hpcbench: it is Python 3.6 code (no dataclasses, no `from __future__ import annotations`,
`typing`'s generic names) and imports nothing of hpcbench. It reads one JSON command per line from
CMD_FD and writes one JSON reply per line to REPLY_FD; the arrays travel through one shared
memory file (`bridge.Layout`): weights, gradients, then a batch of inputs and labels.

- build: the network from the zoo's description (`bridge.describe`) and a learner (the
  optimizer, its rate and the rank's momentum, `Framework.momentum`); replies
  with every parameter's name and shape, in the order of the shared arrays;
- attach PATH BATCH: the shared memory file the rank made for those parameters;
- fwd N: forward of the first N samples (training mode), kept for backward; the mean loss;
- bwd: the gradients of the mean loss into the shared gradients (computed from the kept
  forward state: no second forward pass);
- upd: the learner's update from the shared gradients (averaged by the rank over MPI);
- get / set: weights to / from the shared weights;
- eval N: the loss sum and correct predictions of N samples (inference mode);
- quit.

CNTK's learners divide the learning rate by the sample count given to `update`: the rank
hands over gradients already averaged over every sample of every rank, so the count is 1
and the step is the point's rate times the mean gradient, as in the other frameworks.
"""

import json
import math
import os
import sys
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

ADAM = (0.9, 0.999, 1e-8)  # beta1, beta2, epsilon


def _load_cntk() -> Any:
    """CNTK, imported without its warnings (unsupported distribution, no GPU libraries)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cntk

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        cntk.cntk_py.set_max_num_cputhreads(int(threads))
    return cntk


C: Any = _load_cntk()


class Network:
    """The zoo's layers as CNTK operations, parameters created in order (named after the layer)."""

    def __init__(self, seed: int, batch: int) -> None:
        self.seed = seed
        self.batch = batch
        self.params: List[Any] = []

    def _param(self, name: str, shape: Tuple[int, ...], init: Any) -> Any:
        p = C.parameter(shape, init=init, name=name)
        self.params.append(p)
        return p

    def _he(self) -> Any:
        return C.he_normal(seed=self.seed * 1000 + len(self.params))

    def sequence(self, layers: List[Dict[str, Any]], x: Any, prefix: str) -> Any:
        for i, layer in enumerate(layers):
            x = self.layer(layer, x, f"{prefix}{i}")
        return x

    def layer(self, spec: Dict[str, Any], x: Any, name: str) -> Any:
        kind = spec["type"]
        if kind == "Conv":
            return self._conv(spec, x, name)
        if kind == "Dense":
            if len(x.shape) > 1:
                x = C.reshape(x, (int(np.prod(x.shape)),))
            out = C.times(x, self._param(name + ".W", (x.shape[0], spec["out"]), self._he()))
            return out + self._param(name + ".b", (spec["out"],), 0.0) if spec["bias"] else out
        if kind == "BatchNorm":
            return self._batch_norm(spec, x, name)
        if kind == "Pool":
            return _pool(spec, x)
        if kind == "GlobalAvgPool":
            return C.reduce_mean(x, axis=(1, 2))
        if kind == "Flatten":
            return C.reshape(x, (int(np.prod(x.shape)),))
        if kind == "Activation":
            return C.relu(x) if spec["kind"] == "relu" else C.sigmoid(x)
        if kind == "Dropout":
            return C.dropout(x, spec["rate"], seed=self.seed)
        if kind == "Concat":
            branches = [self.sequence(b, x, f"{name}.{j}.") for j, b in enumerate(spec["branches"])]
            return C.splice(*branches, axis=0)
        if kind == "Residual":
            body = self.sequence(spec["body"], x, name + ".body.")
            return body + (self.sequence(spec["shortcut"], x, name + ".short.") if spec["shortcut"] else x)
        raise ValueError(f"no CNTK layer for {kind!r}")

    def _conv(self, spec: Dict[str, Any], x: Any, name: str) -> Any:
        (kh, kw), (ph, pw), stride = spec["kernel"], spec["pad"], spec["stride"]
        w = self._param(name + ".W", (spec["out"], x.shape[0], kh, kw), self._he())
        if ph or pw:
            x = C.pad(x, pattern=[(0, 0), (ph, ph), (pw, pw)])
        out = C.convolution(w, x, strides=(stride, stride), auto_padding=[False])
        if spec["bias"]:
            out = out + self._param(name + ".b", (spec["out"], 1, 1), 0.0)
        return out

    def _batch_norm(self, spec: Dict[str, Any], x: Any, name: str) -> Any:
        channels = (x.shape[0],)
        scale = self._param(name + ".scale", channels, 1.0)
        bias = self._param(name + ".bias", channels, 0.0)
        # The zoo's momentum m is the batch's weight in the running statistics; CNTK blends
        # with weight 1 - exp(-N / T) for a batch of N samples: T = -N / ln(1 - m).
        momentum = spec["momentum"]
        time_constant = -self.batch / math.log(1.0 - momentum) if 0.0 < momentum < 1.0 else 0.0
        return C.batch_normalization(
            x,
            scale,
            bias,
            C.constant(0.0, shape=channels),
            C.constant(1.0, shape=channels),
            spatial=True,
            normalization_time_constant=time_constant,
            epsilon=spec["eps"],
            running_count=C.constant(0.0, shape=()),
        )


def _pool(spec: Dict[str, Any], x: Any) -> Any:
    k, s, p = spec["kernel"], spec["stride"], spec["pad"]
    if p:  # zeros: the zoo counts them in an average and pads maxima only after a ReLU
        x = C.pad(x, pattern=[(0, 0), (p, p), (p, p)])
    op = C.MAX_POOLING if spec["kind"] == "max" else C.AVG_POOLING
    return C.pooling(x, op, (k, k), strides=(s, s), auto_padding=[False])


def _learner(kind: str, lr: float, momentum: float, params: List[Any]) -> Any:
    rate = C.learning_parameter_schedule(lr)
    if kind == "adam":
        b1, b2, eps = ADAM
        return C.adam(params, rate, C.momentum_schedule(b1), variance_momentum=C.momentum_schedule(b2), epsilon=eps)
    if kind == "momentum":  # v = m·v + g; w -= lr·v (not CNTK's default unit-gain form)
        return C.momentum_sgd(params, rate, C.momentum_schedule(momentum), unit_gain=False)
    return C.sgd(params, rate)


class Session:
    """The network, its learner and the shared arrays of one rank."""

    def __init__(self, cmd: Dict[str, Any]) -> None:
        model = cmd["model"]
        self.classes = model["classes"]
        shape = tuple(model["input"])
        self.x = C.input_variable(shape, np.float32, name="x")
        net = Network(cmd["seed"], cmd["batch"])
        self.z = net.sequence(model["layers"], self.x, "")
        self.params = net.params
        if self.classes:
            self.y = C.input_variable((self.classes,), np.float32, name="y")
            self.loss = C.cross_entropy_with_softmax(self.z, self.y)
        else:
            self.y = None
            flat = C.reshape(self.x, (int(np.prod(shape)),))
            self.loss = C.reduce_mean(C.square(self.z - flat), axis=0)
        self.both = C.combine([self.loss.output, self.z.output])
        self.learner = _learner(cmd["optimizer"], cmd["lr"], cmd["momentum"], self.params)
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + int(np.prod(p.shape)))
        self.state: Any = None
        self.n = 0

    def attach(self, path: str, batch: int) -> Dict[str, Any]:
        """The shared arrays in file `path` (made by the rank, laid out as `bridge.Layout`)."""
        total, shape = self.offsets[-1], tuple(self.x.shape)
        feature = int(np.prod(shape))
        buf = np.memmap(path, dtype=np.float32, mode="r+", shape=(2 * total + batch * (feature + 1),))
        self.weights, self.grads = buf[:total], buf[total : 2 * total]
        self.inputs = buf[2 * total : 2 * total + batch * feature].reshape((batch, *shape))
        self.labels = buf[2 * total + batch * feature :]
        return {}

    def _arguments(self, n: int) -> Dict[Any, Any]:
        x = np.ascontiguousarray(self.inputs[:n])
        if self.y is None:
            return {self.x: x}
        y = np.zeros((n, self.classes), np.float32)
        y[np.arange(n), self.labels[:n].astype(np.int64)] = 1.0
        return {self.x: x, self.y: y}

    def _slices(self, flat: Any) -> List[Any]:
        return [flat[a:b].reshape(p.shape) for p, a, b in zip(self.params, self.offsets, self.offsets[1:])]

    def forward(self, n: int) -> Dict[str, Any]:
        out = self.loss.output
        self.state, values = self.loss.forward(self._arguments(n), outputs=[out], keep_for_backward={out})
        self.n = n
        return {"loss": float(np.mean(values[out]))}

    def backward(self) -> Dict[str, Any]:
        out = self.loss.output
        root = {out: np.full((self.n, 1), 1.0 / self.n, np.float32)}
        grads = self.loss.backward(self.state, root, variables=set(self.params))
        for p, view in zip(self.params, self._slices(self.grads)):
            view[...] = grads[p]
        self.state = None
        return {}

    def update(self) -> Dict[str, Any]:
        values = {
            p: C.NDArrayView.from_dense(np.ascontiguousarray(g)) for p, g in zip(self.params, self._slices(self.grads))
        }
        self.learner.update(values, 1)
        return {}

    def get(self) -> Dict[str, Any]:
        for p, view in zip(self.params, self._slices(self.weights)):
            view[...] = p.value
        return {}

    def set(self) -> Dict[str, Any]:
        for p, view in zip(self.params, self._slices(self.weights)):
            p.value = np.ascontiguousarray(view)
        return {}

    def evaluate(self, n: int) -> Dict[str, Any]:
        _, values = self.both.forward(self._arguments(n), outputs=[self.loss.output, self.z.output])
        loss_sum = float(np.sum(values[self.loss.output]))
        correct = 0
        if self.classes:
            predicted = np.asarray(values[self.z.output]).reshape(n, -1).argmax(axis=1)
            correct = int((predicted == self.labels[:n].astype(np.int64)).sum())
        return {"loss_sum": loss_sum, "correct": correct}

    def describe(self) -> Dict[str, Any]:
        params = [[p.name, list(p.shape)] for p in self.params]
        return {"params": params, "output": list(self.z.shape), "version": C.__version__}


def handle(session: Optional[Session], cmd: Dict[str, Any]) -> Tuple[Optional[Session], Dict[str, Any]]:
    op = cmd["op"]
    if op == "build":
        session = Session(cmd)
        return session, session.describe()
    if session is None:
        raise RuntimeError(f"{op!r} before build")
    calls: Dict[str, Callable[[], Dict[str, Any]]] = {
        "bwd": session.backward,
        "upd": session.update,
        "get": session.get,
        "set": session.set,
    }
    if op == "attach":
        return session, session.attach(cmd["path"], cmd["batch"])
    if op == "fwd":
        return session, session.forward(cmd["n"])
    if op == "eval":
        return session, session.evaluate(cmd["n"])
    if op not in calls:
        raise ValueError(f"unknown command {op!r}")
    return session, calls[op]()


def main() -> int:
    commands = os.fdopen(int(sys.argv[1]), "r")
    replies = os.fdopen(int(sys.argv[2]), "w")
    session: Optional[Session] = None
    for line in commands:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            session, reply = handle(session, cmd)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the rank as text
            reply = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
