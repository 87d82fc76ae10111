"""GPU energy on a real NVIDIA GPU: NVML's energy counter (how often it moves, and that it
agrees with the board's power reading over a timed loop) and the energy recorded with the
timings of a ResNet-50 and a transformer point run through the sweep command.

They need a CUDA device and skip without one (this project's CI machines have none). On a GPU
host: `python -m pytest -m gpu tests/gpu -s` (`-s` shows the measured figures).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcbench.analysis import energy
from hpcbench.store.energy import NVML_UPDATE_INTERVAL_S
from hpcbench.store.reader import PointData
from hpcbench.trace.energy.nvml import COUNTER, NvmlEnergyReader
from tests.conftest import run_sweep, spec_text

torch = pytest.importorskip("torch")
pynvml = pytest.importorskip("pynvml")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU host)"),
]

WARM_S = 2.0  # of load before the window: clocks and power settle
WINDOW_S = 6.0
POWER_AVERAGE_S = 1.0  # nvmlDeviceGetPowerUsage: a one-second average on Ampere and later boards


class Poll:
    """NVML's energy counter read as often as the host can (each change and when it was
    seen), the board's power every 50 ms and its instantaneous power where NVML has it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.changes: list[tuple[float, int]] = []  # (seconds, mJ) where the counter moved
        self.power: list[tuple[float, float]] = []  # (seconds, W), the averaged reading
        self.instant: list[tuple[float, float]] = []  # (seconds, W), NVML_FI_DEV_POWER_INSTANT
        self._last = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        self._next_power = 0.0

    def __call__(self) -> None:
        now = time.perf_counter()
        value = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        if value != self._last:
            self.changes.append((now, value))
            self._last = value
        if now >= self._next_power:
            self._next_power = now + 0.05
            self.power.append((now, pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3))
            field = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)
            if field is not None:
                (value_,) = pynvml.nvmlDeviceGetFieldValues(self.handle, [field])
                if value_.nvmlReturn == pynvml.NVML_SUCCESS:
                    self.instant.append((now, value_.value.uiVal / 1e3))


def loaded_poll(seconds: float) -> tuple[Poll, float]:
    """Matrix products keep the GPU busy for `seconds` (two chunks queued at any time) while
    the host polls NVML; returns the polls and when the load began."""
    pynvml.nvmlInit()
    try:
        poll = Poll(pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device()))
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        previous = None
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(8):
                torch.mm(a, a)
            event = torch.cuda.Event()
            event.record()
            while previous is not None and not previous.query():
                poll()
            previous = event
        torch.cuda.synchronize()
        return poll, t0
    finally:
        pynvml.nvmlShutdown()


def test_the_energy_counter_moves_within_its_interval_and_equals_power_times_time() -> None:
    reader = NvmlEnergyReader.open(torch.cuda.current_device())
    assert isinstance(reader, NvmlEnergyReader) and reader.method == COUNTER, reader
    reader.close()

    poll, t0 = loaded_poll(WARM_S + WINDOW_S)
    window = [(t, mj) for t, mj in poll.changes if t >= t0 + WARM_S]
    assert len(window) >= 10, poll.changes
    intervals = np.diff([t for t, _ in window])
    median = statistics.median(intervals.tolist())
    p10, p90 = np.percentile(intervals, [10, 90]) * 1e3
    print(f"\nNVML energy counter: moved every {median * 1e3:.1f} ms (median of {len(intervals)};"
          f" 10-90 %: {p10:.1f}-{p90:.1f} ms)")  # fmt: skip
    # the analysis trusts a window no shorter than NVML_UPDATE_INTERVAL_S: the counter must move that often
    assert median <= NVML_UPDATE_INTERVAL_S * 1.05, intervals

    (t_a, e_a), (t_b, e_b) = window[0], window[-1]
    counter_w = (e_b - e_a) / 1e3 / (t_b - t_a)
    # the power reading averages the last second: readings from a second into the window on
    averaged = [w for t, w in poll.power if t_a + POWER_AVERAGE_S <= t <= t_b]
    power_w = float(np.mean(averaged))
    instant = [w for t, w in poll.instant if t_a <= t <= t_b]
    instant_w = float(np.mean(instant)) if instant else float("nan")
    print(f"over {t_b - t_a:.2f} s of matrix products: counter {counter_w:.1f} W, power reading {power_w:.1f} W"
          f" ({len(averaged)} reads), instantaneous power {instant_w:.1f} W ({len(instant)} reads);"
          f" energy {e_b - e_a} mJ against power x time {power_w * (t_b - t_a) * 1e3:.0f} mJ")  # fmt: skip
    assert counter_w == pytest.approx(power_w, rel=0.05)


def _timed_power_samples(p: PointData) -> np.ndarray:
    """The GPU power readings of the resource table inside the timed iterations (a second in)."""
    it = p.iterations
    timed = it[it["warmup"] == 0]
    start, end = float(timed["t_start"].min()), float(timed["t_end"].max())
    res = p.resources
    inside = (res["t"] >= start + POWER_AVERAGE_S) & (res["t"] <= end)
    return np.asarray(res["gpu_power_w"][inside], dtype=np.float64)


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "resnet50", "batch_size": 32, "iterations": 120},
        {"model": "gpt2_124m", "batch_size": 8, "seq_len": 1024, "precision": "bf16", "iterations": 160},
    ],
    ids=["resnet50", "gpt2_124m"],
)
def test_a_point_records_its_gpu_energy_with_the_timings(
    write_spec: Callable[..., Path], tmp_path: Path, fields: dict[str, Any]
) -> None:
    text = spec_text("energy", {"ranks_per_node": [1]}, framework="torch", backend="nccl", launcher="torchrun",
                     device="cuda", warmup=20, options={"sample_period_s": 0.05}, **fields)  # fmt: skip
    (p,) = run_sweep(write_spec, tmp_path / "sweep", text)
    assert p.complete
    (sources,) = p.provenance["energy_sources"]
    assert sources["nvml"].startswith("GPU 0 (") and "total-energy counter" in sources["nvml"], sources
    assert set(p.energy["source"].astype(str)) >= {"nvml-counter"}

    row = energy.row(p)
    assert row["energy_note"] == "", row
    samples = int(p.iterations["samples"][p.iterations["warmup"] == 0].sum())
    assert row["energy_per_sample_j"] == pytest.approx(row["energy_j"] / samples, rel=1e-9)
    readings = _timed_power_samples(p)
    assert len(readings) >= 5, readings
    print(f"\n{fields['model']}: {row['energy_per_sample_j']:.4f} J/sample, {row['energy_per_token_j']:.3e} J/token,"
          f" GPU {row['power_gpu_w']:.1f} W by the counter, {readings.mean():.1f} W by the power readings"
          f" ({len(readings)}), {row['energy_j']:.1f} J over {samples} samples")  # fmt: skip
    # two of NVML's measurements of the same window: the energy counter and the averaged power reading
    assert row["power_gpu_w"] == pytest.approx(float(readings.mean()), rel=0.1)
    if "seq_len" in fields:
        assert row["energy_per_token_j"] == pytest.approx(row["energy_per_sample_j"] / fields["seq_len"], rel=1e-9)
