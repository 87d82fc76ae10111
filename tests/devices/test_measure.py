"""Measuring a peak: a timed matmul on the CPU, the cache of measurements, and
`hpcbench check --peak`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from hpcbench.devices import cache as peak_cache
from hpcbench.devices import measure
from hpcbench.devices.peaks import Peak, peak_for
from hpcbench.errors import HpcbenchError
from tests.conftest import run_module


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "peaks.json"


def test_cpu_fp32_peak_is_a_plausible_rate_and_round_trips(cache: Path) -> None:
    peak = measure.measure_peak("cpu", "fp32", seconds=0.3)
    cpus = len(os.sched_getaffinity(0))
    assert math.isfinite(peak.flops_per_s) and 0 < peak.flops_per_s < cpus * 1e12  # no core does 1 TFLOP/s fp32
    assert peak.dtype == "fp32"
    assert peak.device == measure.cpu_name() and peak.device.endswith(f"({cpus} CPU{'s' if cpus > 1 else ''})")
    assert peak.source.startswith(f"measured: {peak.device} fp32 matmul n=")
    assert peak_cache.cache_path() == cache
    assert peak_cache.save_measured(peak) == cache
    loaded = peak_cache.load_measured()
    assert loaded[peak.device]["fp32"]["flops_per_s"] == peak.flops_per_s
    assert loaded[peak.device]["fp32"]["source"] == peak.source
    assert "measured_at" in loaded[peak.device]["fp32"]
    assert peak_for(peak.device, "fp32", loaded) == peak  # a CPU is in no table: the measured peak


def test_the_cache_keeps_other_entries_and_leaves_no_temporary(cache: Path) -> None:
    assert peak_cache.load_measured() == {}  # no cache yet
    first = Peak(1e12, "bf16", "measured: a", "GPU A")
    peak_cache.save_measured(first, measured_at="2025-01-01T00:00:00+00:00")
    peak_cache.save_measured(Peak(2e12, "fp32", "measured: a32", "GPU A"))
    peak_cache.save_measured(Peak(3e12, "bf16", "measured: b", "GPU B"))
    peak_cache.save_measured(Peak(4e12, "bf16", "measured: a again", "GPU A"))  # replaces the first
    data = peak_cache.load_measured()
    assert {d: sorted(v) for d, v in data.items()} == {"GPU A": ["bf16", "fp32"], "GPU B": ["bf16"]}
    assert data["GPU A"]["bf16"]["flops_per_s"] == 4e12 and data["GPU A"]["bf16"]["source"] == "measured: a again"
    assert [p.name for p in cache.parent.iterdir()] == ["peaks.json"]


def test_a_failed_write_leaves_the_old_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peak_cache.save_measured(Peak(1e12, "bf16", "measured: a", "GPU A"))
    before = cache.read_text()

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", crash)
    with pytest.raises(OSError, match="disk full"):
        peak_cache.save_measured(Peak(2e12, "bf16", "measured: b", "GPU B"))
    assert cache.read_text() == before
    assert [p.name for p in cache.parent.iterdir()] == ["peaks.json"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"GPU A": 3}', '{"GPU A": {"bf16": 3}}'])
def test_a_damaged_cache_is_named(cache: Path, text: str) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text(text)
    with pytest.raises(HpcbenchError, match=r"peaks\.json: not a cache of measured peaks"):
        peak_cache.load_measured()


@pytest.mark.parametrize(
    ("device", "dtype", "seconds", "message"),
    [
        ("cpu", "tf32", 1.0, "tf32 is a CUDA matmul mode"),
        ("cpu", "fp64", 1.0, r"allowed: fp32, tf32, bf16, fp16"),
        ("cpu", "fp8", 1.0, r"allowed: fp32, tf32, bf16, fp16"),
        ("tpu", "fp32", 1.0, r"allowed: cpu, cuda"),
        ("cpu", "fp32", 0.0, "positive"),
        ("cpu", "fp32", math.nan, "positive"),
    ],
)
def test_what_cannot_be_measured_is_refused(device: str, dtype: str, seconds: float, message: str) -> None:
    with pytest.raises(HpcbenchError, match=message):
        measure.measure_peak(device, dtype, seconds)


def test_sizes_grow_to_the_target_and_stop_at_the_cap() -> None:
    assert measure._next_size(512, 0.0027) > 1024  # 2.7 ms at 512: about 1400 for 50 ms
    assert measure._next_size(512, 0.049) == 768  # one step at least
    assert measure._next_size(4096, 1e-6) == measure.N_CAP
    assert all(measure._next_size(n, 0.001) % 256 == 0 for n in (512, 768, 1280))


def test_cli_measures_prints_and_saves(tmp_path: Path) -> None:
    res = run_module(
        "hpcbench", "check", "--peak", "--dtype", "fp32", "--seconds", "0.05", env={"HPCBENCH_CACHE": str(tmp_path)}
    )
    assert res.returncode == 0, res.stderr
    device = measure.cpu_name()
    assert "TFLOP/s" in res.stdout and device in res.stdout, res.stdout
    line = next(line for line in res.stdout.splitlines() if "measured:" in line)
    assert float(line.split()[line.split().index("fp32") + 1]) > 0  # the TFLOP/s figure
    data = json.loads((tmp_path / "peaks.json").read_text())
    assert data[device]["fp32"]["flops_per_s"] > 0


def test_cli_names_the_allowed_dtypes(tmp_path: Path) -> None:
    res = run_module("hpcbench", "check", "--peak", "--dtype", "fp32,fp64", env={"HPCBENCH_CACHE": str(tmp_path)})
    assert res.returncode == 2
    assert "--dtype: fp64" in res.stderr and "allowed: fp32, tf32, bf16, fp16" in res.stderr, res.stderr
    assert not (tmp_path / "peaks.json").exists()  # refused before anything was measured


def test_cli_peak_options_need_peak() -> None:
    res = run_module("hpcbench", "check", "--dtype", "bf16")
    assert res.returncode == 2
    assert "--dtype goes with --peak" in res.stderr, res.stderr


def test_tf32_is_on_only_while_tf32_is_measured_and_threads_are_restored() -> None:
    torch = pytest.importorskip("torch")
    matmul = torch.backends.cuda.matmul  # settable without a GPU
    before = matmul.allow_tf32

    def tf32() -> bool:
        return bool(matmul.allow_tf32)

    try:
        for start in (False, True):
            matmul.allow_tf32 = start
            with measure._torch_mode(torch, "cuda", "tf32"):
                assert tf32()
            assert tf32() is start
            with measure._torch_mode(torch, "cuda", "fp32"):
                assert not tf32()  # fp32 is measured as fp32, whatever was set
            assert tf32() is start
    finally:
        matmul.allow_tf32 = before
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with measure._torch_mode(torch, "cpu", "fp32"):
            assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
