"""The dataset readers on small files written here in the real formats, and the sharding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpcbench.testing.datasets import make_cifar10, make_mnist, write_idx
from hpcbench.workloads import datasets as data
from hpcbench.workloads.datasets import DataError


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_are_read_and_normalised(tmp_path: Path, compress: bool) -> None:
    make_mnist(tmp_path, compress=compress)
    train, test = data.read_mnist(tmp_path)
    assert train.x.shape == (60, 1, 28, 28) and train.x.dtype == np.float32
    assert test.x.shape == (20, 1, 28, 28)
    assert train.y.tolist() == [i % 10 for i in range(60)]
    raw = data.read_idx(tmp_path / "train-images-idx3-ubyte")
    expected = (raw[0].astype(np.float32) / 255 - 0.1307) / 0.3081
    np.testing.assert_allclose(train.x[0, 0], expected, rtol=1e-6)


def test_cifar10_binary_batches_are_read(tmp_path: Path) -> None:
    make_cifar10(tmp_path)
    train, test = data.read_cifar10(tmp_path)
    assert train.x.shape == (50, 3, 32, 32) and test.x.shape == (10, 3, 32, 32)
    assert train.y[:10].tolist() == list(range(10))  # first batch, in file order
    raw = (tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes()
    red0 = np.frombuffer(raw[1:1025], dtype=np.uint8).reshape(32, 32)
    np.testing.assert_allclose(train.x[0, 0], (red0 / 255.0 - 0.4914) / 0.2470, rtol=1e-5)


def test_bad_files_give_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x01\x02\x08\x03")
    with pytest.raises(DataError, match="bad magic"):
        data.read_idx(tmp_path / "train-images-idx3-ubyte")
    with pytest.raises(DataError, match="not found"):
        data.read_idx(tmp_path / "nothing")
    write_idx(tmp_path / "short", np.zeros((2, 3)))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(DataError, match="header says"):
        data.read_idx(tmp_path / "short")
    (tmp_path / "data_batch_1.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="whole number of CIFAR-10 records"):
        data.read_cifar10(tmp_path)
    with pytest.raises(DataError, match="needs data_dir"):
        data.load("mnist", None, (1, 28, 28), 10, 8, 0, 1, 0)


def test_shards_are_disjoint_balanced_and_cover_the_data(tmp_path: Path) -> None:
    make_mnist(tmp_path, n_train=60, n_test=20)
    shards = [data.load("mnist", str(tmp_path), (1, 28, 28), 10, 4, r, 3, seed=5) for r in range(3)]
    assert [len(s.train) for s in shards] == [20, 20, 20]
    full, _ = data.read_mnist(tmp_path)
    seen = np.concatenate([s.train.x.reshape(len(s.train), -1) for s in shards])
    # every training image exactly once across the ranks
    assert len({row.tobytes() for row in seen}) == 60 == len({row.tobytes() for row in full.x.reshape(60, -1)})


def test_batches_reshuffle_every_epoch_and_cover_the_shard() -> None:
    split = data.Split(np.arange(12, dtype=np.float32)[:, None], np.arange(12))
    batches = data.Batches(split, 4, seed=0, rank=0)
    assert batches.steps_per_epoch == 3
    epoch1 = np.concatenate([batches.next()[1].copy() for _ in range(3)])
    epoch2 = np.concatenate([batches.next()[1].copy() for _ in range(3)])
    assert sorted(epoch1.tolist()) == sorted(epoch2.tolist()) == list(range(12))
    assert epoch1.tolist() != epoch2.tolist()
    ordered = data.Batches(split, 5, seed=0, rank=0, shuffle=False)
    assert ordered.steps_per_epoch == 2  # the partial batch is dropped
    assert [ordered.next()[1].tolist() for _ in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]


def test_synthetic_data_is_learnable_and_the_same_task_on_every_rank() -> None:
    train0, test0 = data.synthetic((1, 8, 8), 4, 16, rank=0, seed=3)
    train1, _ = data.synthetic((1, 8, 8), 4, 16, rank=1, seed=3)
    assert train0.x.shape == (128, 1, 8, 8) and test0.x.shape == (64, 1, 8, 8)
    assert not np.array_equal(train0.x, train1.x), "ranks draw different samples"
    # the class means of two ranks' samples agree: one task (nearest class mean classifies)
    means0 = np.stack([train0.x[train0.y == c].mean(axis=0) for c in range(4)]).reshape(4, -1)
    means1 = np.stack([train1.x[train1.y == c].mean(axis=0) for c in range(4)]).reshape(4, -1)
    dist = ((test0.x.reshape(64, 1, -1) - means1[None]) ** 2).sum(axis=2)
    assert (dist.argmin(axis=1) == test0.y).mean() > 0.9
    assert np.corrcoef(means0.ravel(), means1.ravel())[0, 1] > 0.8
