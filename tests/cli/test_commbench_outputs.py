"""`hpcbench commbench`'s output and its bad input (docs/running.md#outputs-and-exit-codes):
`-o FILE` follows the output policy (hpcbench/sweepdir/outputs.py), a size whose buffers do
not fit in the host's memory is refused, and every refusal is one line on stderr, exit 2,
before any rank measures or allocates, with every file left as it was (checksums).

The command runs as one process (MPI alone, as `python -m hpcbench.commbench` does without a
launcher; a refusal before MPI starts where it can), and once under `mpirun -n 2` to show
that a refusal ends every rank with exit 2, none left waiting."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcbench.cli.commbench import memory_refusal, parse_sizes, size_text, write_results
from hpcbench.rank.commbench import BUFFERS
from hpcbench.rank.commbench.memory import available_memory
from hpcbench.spec import Point
from hpcbench.store.commfile import KIND, RESULT_DTYPE, VERSION, read_results
from hpcbench.testing.arrays import iterations
from hpcbench.testing.fabricate import write_point_file
from hpcbench.testing.mpi import MPI_ENV, mpirun_argv
from tests.cli.test_outputs import digest
from tests.conftest import ROOT

PROG = "hpcbench.commbench: error: "
QUICK = ("--sizes", "1K", "--iters", "2", "--warmup", "0")
# Ranks, one or more, meet through MPI (mpi4py, an optional extra); bad values are refused before.
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")


def commbench(*args: str | Path, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m hpcbench.commbench ARGS` as one process (umask 022, as most users have it)."""
    return subprocess.run(
        [sys.executable, "-m", "hpcbench.commbench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **MPI_ENV},
        umask=0o022,
    )


def refused(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback, no table; the line."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "all-reduce" not in res.stdout and "wrote" not in res.stdout
    return lines[0]


@needs_mpi
def test_a_new_file_is_written_whole_with_mode_0644(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "intra1.h5"  # missing folders are made
    res = commbench(*QUICK, "-o", target)
    assert res.returncode == 0, res.stderr
    assert f"wrote {target}" in res.stdout
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644  # as every other output, not mkstemp's 0600
    assert os.listdir(target.parent) == ["intra1.h5"]  # no temporary file left
    assert read_results(target)["bytes"].tolist() == [1024]


@needs_mpi
def test_an_existing_file_is_refused_without_force_and_replaced_with_it(tmp_path: Path) -> None:
    target = tmp_path / "intra1.h5"
    assert commbench(*QUICK, "-o", target).returncode == 0
    before = digest(tmp_path)
    res = commbench(*QUICK, "--iters", "3", "-o", target)
    refused(res, f"-o/--output: {target}: exists already; --force replaces it")
    assert digest(tmp_path) == before
    res = commbench(*QUICK, "--iters", "3", "-o", target, "--force")
    assert res.returncode == 0, res.stderr
    with h5py.File(target, "r") as f:
        assert f.attrs["kind"] == KIND and f.attrs["iterations"] == 3
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["intra1.h5"]


@needs_mpi
def test_a_second_file_beside_the_first(tmp_path: Path) -> None:
    """intra4.h5, inter2.h5, ... in one folder (docs/predict.md): commbench files make no sweep."""
    for name in ("intra1.h5", "inter1.h5"):
        res = commbench(*QUICK, "-o", tmp_path / name)
        assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path)) == ["inter1.h5", "intra1.h5"]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A fabricated sweep directory: a point file, its manifest, spec and logs."""
    directory = tmp_path / "sweep"
    directory.mkdir()
    point = Point(framework="torch", backend="gloo", model="lenet", ranks_per_node=1, batch_size=8)
    write_point_file(directory / f"{point.id}.h5", point, iterations(1, 6, warmup=1, forward=0.01, batch=8))
    (directory / "manifest.json").write_text('{"version": 1, "name": "t", "executor": "local", "entries": []}\n')
    (directory / "spec.yaml").write_text("name: t\n")
    (directory / "logs").mkdir()
    (directory / "logs" / f"{point.id}.log").write_text("log\n")
    return directory


@needs_mpi
def test_a_sweeps_own_names_are_refused_even_with_force(sweep: Path) -> None:
    before = digest(sweep)
    point_file = next(sweep.glob("*.h5"))
    cases = [
        (point_file, "has a point file's name (*.h5) in the sweep directory"),
        (sweep / "commbench.h5", "has a point file's name (*.h5) in the sweep directory"),
        (sweep / "manifest.json", "own manifest.json"),
        (sweep / "logs" / "commbench.h5", "own folder logs/"),
    ]
    for target, why in cases:
        refused(commbench(*QUICK, "-o", target, "--force"), f"-o/--output: {target}: ", why)
    assert digest(sweep) == before


@needs_mpi
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept\n")
    link = tmp_path / "link.h5"
    link.symlink_to(folder / "kept.txt")
    before = digest(tmp_path)
    refused(commbench(*QUICK, "-o", "/dev/full"), "-o/--output: /dev/full: is a character device")
    refused(commbench(*QUICK, "-o", "/dev/full", "--force"), "is a character device")
    refused(commbench(*QUICK, "-o", folder, "--force"), f"-o/--output: {folder}: is a directory")
    refused(commbench(*QUICK, "-o", link, "--force"), "is a symbolic link")
    assert digest(tmp_path) == before
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@needs_mpi
def test_a_size_beyond_the_hosts_memory_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    target = tmp_path / "new" / "big.h5"
    line = refused(commbench("--sizes", "4K,1000G", "-o", target), "--sizes: 1000G needs ", " available there")
    assert f"{BUFFERS} buffers of it" in line
    assert not (tmp_path / "new").exists()  # the claimed output and its folders are gone again
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--sizes", "0"), "--sizes: 0 is not a positive multiple of 4 bytes"),
        (("--sizes=-4K",), "--sizes: '-4K' is not a size"),
        (("--sizes", "4K,,1M"), "--sizes: '' is not a size"),
        (("--sizes", "lots"), "--sizes: 'lots' is not a size"),
        (("--iters", "0"), "--iters: 0 is less than 1"),
        (("--iters", "ten"), "--iters: 'ten' is not a whole number"),
        (("--warmup", "-1"), "--warmup: -1 is less than 0"),
        (("--average", "median"), "--average: invalid choice: 'median'"),
        (("--device", "tpu"), "--device: invalid choice: 'tpu'"),
        (("--no-such-option",), "unrecognized arguments: --no-such-option"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    res = commbench(*args, "-o", tmp_path / "x.h5", cwd=tmp_path)
    refused(res, needle)
    assert os.listdir(tmp_path) == []


def test_device_cuda_without_a_gpu_is_bad_input(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: tests/gpu runs --device cuda for real")
    refused(commbench("--device", "cuda", "--sizes", "4K", "-o", tmp_path / "x.h5"), "--device cuda: no CUDA device")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------
# The pieces, without ranks


def test_sizes_and_their_names() -> None:
    assert parse_sizes("4K, 1M,100") == [4096, 1 << 20, 100]
    assert [size_text(n) for n in (4096, 1 << 20, 1000 << 30, 100, 4100)] == ["4K", "1M", "1000G", "100", "4100"]


def test_memory_refusal_counts_every_rank_that_shares_a_host() -> None:
    gib = 1 << 30
    one_host = [("a", "memory", 10 * gib)] * 4
    assert memory_refusal([gib], one_host) is None  # 4 ranks x 2 buffers x 1 GiB = 8 GiB of 10
    line = memory_refusal([4096, 2 * gib], one_host, {2 * gib: "2048M"})
    assert line == ("--sizes: 2048M needs 16.0 GiB of memory on host a (2 buffers of it on each of its 4 ranks), "
                    "more than the 10.0 GiB available there; sizes up to 1.2 GiB fit")  # fmt: skip
    two_hosts = [("a", "memory", 10 * gib), ("b", "memory", 10 * gib)] * 2
    assert memory_refusal([2 * gib], two_hosts) is None  # 2 ranks a host
    gpus = [("a", "GPU cuda:0 memory", 5 * gib), ("a", "GPU cuda:1 memory", 3 * gib)]
    assert memory_refusal([gib], gpus) is None
    line = memory_refusal([2 * gib], gpus)
    assert line is not None and "4.0 GiB of GPU cuda:1 memory on host a" in line and "its rank" in line
    assert memory_refusal([1000 * gib], [("a", "memory", None)]) is None  # nothing says: no refusal


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    limit = tmp_path / "memory.max"
    assert available_memory(meminfo, (limit,)) == 20000000 * 1024  # no cgroup file
    limit.write_text("max\n")
    assert available_memory(meminfo, (limit,)) == 20000000 * 1024
    limit.write_text(f"{8 << 30}\n")
    assert available_memory(meminfo, (limit,)) == 8 << 30
    assert available_memory(tmp_path / "none", ()) is not None  # sysconf's free pages
    assert (available_memory() or 0) > 0


# ------------------------------------------------------------------------------------------
# Two real ranks


@pytest.mark.mpi
def test_a_refusal_ends_every_rank_with_exit_2(tmp_path: Path) -> None:
    """Rank 0 decides, every rank learns it: each exits 2 (recorded by a shell around it, as
    mpirun ends the job at the first non-zero exit), one line said by rank 0, no rank hangs."""
    target = tmp_path / "intra2.h5"
    write_results(target, np.zeros(1, dtype=RESULT_DTYPE), {"kind": KIND, "version": VERSION})
    before = digest(target)
    status = tmp_path / "status"
    status.mkdir()
    command = (f'"{sys.executable}" -m hpcbench.commbench --sizes 1K --iters 2 -o "{target}"; '
               f'echo $? > "{status}/rank$OMPI_COMM_WORLD_RANK"')  # fmt: skip
    res = subprocess.run(
        mpirun_argv(2, "sh", "-c", command),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **MPI_ENV},
    )
    assert res.returncode == 0, res.stdout + res.stderr  # every shell ended
    assert {p.name: p.read_text().strip() for p in status.iterdir()} == {"rank0": "2", "rank1": "2"}
    lines = [line for line in res.stderr.splitlines() if line.startswith(PROG)]
    assert lines == [f"{PROG}-o/--output: {target}: exists already; --force replaces it, or choose another name"]
    assert digest(target) == before and sorted(os.listdir(tmp_path)) == ["intra2.h5", "status"]
