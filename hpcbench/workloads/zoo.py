"""The benchmark models, described once and built by every framework from this description.

A model is a tree of plain layer records (`Conv`, `Dense`, `Concat`, `Residual`, ...). Each
framework adapter turns the tree into its own layers (`frameworks/*/layers.py`: the PyTorch,
Keras and Gluon builders), so the architectures are the same by construction and their
parameter counts can be checked against `count_parameters`, which walks the same tree.

Layout conventions every builder follows: images are NCHW here (a builder for a channels-last
framework transposes its input), pooling rounds down (explicit `pad` where the original
network rounded up), padding of a max-pool is applied after a ReLU, so zero padding and
-inf padding give the same result, and average pools count padded zeros (as PyTorch's and
MXNet's defaults do).

Models (seed papers in parentheses):

=================  ===========  =======  =====================================================
name               input        classes  what
=================  ===========  =======  =====================================================
lenet              1x28x28      10       LeNet-5 (002)
mlp                1x28x28      10       two hidden layers of 512 (001)
autoencoder        1x28x28      -        784-256-64-256-784 dense autoencoder (001)
cifar10_quick      3x32x32      10       Caffe's cifar10_quick (002)
alexnet            3x224x224    1000     AlexNet, one-tower variant without LRN (000, 004)
googlenet          3x224x224    1000     GoogLeNet / Inception v1 without auxiliary heads (000, 004)
resnet50           3x224x224    1000     ResNet-50 v1.5 (000, 004)
inception_v3       3x299x299    1000     Inception v3 without the auxiliary head (004)
=================  ===========  =======  =====================================================

and the transformers (`transformers.py`: gpt2_124m, gpt2_350m, llama_1b, bert_base, vit_b16
and their tiny variants gpt_tiny, llama_tiny, bert_tiny, vit_tiny), built from the records of
`blocks.py`.

A model built on a real dataset takes the dataset's image shape and class count instead
(LeNet on CIFAR-10 is 3x32x32, 10 classes; a language model on byte-level text has a
vocabulary of 256); `shapes` refuses inputs too small for a model.

This module is the zoo's public face: `model`, `NAMES`, and, re-exported, the layer records
(`layers.py`), the architectures' table (`architectures.py`) and shape inference and
parameter counts (`shapes.py`).
"""

from __future__ import annotations

from hpcbench.errors import HpcbenchError
from hpcbench.workloads.architectures import ARCHITECTURES
from hpcbench.workloads.blocks import (
    Attention,
    Block,
    Embedding,
    FeedForward,
    Norm,
    Patches,
    Pooling,
    Positions,
    TokenHead,
)
from hpcbench.workloads.layers import (
    RELU,
    Activation,
    BatchNorm,
    Concat,
    Conv,
    Dense,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Layer,
    Model,
    Pool,
    Residual,
    Shape,
    conv,
    conv_bn_relu,
    conv_relu,
)
from hpcbench.workloads.shapes import (
    count_parameters,
    gradient_sizes,
    layer_parameters,
    output_shape,
    sequence_shape,
    shapes,
    size,
)
from hpcbench.workloads.transformers import OBJECTIVES, TRANSFORMERS

__all__ = [
    "IMAGE_NAMES",
    "NAMES",
    "RELU",
    "TRANSFORMER_NAMES",
    "Activation",
    "Attention",
    "BatchNorm",
    "Block",
    "Concat",
    "Conv",
    "Dense",
    "Dropout",
    "Embedding",
    "FeedForward",
    "Flatten",
    "GlobalAvgPool",
    "Layer",
    "Model",
    "Norm",
    "Patches",
    "Pool",
    "Pooling",
    "Positions",
    "Residual",
    "Shape",
    "TokenHead",
    "conv",
    "conv_bn_relu",
    "conv_relu",
    "count_parameters",
    "gradient_sizes",
    "layer_parameters",
    "model",
    "output_shape",
    "sequence_shape",
    "shapes",
]

IMAGE_NAMES: tuple[str, ...] = tuple(ARCHITECTURES)  # the seed papers' models
TRANSFORMER_NAMES: tuple[str, ...] = tuple(TRANSFORMERS)
NAMES: tuple[str, ...] = IMAGE_NAMES + TRANSFORMER_NAMES
_ALL = {**ARCHITECTURES, **TRANSFORMERS}


def default_classes(name: str) -> int | None:
    """The model's own class count (a language model's: its vocabulary), None for an unknown
    name or a model that does not classify."""
    found = _ALL.get(name)
    return found[1] if found is not None and found[1] > 0 else None


def model(name: str, input_shape: Shape | None = None, classes: int | None = None) -> Model:
    """The model `name`, for `input_shape` ((C, H, W); a sequence model's (S,)) and `classes`
    (a language model's vocabulary; defaults: its own)."""
    try:
        default_input, default_n, layers = _ALL[name]
    except KeyError:
        raise HpcbenchError(f"unknown model {name!r} (known: {', '.join(NAMES)})") from None
    shape = tuple(input_shape or default_input)
    n_classes = default_n if classes is None or default_n == 0 else classes
    # The autoencoder's last layer rebuilds the input: its width is the input's size.
    arg = n_classes if default_n else size(shape)
    built = Model(name, shape, n_classes, layers(arg), OBJECTIVES.get(name, ""))
    shapes(built)  # refuse inputs the model cannot take, here rather than inside a framework
    return built
