"""TensorFlow's losses per task, in graph code: a classifier's, an autoencoder's, a sequence
model's mean token cross-entropy (a masked-LM's over its masked tokens), and a test batch's
sum and correct count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcbench.workloads import datasets as data
from hpcbench.workloads import zoo

TOKEN_TASKS = ("lm", "mlm")


def _token_losses(y: Any, out: Any) -> tuple[Any, Any]:
    """Per-token cross-entropy of the logits `out` (B, S, vocab), in float32, and which
    tokens count (B, S; 1.0 or 0.0): all but the targets the loss ignores (`data.IGNORED`,
    a masked-LM's unmasked positions)."""
    import tensorflow as tf

    counted = tf.not_equal(y, data.IGNORED)
    targets = tf.where(counted, y, tf.zeros_like(y))
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, tf.cast(out, tf.float32))
    weights = tf.cast(counted, tf.float32)
    return losses * weights, weights


def evaluation(tree: zoo.Model, loss_fn: Callable[[Any, Any, Any], Any], x: Any, y: Any, out: Any) -> tuple[Any, Any]:
    """Graph code of a test batch: (the loss summed over its samples, a sample's loss being
    its mean token loss in a sequence model; its correctly classified samples, 0 for a model
    that is not a classifier)."""
    import tensorflow as tf

    if tree.task in TOKEN_TASKS:
        losses, counted = _token_losses(y, out)
        per_sample = tf.reduce_sum(losses, axis=1) / tf.maximum(tf.reduce_sum(counted, axis=1), 1.0)
        return tf.reduce_sum(per_sample), tf.constant(0, tf.int64)
    total = loss_fn(x, y, out) * tf.cast(tf.shape(y)[0], tf.float32)
    if tree.task != "classify":
        return total, tf.constant(0, tf.int64)
    return total, tf.reduce_sum(tf.cast(tf.equal(tf.argmax(out, axis=1), y), tf.int64))


def loss_function(tree: zoo.Model) -> Callable[[Any, Any, Any], Any]:
    """loss(x, y, output), in float32 whatever the policy computes in: a language model's
    mean token cross-entropy over every position ("lm") or over the masked ones only
    ("mlm"); cross-entropy of the logits for a classifier, else the squared error of the
    reconstruction of x."""
    import keras
    import tensorflow as tf

    if tree.task in TOKEN_TASKS:

        def loss_fn(x: Any, y: Any, out: Any) -> Any:
            losses, counted = _token_losses(y, out)
            return tf.reduce_sum(losses) / tf.maximum(tf.reduce_sum(counted), 1.0)
    elif tree.task == "classify":
        loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def loss_fn(x: Any, y: Any, out: Any) -> Any:
            return _unscaled(loss_obj(y, tf.cast(out, tf.float32)))
    else:
        mse = keras.losses.MeanSquaredError()

        def loss_fn(x: Any, y: Any, out: Any) -> Any:
            return _unscaled(mse(tf.reshape(x, (tf.shape(x)[0], -1)), tf.cast(out, tf.float32)))

    return loss_fn


def _unscaled(value: Any) -> Any:
    """A Keras loss's value as the plain mean over its batch: inside a replica of a
    `tf.distribute` strategy (several devices in a rank, replicas.py) Keras divides it by the
    replicas in sync, which is undone here (the replicas scale their shares themselves)."""
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return value * float(replicas) if replicas > 1 else value
