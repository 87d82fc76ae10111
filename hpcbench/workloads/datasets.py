"""Datasets as numpy arrays, sharded per rank: the same samples for every framework.

- `synthetic`: images of any shape (the model's input), drawn around one random prototype per
  class, so a model can learn them (a held-out split measures accuracy) while timing runs
  see data that costs nothing to produce.
- `mnist`: the four IDX files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
  `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each optionally `.gz`) in `data_dir`.
- `cifar10`: the binary version (`data_batch_1.bin` ... `data_batch_5.bin`, `test_batch.bin`)
  in `data_dir` or in its `cifar-10-batches-bin/` folder.
- `text`: byte-level tokens (a vocabulary of 256) of the `*.txt` files in `data_dir`, or,
  without `data_dir`, of the corpus every Python ships: the documentation topics of
  `pydoc_data` (about 466 KB of English prose and grammar). The last tenth is held out.

For a sequence model (`Model.tokens`) samples are token ids (n, S) as int64: a language
model's targets are the next tokens (n, S); a masked-LM's (BERT) the original tokens where
15 % of the inputs were replaced by the mask token (the vocabulary's last id), -1 elsewhere
(ignored by the loss). Synthetic tokens follow a fixed random successor for each token
three times in four, so a model can learn them.

Nothing is downloaded: the files must be on the cluster's file system already. Images come
out as float32 NCHW, normalised per channel; labels as int64. Rank r of n takes every n-th
sample of a permutation that is the same on every rank, so the shards are disjoint and
balanced. Real loaders read with numpy only; frameworks convert the arrays themselves.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcbench.errors import HpcbenchError

NAMES = ("synthetic", "mnist", "cifar10", "text")
# Image shape and classes of the real datasets (synthetic takes the model's).
SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {"mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}
# What the samples of a real dataset are: images or tokens (synthetic: what the model reads).
KINDS: dict[str, str] = {"mnist": "images", "cifar10": "images", "text": "tokens"}
BYTE_VOCAB = 256  # the text dataset's vocabulary: one token per byte
HELD_OUT = 0.1  # the text dataset's held-out share (its end)
MASKED = 0.15  # masked-LM: the share of input tokens replaced by the mask token
SUCCESSOR = 0.75  # synthetic tokens: how often a token is followed by its fixed successor
IGNORED = -1  # a target the loss ignores (masked-LM's unmasked positions)

SYNTHETIC_TRAIN_BATCHES = 8  # distinct synthetic training batches per rank, cycled
SYNTHETIC_TEST_BATCHES = 4  # held-out synthetic batches per rank
SYNTHETIC_SIGNAL = 0.5  # prototype scale against unit noise: learnable, not trivial

_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
_CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
_CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)
_CIFAR_RECORD = 1 + 3 * 32 * 32


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # (n, C, H, W) float32; token ids (n, S) int64
    y: np.ndarray  # (n,) int64; a sequence model's targets (n, S) int64

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Shard:
    """One rank's part of a dataset."""

    train: Split
    test: Split
    classes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])


class DataError(HpcbenchError):
    """A dataset file is missing or not in the format its loader reads."""


# --------------------------------------------------------------------------------------
# Readers of the real formats.


def _open(path: Path) -> bytes:
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.exists():
            raw = candidate.read_bytes()
            return gzip.decompress(raw) if candidate.suffix == ".gz" else raw
    raise DataError(f"{path} (or {path.name}.gz) not found")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format): magic 0x0000 TYPE NDIM, NDIM big-endian uint32 sizes, data."""
    raw = _open(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    types: dict[int, np.dtype[Any]] = {
        0x08: np.dtype(np.uint8),
        0x09: np.dtype(np.int8),
        0x0B: np.dtype(">i2"),
        0x0C: np.dtype(">i4"),
        0x0D: np.dtype(">f4"),
    }
    dtype = types.get(raw[2])
    if dtype is None:
        raise DataError(f"{path}: unknown IDX element type 0x{raw[2]:02x}")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: holds {data.size} elements, its header says {dims}")
    return np.asarray(data.reshape(dims))


def read_mnist(directory: Path) -> tuple[Split, Split]:
    def split(images: str, labels: str) -> Split:
        x = read_idx(directory / images)
        y = read_idx(directory / labels)
        if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
            raise DataError(f"{directory}: {images} {x.shape} and {labels} {y.shape} are not MNIST")
        x = (x.astype(np.float32) / 255.0 - _MNIST_MEAN) / _MNIST_STD
        return Split(x[:, None, :, :], y.astype(np.int64))

    return (
        split("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        split("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    )


def read_cifar10_batch(path: Path) -> Split:
    raw = _open(path)
    if len(raw) % _CIFAR_RECORD:
        raise DataError(f"{path}: {len(raw)} bytes is not a whole number of CIFAR-10 records ({_CIFAR_RECORD} bytes)")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    y = records[:, 0].astype(np.int64)
    if y.size and y.max() > 9:
        raise DataError(f"{path}: label {y.max()} out of range 0-9: not CIFAR-10")
    x = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0
    x = (x - _CIFAR_MEAN[:, None, None]) / _CIFAR_STD[:, None, None]
    return Split(x, y)


def read_cifar10(directory: Path) -> tuple[Split, Split]:
    if (directory / "cifar-10-batches-bin").is_dir():
        directory = directory / "cifar-10-batches-bin"
    train_files = sorted(directory.glob("data_batch_*.bin"))
    if not train_files:
        raise DataError(f"{directory}: no data_batch_*.bin files (CIFAR-10 binary version)")
    parts = [read_cifar10_batch(p) for p in train_files]
    train = Split(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))
    return train, read_cifar10_batch(directory / "test_batch.bin")


READERS: dict[str, Callable[[Path], tuple[Split, Split]]] = {"mnist": read_mnist, "cifar10": read_cifar10}


# --------------------------------------------------------------------------------------
# Shards.


def _take(split: Split, rank: int, size: int, seed: int) -> Split:
    order = np.random.default_rng(seed).permutation(len(split))[rank::size]
    order.sort()  # keeps reads of a memory-mapped or cached array sequential
    return Split(np.ascontiguousarray(split.x[order]), split.y[order])


def synthetic(shape: tuple[int, ...], classes: int, batch_size: int, rank: int, seed: int) -> tuple[Split, Split]:
    """This rank's synthetic train and test splits. Prototypes depend on the seed only, so
    every rank learns the same task; samples depend on the rank too."""
    n_classes = max(classes, 1)
    protos = np.random.default_rng(seed).standard_normal((n_classes, *shape), dtype=np.float32) * SYNTHETIC_SIGNAL
    rng = np.random.default_rng([seed, rank + 1])

    def split(n: int) -> Split:
        y = rng.integers(0, n_classes, n)
        x = protos[y] + rng.standard_normal((n, *shape), dtype=np.float32)
        return Split(x, y.astype(np.int64))

    return split(SYNTHETIC_TRAIN_BATCHES * batch_size), split(SYNTHETIC_TEST_BATCHES * batch_size)


def input_of(dataset: str, default_shape: tuple[int, ...], default_classes: int) -> tuple[tuple[int, ...], int]:
    """(input shape, classes) a model trains on with `dataset` (text: the model's sequence
    length, the byte vocabulary)."""
    if dataset == "text":
        return default_shape, BYTE_VOCAB
    return SHAPES.get(dataset, (default_shape, default_classes))


# --------------------------------------------------------------------------------------
# Tokens.


def read_text(directory: Path | None) -> bytes:
    """The bytes of the `*.txt` files in `directory` (sorted by name, one blank line between
    files), or of the documentation topics every Python ships (`pydoc_data`)."""
    if directory is None:
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics)).encode()
    files = sorted(directory.glob("*.txt"))
    if not files:
        raise DataError(f"{directory}: no *.txt files (the text dataset reads UTF-8 text files)")
    return b"\n\n".join(f.read_bytes() for f in files)


def _targets(windows: np.ndarray, task: str, vocab: int, rng: np.random.Generator) -> Split:
    """Inputs and targets of a language model (next tokens) or a masked-LM, from windows of
    S + 1 tokens."""
    if task == "lm":
        return Split(np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:]))
    tokens = windows[:, :-1]
    masked = rng.random(tokens.shape) < MASKED
    x = np.where(masked, vocab - 1, tokens)
    y = np.where(masked, tokens, IGNORED)
    return Split(x.astype(np.int64), y.astype(np.int64))


def token_windows(text: bytes, length: int) -> np.ndarray:
    """Non-overlapping windows of `length` byte tokens, as int64 (n, length)."""
    tokens = np.frombuffer(text, dtype=np.uint8)
    n = len(tokens) // length
    return tokens[: n * length].reshape(n, length).astype(np.int64)


def text_shards(
    directory: Path | None, seq_len: int, task: str, batch_size: int, rank: int, size: int, seed: int
) -> Shard:
    """Rank `rank` of `size`'s shard of the text dataset: windows of the first nine tenths
    to train, of the last tenth to test."""
    text = read_text(directory)
    cut = int(len(text) * (1 - HELD_OUT))
    rng = np.random.default_rng([seed, rank])
    splits = []
    for part in (text[:cut], text[cut:]):
        windows = token_windows(part, seq_len + 1)
        order = np.random.default_rng(seed).permutation(len(windows))[rank::size]
        order.sort()
        splits.append(_targets(windows[order], task, BYTE_VOCAB, rng))
    train, test = splits
    if len(train) < batch_size or len(test) < 1:
        raise DataError(
            f"text: rank {rank}'s shard has {len(train)} training and {len(test)} held-out sequences of "
            f"{seq_len} tokens, fewer than a batch of {batch_size} (or none held out): give more text or a "
            "shorter seq_len"
        )
    return Shard(train, test, BYTE_VOCAB)


def synthetic_tokens(seq_len: int, vocab: int, task: str, batch_size: int, rank: int, seed: int) -> tuple[Split, Split]:
    """This rank's synthetic token splits: each token is followed by its successor (a fixed
    random permutation, the same on every rank) three times in four, else by a random one."""
    usable = vocab - 1 if task == "mlm" else vocab  # the masked-LM's last id is the mask
    successor = np.random.default_rng(seed).permutation(usable)
    rng = np.random.default_rng([seed, rank + 1])

    def split(n: int) -> Split:
        windows = np.empty((n, seq_len + 1), dtype=np.int64)
        windows[:, 0] = rng.integers(0, usable, n)
        follow = rng.random((n, seq_len)) < SUCCESSOR
        noise = rng.integers(0, usable, (n, seq_len))
        for t in range(seq_len):
            windows[:, t + 1] = np.where(follow[:, t], successor[windows[:, t]], noise[:, t])
        return _targets(windows, task, vocab, rng)

    return split(SYNTHETIC_TRAIN_BATCHES * batch_size), split(SYNTHETIC_TEST_BATCHES * batch_size)


def load(
    dataset: str,
    data_dir: str | None,
    shape: tuple[int, ...],
    classes: int,
    batch_size: int,
    rank: int,
    size: int,
    seed: int,
    task: str = "classify",
) -> Shard:
    """Rank `rank` of `size`'s shard of `dataset` (synthetic: of `shape` and `classes`; a
    sequence model's (`task` "lm" or "mlm") shape is (S,) and its classes the vocabulary)."""
    tokens = task in ("lm", "mlm")
    if dataset == "synthetic":
        if tokens:
            train, test = synthetic_tokens(shape[0], classes, task, batch_size, rank, seed)
        else:
            train, test = synthetic(shape, classes, batch_size, rank, seed)
        return Shard(train, test, classes)
    if dataset == "text":
        return text_shards(Path(data_dir) if data_dir else None, shape[0], task, batch_size, rank, size, seed)
    if dataset not in READERS:
        raise DataError(f"unknown dataset {dataset!r} (known: {', '.join(NAMES)})")
    if not data_dir:
        raise DataError(f"dataset {dataset!r} needs data_dir: the folder holding its files")
    train, test = READERS[dataset](Path(data_dir))
    shard = Shard(_take(train, rank, size, seed), _take(test, rank, size, seed), SHAPES[dataset][1])
    if len(shard.train) < batch_size:
        raise DataError(
            f"{dataset}: rank {rank}'s shard has {len(shard.train)} samples, fewer than a batch of {batch_size}"
        )
    return shard


class Batches:
    """Batches of a split, a new permutation every epoch (same on every run of the point).

    `next()` returns views into preallocated arrays: fetching a batch is one fancy-index copy.
    Synthetic data cycles through its batches in order (nothing to shuffle).
    """

    def __init__(self, split: Split, batch_size: int, seed: int, rank: int, shuffle: bool = True) -> None:
        self.split = split
        self.batch_size = batch_size
        self.steps_per_epoch = len(split) // batch_size
        if self.steps_per_epoch < 1:
            raise DataError(f"{len(split)} samples is less than one batch of {batch_size}")
        self._seed = (seed, rank)
        self._shuffle = shuffle
        self._epoch = -1
        self._step = self.steps_per_epoch  # starts a new epoch on the first call
        self._order = np.arange(len(split))
        self._x = np.empty((batch_size, *split.x.shape[1:]), dtype=split.x.dtype)
        self._y = np.empty((batch_size, *split.y.shape[1:]), dtype=split.y.dtype)

    def next_index(self) -> slice | np.ndarray:
        """Which samples of the split make the next batch: a slice (in order) or indices."""
        if self._step >= self.steps_per_epoch:
            self._epoch += 1
            self._step = 0
            if self._shuffle:
                self._order = np.random.default_rng([*self._seed, self._epoch]).permutation(len(self.split))
        lo = self._step * self.batch_size
        self._step += 1
        if not self._shuffle:
            return slice(lo, lo + self.batch_size)
        return self._order[lo : lo + self.batch_size]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch: views of the split (in order, no copy) or a gather into reused buffers."""
        index = self.next_index()
        if isinstance(index, slice):
            return self.split.x[index], self.split.y[index]
        np.take(self.split.x, index, axis=0, out=self._x)
        np.take(self.split.y, index, axis=0, out=self._y)
        return self._x, self._y


def eval_batches(split: Split, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The held-out split in order, in batches (the last one may be smaller)."""
    return [(split.x[i : i + batch_size], split.y[i : i + batch_size]) for i in range(0, len(split), batch_size)]
