"""Out of memory on a real GPU: `memory_limit_gb` as PyTorch's per-process share of the
device, its `torch.OutOfMemoryError`, and a point past it recorded out of memory with the
device memory it reached, through the real sweep command (torchrun, NCCL).

They need a CUDA device and skip without one (this project's CI machines have none). On a
GPU host: `python -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from hpcbench.rank.memory import GB
from hpcbench.store import oom, schema
from hpcbench.store.reader import read_point
from hpcbench.sweepdir.manifest import DONE, OUT_OF_MEMORY, Manifest
from tests.conftest import ROOT, run_module

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU host)"),
]

LIMIT_GB = 1.0

_CAPPED = """
import torch
from hpcbench.rank.memory import GB, apply_limit, is_out_of_memory
print(apply_limit(1.0, "cuda", "torch", 0))
held = torch.empty(GB // 2, dtype=torch.uint8, device="cuda")
try:
    torch.empty(3 * GB // 4, dtype=torch.uint8, device="cuda")
    print("no error")
except Exception as exc:
    print(type(exc).__name__, is_out_of_memory(exc))
print(torch.cuda.max_memory_allocated(0))
"""


def test_the_cap_is_the_allocators_share_of_the_device() -> None:
    """Past 1 GiB of a device of many, PyTorch's caching allocator raises OutOfMemoryError,
    which is recognised; what it holds stays under the cap (in a process of its own: the
    share holds for the rest of a process)."""
    proc = subprocess.run([sys.executable, "-c", _CAPPED], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    applied, raised, peak = proc.stdout.strip().splitlines()[-3:]
    assert applied == f"{GB} bytes of GPU 0 (torch.cuda.set_per_process_memory_fraction)"
    assert raised == "OutOfMemoryError True"
    assert GB // 2 <= int(peak) <= GB


def test_a_point_past_its_device_share_is_a_result(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """gpt_tiny on one GPU capped at 1 GiB: batch 4 is done, batch 8192 (gigabytes of
    activations) runs out in its first step; the sweep exits 0 and says so."""
    spec = {
        "name": "gpu-oom",
        "executor": "local",
        "matrix": {"batch_size": [4, 8192]},
        "fixed": {
            "framework": "torch", "backend": "nccl", "launcher": "torchrun", "device": "cuda", "model": "gpt_tiny",
            "iterations": 2, "warmup": 0, "memory_limit_gb": LIMIT_GB,
        },
    }  # fmt: skip
    out = tmp_path / "sweep"
    run = run_module("hpcbench.sweep", str(write_spec(yaml.safe_dump(spec))), "--out", str(out), timeout=600)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((out / "logs").glob("*.log")))
    assert run.returncode == 0, run.stdout + run.stderr + logs
    entries = {e.point["batch_size"]: e for e in Manifest.load(out).entries.values()}
    assert entries[4].state == DONE
    assert entries[8192].state == OUT_OF_MEMORY, entries[8192].reason
    result = out / entries[8192].result
    assert read_point(result).status == schema.STATUS_OOM
    facts = oom.out_of_memory(result)
    assert facts is not None
    assert (facts.rank, facts.phase, facts.iteration) == (0, "step", 0)
    assert "CUDA out of memory" in facts.error
    assert 0 < facts.device_peak_bytes <= LIMIT_GB * GB
    prov = read_point(out / entries[4].result).provenance
    assert prov["memory_limit"] == f"{GB} bytes of GPU 0 (torch.cuda.set_per_process_memory_fraction)"
