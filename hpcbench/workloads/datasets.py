"""Datasets as numpy arrays, sharded per rank: the same samples for every framework.

- `synthetic`: images of any shape (the model's input), drawn around one random prototype per
  class, so a model can learn them (a held-out split measures accuracy) while timing runs
  see data that costs nothing to produce.
- `mnist`: the four IDX files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
  `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each optionally `.gz`) in `data_dir`.
- `cifar10`: the binary version (`data_batch_1.bin` ... `data_batch_5.bin`, `test_batch.bin`)
  in `data_dir` or in its `cifar-10-batches-bin/` folder.

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

NAMES = ("synthetic", "mnist", "cifar10")
# Image shape and classes of the real datasets (synthetic takes the model's).
SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {"mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}

SYNTHETIC_TRAIN_BATCHES = 8  # distinct synthetic training batches per rank, cycled
SYNTHETIC_TEST_BATCHES = 4  # held-out synthetic batches per rank
SYNTHETIC_SIGNAL = 0.5  # prototype scale against unit noise: learnable, not trivial

_MNIST_MEAN, _MNIST_STD = 0.1307, 0.3081
_CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
_CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)
_CIFAR_RECORD = 1 + 3 * 32 * 32


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # (n, C, H, W) float32
    y: np.ndarray  # (n,) int64

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
    """(image shape, classes) a model trains on with `dataset`."""
    return SHAPES.get(dataset, (default_shape, default_classes))


def load(
    dataset: str,
    data_dir: str | None,
    shape: tuple[int, ...],
    classes: int,
    batch_size: int,
    rank: int,
    size: int,
    seed: int,
) -> Shard:
    """Rank `rank` of `size`'s shard of `dataset` (synthetic: of `shape` and `classes`)."""
    if dataset == "synthetic":
        train, test = synthetic(shape, classes, batch_size, rank, seed)
        return Shard(train, test, classes)
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
        self._y = np.empty(batch_size, dtype=split.y.dtype)

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
