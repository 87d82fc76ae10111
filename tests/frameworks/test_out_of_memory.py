"""A layout that runs out of memory is a result, not a crash: real ranks capped by
`memory_limit_gb`, the frameworks' real out-of-memory errors, the point recorded `out of
memory` with the memory it reached, and left alone by resume. (What the executors record
from a rank's account: tests/unit/test_out_of_memory_records.py.)"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hpcbench.rank.memory import GB, is_out_of_memory
from hpcbench.spec import Point
from hpcbench.store import oom, schema
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, OUT_OF_MEMORY, Manifest
from tests.conftest import ROOT, env_python, run_module

LIMIT_GB = 1.0
# gpt_tiny on 2 ranks, one thread each: batch 4 peaks at about 0.35 GiB of resident memory a
# rank, batch 512 at 0.78 GiB, so batch 2048 needs about 2 GiB: its first forward pass runs
# out of a 1 GiB cap, and batch 4 fits in it with room to spare.
FITS, RUNS_OUT = 4, 2048
RSS_MARGIN_GB = 0.5  # resident code pages (libtorch) count in RSS, not in RLIMIT_DATA


def _raised(make: Callable[[], object]) -> BaseException:
    try:
        make()
    except BaseException as exc:  # the very exception the framework raises
        return exc
    raise AssertionError("expected an exception")


def test_the_frameworks_real_out_of_memory_errors_are_recognised() -> None:
    torch_cpu = _raised(lambda: torch.empty(2**50, dtype=torch.uint8))  # 1 PiB: the CPU allocator fails
    numpy_error = _raised(lambda: np.empty(2**50, dtype=np.uint8))
    assert "can't allocate memory" in str(torch_cpu)
    assert is_out_of_memory(torch_cpu)
    assert is_out_of_memory(numpy_error)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(OSError(errno.ENOMEM, "Cannot allocate memory"))
    wrapped = _raised(lambda: _reraise(RuntimeError("step failed"), torch_cpu))
    assert is_out_of_memory(wrapped)  # raised from one


def _reraise(outer: BaseException, cause: BaseException) -> None:
    raise outer from cause


def test_other_errors_are_failures() -> None:
    mismatch = _raised(lambda: torch.ones(3) @ torch.ones(4))
    assert not is_out_of_memory(mismatch)
    assert not is_out_of_memory(ValueError("batch_size must be positive"))
    assert not is_out_of_memory(KeyboardInterrupt())
    assert not is_out_of_memory(OSError(errno.ENOENT, "No such file or directory"))


@pytest.mark.slow
def test_tensorflow_and_jax_out_of_memory_errors_are_recognised() -> None:
    """TensorFlow's ResourceExhaustedError and XLA's RESOURCE_EXHAUSTED, raised for real by
    1 PiB tensors in the modern environment."""
    python = env_python("modern")  # its imports are the probe's own
    probe = (
        "import json, jax.numpy as jnp, tensorflow as tf\n"
        "from hpcbench.rank.memory import is_out_of_memory\n"
        "out = {}\n"
        "for name, make in (('jax', lambda: jnp.ones(2**50, dtype=jnp.uint8).sum()),\n"
        "                   ('tensorflow', lambda: tf.zeros([2**50], dtype=tf.uint8))):\n"
        "    try:\n"
        "        make()\n"
        "        out[name] = 'no error'\n"
        "    except Exception as exc:\n"
        "        out[name] = [type(exc).__name__, is_out_of_memory(exc)]\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([str(python), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"jax": ["JaxRuntimeError", True], "tensorflow": ["ResourceExhaustedError", True]}


@pytest.mark.mpi
def test_a_layout_that_runs_out_of_memory_is_a_result(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """Two real ranks of PyTorch over gloo under mpirun, capped at 1 GiB each: batch 4 is done,
    batch 2048 is out of memory (its peer, blocked in the gradients' all-reduce, ends with the
    job), the sweep exits 0, and resume leaves the point as it is."""
    spec = {
        "name": "oom",
        "executor": "local",
        "matrix": {"batch_size": [FITS, RUNS_OUT]},
        "fixed": {
            "ranks_per_node": 2, "model": "gpt_tiny", "dataset": "text", "iterations": 2, "warmup": 0,
            "threads": 1, "memory_limit_gb": LIMIT_GB,
        },
    }  # fmt: skip
    out = tmp_path / "sweep"
    spec_path = write_spec(yaml.safe_dump(spec))
    run = run_module("hpcbench.sweep", str(spec_path), "--out", str(out), timeout=300)  # a hung peer fails here
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((out / "logs").glob("*.log")))
    assert run.returncode == 0, run.stdout + run.stderr + logs
    assert f"1 of 2 points done, 1 out of memory; results in {out}" in run.stdout
    entries = {e.point["batch_size"]: e for e in Manifest.load(out).entries.values()}
    assert entries[FITS].state == DONE
    ran_out = entries[RUNS_OUT]
    assert ran_out.state == OUT_OF_MEMORY, ran_out.reason
    assert "ran out of memory in step at iteration 0" in ran_out.reason
    assert read_point(out / entries[FITS].result).complete
    result = out / ran_out.result
    data = read_point(result)
    assert data.status == schema.STATUS_OOM
    facts = oom.out_of_memory(result)
    assert facts is not None
    assert (facts.phase, facts.iteration, facts.limit_bytes) == ("step", 0, int(LIMIT_GB * GB))
    assert facts.rank in (0, 1)
    assert "can't allocate memory" in facts.error
    assert 0 < facts.peak_rss_bytes <= (LIMIT_GB + RSS_MARGIN_GB) * GB
    assert data.provenance["memory_limit"] == f"{int(LIMIT_GB * GB)} bytes (RLIMIT_DATA)"

    before = result.stat().st_mtime_ns
    resume = run_module("hpcbench.sweep", "resume", str(out), timeout=120)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "nothing to resume" in resume.stdout
    assert result.stat().st_mtime_ns == before
    assert Manifest.load(out).entries[ran_out.id].attempts == 1
    status = run_module("hpcbench.sweep", "status", str(out), timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "(1 done, 1 out of memory)" in status.stdout
    analyzed = run_module("hpcbench.analyze", str(out), timeout=120)  # listed with what it reached, not dropped
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    said = f"point {ran_out.id}: {Point.from_dict(ran_out.point).label()}: out of memory: rank {facts.rank} in step"
    assert said in analyzed.stdout + analyzed.stderr, analyzed.stdout + analyzed.stderr
