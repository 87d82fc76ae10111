"""The framework-neutral model trees: shapes, parameter counts, and the PyTorch builder."""

from __future__ import annotations

import pytest
import torch

from hpcbench.errors import HpcbenchError
from hpcbench.frameworks.torch import layers as torch_layers
from hpcbench.workloads import zoo as models

# Published parameter counts of the reference implementations these trees follow
# (torchvision's alexnet, resnet50, inception_v3 without its auxiliary head; Caffe's
# cifar10_quick; LeNet-5 for 28x28 inputs).
REFERENCE = {
    "lenet": 61_706,
    "cifar10_quick": 145_578,
    "alexnet": 61_100_840,
    "resnet50": 25_557_032,
    "inception_v3": 23_834_568,
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_parameter_counts_match_the_reference_networks(name: str) -> None:
    assert models.count_parameters(models.model(name)) == REFERENCE[name]


@pytest.mark.parametrize("name", models.IMAGE_NAMES)
def test_torch_builds_exactly_the_described_network(name: str) -> None:
    spec = models.model(name)
    module = torch_layers.build(spec)
    assert sum(p.numel() for p in module.parameters()) == models.count_parameters(spec)
    module.eval()
    with torch.no_grad():
        out = module(torch.zeros(1, *spec.input))
    assert tuple(out.shape[1:]) == models.shapes(spec)
    expected = (spec.classes,) if spec.classes else (int(torch.tensor(spec.input).prod()),)
    assert tuple(out.shape[1:]) == expected


def test_gradient_sizes_add_up_and_follow_forward_order() -> None:
    spec = models.model("lenet")
    assert models.gradient_sizes(spec) == [6 * 25 + 6, 16 * 6 * 25 + 16, 400 * 120 + 120, 120 * 84 + 84, 84 * 10 + 10]
    for name in models.NAMES:
        m = models.model(name)
        assert sum(models.gradient_sizes(m)) == models.count_parameters(m)


def test_models_take_the_shape_of_real_data() -> None:
    lenet = models.model("lenet", (3, 32, 32), 10)
    assert lenet.input == (3, 32, 32)
    assert models.count_parameters(lenet) == 3 * 6 * 25 + 6 + 2416 + 16 * 6 * 6 * 120 + 120 + 10164 + 850
    auto = models.model("autoencoder", (3, 32, 32))
    assert models.shapes(auto) == (3072,) and auto.task == "reconstruct"


def test_inputs_too_small_for_a_model_are_refused_with_its_name() -> None:
    with pytest.raises(HpcbenchError, match=r"model alexnet on input \(1, 28, 28\).*too small"):
        models.model("alexnet", (1, 28, 28))
    with pytest.raises(HpcbenchError, match="unknown model 'vgg'"):
        models.model("vgg")
