"""The zoo's networks as Caffe prototxt (a NetParameter in protobuf text), from the
framework-neutral trees of `hpcbench.workloads.zoo`. Plain text: no Caffe needed to make it.

Every layer gets a name from its kind and a counter (`conv1`, `fc3`, `bn2`, `pool1`), nested
layers the path of their block (`res4/body/conv2`, `mix3/b1/conv1`); every layer writes its
own blob, named like the layer (no in-place layers). The zoo's conventions in Caffe's terms:

- Conv -> Convolution (kernel_h/kernel_w, pad_h/pad_w, stride; Caffe correlates, as the zoo's
  convolutions do), weights He-normal (`msra`), bias 0;
- Dense -> InnerProduct (it flattens its input itself; weights `msra`, bias 0);
- Pool -> Pooling with `round_mode: FLOOR` (Caffe's default rounds up; the zoo rounds down);
  Caffe's average pool counts the padded zeros inside the padded image, as the zoo does;
- GlobalAvgPool -> Pooling AVE with `global_pooling`; Flatten -> Flatten;
- BatchNorm -> BatchNorm (running mean and variance: not learnt, `lr_mult: 0`, and
  `moving_average_fraction` = 1 - the zoo's momentum) followed by Scale with a bias (gamma
  and beta: the zoo's two parameters per channel);
- Activation -> ReLU or Sigmoid; Dropout -> Dropout (inverted: scaled at training, off at test);
- Concat -> the branches, then Concat along channels; Residual -> body and shortcut, then
  Eltwise SUM.

The loss: SoftmaxWithLoss over the labels for classifiers (mean over the batch), else
EuclideanLoss against the input with `loss_weight` 2/features, which makes Caffe's
sum/(2·batch) the mean squared error of the other frameworks (and its gradient theirs;
Caffe applies the weight to the gradient, not to the loss blob, which the adapter scales).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hpcbench.workloads import zoo

DATA, LABEL, LOSS = "data", "label", "loss"
LEARNT = ("Convolution", "InnerProduct", "Scale")  # layer types whose blobs are trained


@dataclass
class _Net:
    lines: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def name(self, prefix: str, kind: str) -> str:
        key = f"{prefix}{kind}"
        self.counts[key] = self.counts.get(key, 0) + 1
        return f"{key}{self.counts[key]}"

    def layer(self, name: str, kind: str, bottoms: Sequence[str], body: str = "", top: str | None = None) -> str:
        top = top or name
        text = [f'layer {{ name: "{name}" type: "{kind}"']
        text += [f'  bottom: "{b}"' for b in bottoms]
        text.append(f'  top: "{top}"')
        if body:
            text.append(f"  {body}")
        text.append("}")
        self.lines.append("\n".join(text))
        return top


def _filler() -> str:
    return 'weight_filler { type: "msra" } bias_filler { type: "constant" value: 0 }'


def _conv(layer: zoo.Conv) -> str:
    (kh, kw), (ph, pw) = layer.kernel, layer.pad
    bias = "" if layer.bias else "bias_term: false "
    return (
        f"convolution_param {{ num_output: {layer.out} kernel_h: {kh} kernel_w: {kw} pad_h: {ph} pad_w: {pw} "
        f"stride: {layer.stride} {bias}{_filler()} }}"
    )


def _pool(layer: zoo.Pool) -> str:
    kind = "MAX" if layer.kind == "max" else "AVE"
    return (
        f"pooling_param {{ pool: {kind} kernel_size: {layer.kernel} stride: {layer.stride} pad: {layer.pad} "
        "round_mode: FLOOR }"
    )


def _layers(net: _Net, layers: Sequence[zoo.Layer], bottom: str, prefix: str) -> str:
    for layer in layers:
        if isinstance(layer, zoo.Conv):
            bottom = net.layer(net.name(prefix, "conv"), "Convolution", [bottom], _conv(layer))
        elif isinstance(layer, zoo.Dense):
            bias = "" if layer.bias else "bias_term: false "
            body = f"inner_product_param {{ num_output: {layer.out} {bias}{_filler()} }}"
            bottom = net.layer(net.name(prefix, "fc"), "InnerProduct", [bottom], body)
        elif isinstance(layer, zoo.BatchNorm):
            name = net.name(prefix, "bn")
            fixed = "param { lr_mult: 0 decay_mult: 0 } " * 3
            stats = f"batch_norm_param {{ moving_average_fraction: {1.0 - layer.momentum:g} eps: {layer.eps:g} }}"
            bottom = net.layer(name, "BatchNorm", [bottom], fixed + stats)
            bottom = net.layer(f"{name}_scale", "Scale", [bottom], "scale_param { bias_term: true }")
        elif isinstance(layer, zoo.Pool):
            bottom = net.layer(net.name(prefix, "pool"), "Pooling", [bottom], _pool(layer))
        elif isinstance(layer, zoo.GlobalAvgPool):
            body = "pooling_param { pool: AVE global_pooling: true }"
            bottom = net.layer(net.name(prefix, "gap"), "Pooling", [bottom], body)
        elif isinstance(layer, zoo.Flatten):
            bottom = net.layer(net.name(prefix, "flat"), "Flatten", [bottom])
        elif isinstance(layer, zoo.Activation):
            kind = "ReLU" if layer.kind == "relu" else "Sigmoid"
            bottom = net.layer(net.name(prefix, kind.lower()), kind, [bottom])
        elif isinstance(layer, zoo.Dropout):
            body = f"dropout_param {{ dropout_ratio: {layer.rate:g} }}"
            bottom = net.layer(net.name(prefix, "drop"), "Dropout", [bottom], body)
        elif isinstance(layer, zoo.Concat):
            name = net.name(prefix, "mix")
            outs = [_layers(net, branch, bottom, f"{name}/b{i}/") for i, branch in enumerate(layer.branches, 1)]
            bottom = net.layer(name, "Concat", outs, "concat_param { axis: 1 }")
        elif isinstance(layer, zoo.Residual):
            name = net.name(prefix, "res")
            body = _layers(net, layer.body, bottom, f"{name}/body/")
            short = _layers(net, layer.shortcut, bottom, f"{name}/short/") if layer.shortcut else bottom
            bottom = net.layer(name, "Eltwise", [body, short], "eltwise_param { operation: SUM }")
        else:
            raise TypeError(f"no Caffe layer for {layer!r}")
    return bottom


@dataclass(frozen=True)
class NetText:
    text: str  # the NetParameter
    output: str  # the blob holding the model's output (logits, or the reconstruction)
    loss_weight: float  # Caffe scales the gradient by it, not the loss blob: loss = blob * loss_weight


def net(model: zoo.Model, batch: int) -> NetText:
    """The model's training net for mini-batches of `batch` samples, with its loss."""
    net = _Net()
    dims = " ".join(f"dim: {d}" for d in (batch, *model.input))
    net.layer(DATA, "Input", [], f"input_param {{ shape {{ {dims} }} }}")
    if model.classes:
        net.layer(LABEL, "Input", [], f"input_param {{ shape {{ dim: {batch} }} }}")
    output = _layers(net, model.layers, DATA, "")
    weight = 1.0
    if model.classes:
        net.layer(LOSS, "SoftmaxWithLoss", [output, LABEL])
    else:
        weight = 2.0 / math.prod(model.input)
        body = f"propagate_down: true propagate_down: false loss_weight: {weight!r}"
        net.layer(LOSS, "EuclideanLoss", [output, DATA], body)
    return NetText(f'name: "{model.name}"\n' + "\n".join(net.lines) + "\n", output, weight)


def solver(net_path: str, optimizer: str, lr: float, momentum: float, seed: int) -> str:
    """A SolverParameter for the net in `net_path`: a fixed learning rate, no weight decay,
    no test nets, no snapshots (the step is driven from Python: forward, backward, exchange,
    `apply_update`)."""
    moment = f"momentum: {momentum!r}\n" if optimizer == "momentum" else ""
    return (
        f'net: "{net_path}"\ntype: "SGD"\nbase_lr: {lr!r}\n{moment}lr_policy: "fixed"\nweight_decay: 0\n'
        f"max_iter: 2147483647\ndisplay: 0\nsnapshot_after_train: false\nrandom_seed: {seed}\n"
        "solver_mode: CPU\n"
    )


def learnt(kinds: Sequence[tuple[str, str]]) -> Iterator[str]:
    """The names of the layers (name, type) whose blobs are trained, in order."""
    return (name for name, kind in kinds if kind in LEARNT)
