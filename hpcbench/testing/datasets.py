"""Small dataset files in the real formats (MNIST's IDX, CIFAR-10's binary batches), written
by tests and benchmarks, since the real datasets cannot be downloaded everywhere."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """An IDX file as MNIST ships it: magic (0, 0, type 0x08, ndim), big-endian sizes, bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)


def make_mnist(directory: Path, n_train: int = 60, n_test: int = 20, compress: bool = False) -> None:
    """train- and t10k- images and labels (random pixels, labels cycling 0..9) as MNIST names them."""
    rng = np.random.default_rng(1)
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), compress)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, compress)


def make_cifar10(directory: Path, per_batch: int = 10, batches: int = 5) -> None:
    """The binary version: records of one label byte and 3072 pixel bytes (R, G, B planes)."""
    rng = np.random.default_rng(2)
    folder = directory / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}.bin" for i in range(1, batches + 1)] + ["test_batch.bin"]
    for k, name in enumerate(names):
        labels = (np.arange(per_batch) + k) % 10
        pixels = rng.integers(0, 256, (per_batch, 3072))
        records = np.concatenate([labels[:, None], pixels], axis=1).astype(np.uint8)
        (folder / name).write_bytes(records.tobytes())
