"""Accuracy, test time, training time and time-to-accuracy from the `eval` table.

An evaluation is the rows of all ranks with the same `epoch` (each rank tests its shard
of the held-out data): its accuracy is sum(correct) / sum(total), its test time the
slowest rank's, its training time the slowest rank's training time so far.

- `accuracy`, `test_time_s`, `train_time_s`: of the last evaluation. Without evaluations,
  `train_time_s` is the wall time of all iterations (first start to last end over ranks,
  warm-up included) and the others are NaN.
- `best_accuracy`, `time_to_best_s`: the highest accuracy and the training time at which it
  was first reached (seed 002 reports "peak accuracy first reached at epoch E, time T").
- `time_to_target_s`: training time of the first evaluation reaching the target accuracy
  (a fraction, e.g. 0.98); NaN without a target or when it was never reached.

What an accuracy means: on `dataset: synthetic` (random images around one prototype per class)
it says whether the model learnt those prototypes, not how it does on a real task, and after a
short timing run it is mostly chance (1 / classes: LeNet's 10 %). `reading` writes it as a
table shows it: on synthetic data it is labelled so, and called chance when it is not clearly
above chance (CHANCE_SIGMAS binomial standard deviations of the samples tested).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hpcbench.spec import Point
from hpcbench.workloads.datasets import SHAPES
from hpcbench.workloads.zoo import default_classes

SYNTHETIC = "synthetic"
CHANCE_SIGMAS = 3.0  # above chance: more than this many binomial standard deviations above 1 / classes

ACCURACY_COLUMNS = [
    "evaluations", "epochs", "accuracy", "best_accuracy", "train_time_s", "test_time_s",
    "time_to_best_s", "time_to_target_s",
]  # fmt: skip

EVALUATION_COLUMNS = ["epoch", "iteration", "train_time_s", "test_time_s", "correct", "total", "accuracy", "loss"]


def evaluations(eval_rows: np.ndarray) -> pd.DataFrame:
    """One row per evaluation (epoch), in order."""
    if len(eval_rows) == 0:
        return pd.DataFrame(columns=EVALUATION_COLUMNS)
    return pd.DataFrame(evaluation_columns(eval_rows))


def evaluation_columns(eval_rows: np.ndarray) -> dict[str, np.ndarray]:
    """`evaluations` as its columns (a DataFrame per point costs more than the reduction;
    {} without evaluations)."""
    if len(eval_rows) == 0:
        return {}
    epochs, inverse = np.unique(eval_rows["epoch"], return_inverse=True)
    k = len(epochs)

    def reduce(ufunc: np.ufunc, values: np.ndarray, start: float) -> np.ndarray:
        out = np.full(k, start)
        ufunc.at(out, inverse, values)
        return out

    correct = np.bincount(inverse, weights=eval_rows["correct"].astype(float), minlength=k)
    total = np.bincount(inverse, weights=eval_rows["total"].astype(float), minlength=k)
    loss = np.bincount(inverse, weights=eval_rows["loss"].astype(float) * eval_rows["total"], minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(total > 0, correct / total, np.nan)
        mean_loss = np.where(total > 0, loss / total, np.nan)
    return {
        "epoch": epochs,
        "iteration": reduce(np.maximum, eval_rows["iteration"].astype(float), -np.inf).astype(np.int64),
        "train_time_s": reduce(np.maximum, eval_rows["train_time_s"], -np.inf),
        "test_time_s": reduce(np.maximum, eval_rows["test_time_s"], -np.inf),
        "correct": correct.astype(np.int64),
        "total": total.astype(np.int64),
        "accuracy": accuracy,
        "loss": mean_loss,
    }


def accuracy_row(
    eval_rows: np.ndarray,
    iterations: np.ndarray,
    target: float | None = None,
    evals: dict[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Per-point accuracy and time columns; `evals`: `evaluation_columns(eval_rows)`, where already made."""
    row: dict[str, float] = dict.fromkeys(ACCURACY_COLUMNS, float("nan"))
    evals = evaluation_columns(eval_rows) if evals is None else evals
    count = len(evals["epoch"]) if evals else 0
    row["evaluations"] = float(count)
    if not count:
        if iterations.size:
            row["train_time_s"] = float(iterations["t_end"].max() - iterations["t_start"].min())
        return row
    train = evals["train_time_s"].astype(float)
    row["epochs"] = float(evals["epoch"][-1])
    row["accuracy"] = float(evals["accuracy"][-1])
    row["train_time_s"] = float(train[-1])
    row["test_time_s"] = float(evals["test_time_s"][-1])
    acc = evals["accuracy"].astype(float)
    if np.isfinite(acc).any():
        best = int(np.nanargmax(acc))  # first index of the maximum
        row["best_accuracy"] = float(acc[best])
        row["time_to_best_s"] = float(train[best])
        if target is not None:
            reached = np.flatnonzero(acc >= target)
            if reached.size:
                row["time_to_target_s"] = float(train[int(reached[0])])
    return row


def classes(point: Point) -> int | None:
    """The classes the point's model tells apart: the dataset's (a real one), else the model's
    own (synthetic data takes the model's); None for a model that does not classify."""
    if point.dataset in SHAPES:
        return SHAPES[point.dataset][1]
    return default_classes(point.model)


def chance(point: Point) -> float | None:
    """The accuracy of guessing: 1 / classes (None without classes)."""
    n = classes(point)
    return 1.0 / n if n else None


def at_chance(value: float, point: Point, tested: float) -> bool:
    """Whether an accuracy measured on `tested` samples is not clearly above chance."""
    p = chance(point)
    if p is None or not math.isfinite(value):
        return False
    spread = math.sqrt(p * (1 - p) / tested) if tested > 0 else 1.0
    return value <= p + CHANCE_SIGMAS * spread


def reading(value: float, point: Point, tested: float = 0.0) -> str:
    """An accuracy (a fraction) as the report's tables show it, in percent: plain on a real
    dataset; on synthetic data labelled so, and as chance where it is not clearly above it
    ("chance (8.59; synthetic data)"), with chance beside it otherwise. '' for NaN."""
    if not math.isfinite(value):
        return ""
    text = f"{value * 100:.2f}"
    if point.dataset != SYNTHETIC:
        return text
    p = chance(point)
    if p is None:
        return f"{text} (synthetic data)"
    if at_chance(value, point, tested):
        return f"chance ({text}; synthetic data)"
    return f"{text} (synthetic data; chance {p * 100:.2f})"
