"""PyTorch model definitions (imported only when a torch point runs)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

# model name -> (input shape without batch, number of classes)
INPUTS: dict[str, tuple[tuple[int, ...], int]] = {
    "lenet": ((1, 28, 28), 10),
    "mlp": ((1, 28, 28), 10),
}


def lenet(classes: int = 10) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998) for 28x28 inputs: 61,706 parameters with 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, 6, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, classes),
    )


def mlp(classes: int = 10) -> nn.Module:
    """Two hidden layers of 512 (the multilayer perceptron of seed 001): 669,706 parameters."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, classes),
    )


BUILDERS: dict[str, Callable[[int], nn.Module]] = {"lenet": lenet, "mlp": mlp}
