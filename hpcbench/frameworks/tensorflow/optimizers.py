"""The point's Keras optimizer (the all-reduce backends'; the parameter servers apply
TensorFlow's raw kernels, ps.py)."""

from __future__ import annotations

from typing import Any

from hpcbench.spec import Point


def optimizer(point: Point, momentum: float) -> Any:
    """The point's optimizer; fp16: inside Keras' `LossScaleOptimizer` (dynamic loss
    scaling: the gradients are exchanged scaled, unscaled and checked by its step, which
    skips a step with a non-finite gradient on every rank alike)."""
    import keras

    if point.optimizer == "adam":
        made = keras.optimizers.Adam(point.lr)
    else:
        made = keras.optimizers.SGD(point.lr, momentum=momentum if point.optimizer == "momentum" else 0.0)
    if point.precision == "fp16":
        return keras.optimizers.LossScaleOptimizer(made)
    return made
