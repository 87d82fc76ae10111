"""The GPU paths on a real NVIDIA GPU: CUDA-event phase timing, NCCL messages timed on the
device, NVML resource samples, and PyTorch DDP over NCCL through the real sweep command.

They need a CUDA device and skip without one (this project's CI machines have none). On a
GPU host: `python -m pytest -m gpu tests/gpu`. Durations are made with `torch.cuda._sleep`,
a kernel that spins for a number of GPU clock cycles, calibrated on the device first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcbench.analysis.model import linkfit as calibration
from hpcbench.trace.recorder import Phase, clock_offset_ns
from hpcbench.workloads import zoo as models
from tests.conftest import run_module, run_sweep, spec_text

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU host)"),
]

# the device work of each phase of the synthetic step below, in milliseconds
PLAN_MS = {"h2d": 1.0, "forward": 3.0, "backward": 5.0, "comm": 2.0, "update": 1.0}


@pytest.fixture(scope="module")
def spin() -> Callable[[float], None]:
    """Queue `ms` milliseconds of device work on the current stream (calibrated here)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm the clocks up
    cycles = 50_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_ms = cycles / start.elapsed_time(end)

    def queue(ms: float) -> None:
        torch.cuda._sleep(int(ms * per_ms))

    return queue


@pytest.fixture
def clock() -> tuple[int, int]:
    return clock_offset_ns(), time.time_ns()


def queue_step(rec: Any, spin: Callable[[float], None], backward_marks: int = 1, comm: bool = True) -> None:
    """One iteration of PLAN_MS's device work, each phase marked where its work was queued:
    backward in `backward_marks` parts (a mark per gradient ready), `comm` left unmarked
    without `comm`."""
    rec.start()
    rec.mark(Phase.DATA)
    spin(PLAN_MS["h2d"])
    rec.mark(Phase.H2D)
    spin(PLAN_MS["forward"])
    rec.mark(Phase.FORWARD)
    for _ in range(backward_marks):
        spin(PLAN_MS["backward"] / backward_marks)
        rec.mark(Phase.BACKWARD)
    if comm:
        spin(PLAN_MS["comm"])
        rec.mark(Phase.COMM)
    spin(PLAN_MS["update"])
    rec.mark(Phase.UPDATE)
    rec.stop(64)


def test_phases_are_device_time_and_the_host_never_waits(spin: Callable[[float], None], clock: tuple[int, int]) -> None:
    from hpcbench.trace.cuda import CudaRecorder

    iterations = 20
    rec = CudaRecorder(iterations, *clock, torch.device("cuda", 0))
    torch.cuda.synchronize()
    host0 = time.perf_counter()
    for _ in range(iterations):  # a first gradient ready (an exchange's hook), then the last: its mark stands
        queue_step(rec, spin, backward_marks=2)
    host_s = time.perf_counter() - host0
    device_s = iterations * sum(PLAN_MS.values()) / 1e3
    assert host_s < device_s / 4, f"the host waited for the device: {host_s:.3f} s for {device_s:.3f} s of work"

    rows = rec.drain()
    for phase, ms in PLAN_MS.items():
        measured = rows[phase] * 1e3
        assert measured == pytest.approx(np.full(iterations, ms), rel=0.1, abs=0.05), phase
    assert (rows["t_end"] > rows["t_start"]).all()


def test_an_unmarked_phase_lasts_nothing_and_the_next_runs_from_the_last_mark(
    spin: Callable[[float], None], clock: tuple[int, int]
) -> None:
    """Iterations without an exchange mark no `comm` (a one-rank step): on the device it lasts
    0 s and `update` runs from backward's end; the block's last row is one of them."""
    from hpcbench.trace.cuda import CudaRecorder

    iterations = 4
    rec = CudaRecorder(iterations, *clock, torch.device("cuda", 0))
    for i in range(iterations):
        queue_step(rec, spin, comm=i % 2 == 0)
    rows = rec.drain()
    assert rows["comm"][0::2] * 1e3 == pytest.approx([PLAN_MS["comm"]] * 2, rel=0.1, abs=0.05)
    assert (rows["comm"][1::2] == 0).all()
    for phase in ("h2d", "forward", "backward", "update"):
        assert rows[phase] * 1e3 == pytest.approx(np.full(iterations, PLAN_MS[phase]), rel=0.1, abs=0.05), phase


def test_sampled_device_timing_times_every_nth_iteration_on_the_device(
    spin: Callable[[float], None], clock: tuple[int, int]
) -> None:
    """`device_every=3`: iterations 0 and 3 are the device's time; the others keep their host
    marks, which time the queueing of the same work (microseconds: the host never waits)."""
    from hpcbench.trace.cuda import CudaRecorder

    iterations = 6
    rec = CudaRecorder(iterations, *clock, torch.device("cuda", 0), device_every=3)
    for _ in range(iterations):
        queue_step(rec, spin)
    rows = rec.drain()
    assert rec.device_rows.tolist() == [True, False, False, True, False, False]
    host = ~rec.device_rows
    for phase, ms in PLAN_MS.items():
        assert rows[phase][0::3] * 1e3 == pytest.approx([ms, ms], rel=0.1, abs=0.05), phase
        assert (rows[phase][host] * 1e3 < ms / 4).all(), (phase, rows[phase])
    queue_step(rec, spin)  # the next block goes on counting: iterations 6 and 7 of the run
    queue_step(rec, spin)
    rows = rec.drain()
    assert rec.device_rows.tolist() == [True, False]
    assert rows["forward"][0] * 1e3 == pytest.approx(PLAN_MS["forward"], rel=0.1, abs=0.05)


@pytest.fixture
def nccl_world(tmp_path: Path) -> Iterator[Any]:
    """A real one-rank NCCL process group, its communicator made (NCCL makes it lazily, in
    the first collective, which then takes most of a second)."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(1, device="cuda"))
        torch.cuda.synchronize()
        yield dist
    finally:
        dist.destroy_process_group()


def test_nccl_messages_are_timed_on_the_device(
    spin: Callable[[float], None], clock: tuple[int, int], nccl_world: Any
) -> None:
    """The future of an NCCL all-reduce completes on the host once the collective is queued;
    the recorded duration must still be the device's: here at least the 5 ms of work queued
    ahead of the collective on the stream it waits for."""
    from hpcbench.trace.cuda import CudaCommRecorder

    comm = CudaCommRecorder(0, *clock, capacity=2)  # small: the test also grows it
    tensor = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    seen: list[float] = []
    for i in range(3):
        host0 = time.perf_counter()
        slot = comm.begin(i, "allreduce", "bucket0", "float32", tensor.numel() * 4)
        spin(5.0)  # the gradient is still being computed when the message is handed over
        fut = nccl_world.all_reduce(tensor, async_op=True).get_future()

        def done(f: Any, slot: int = slot) -> Any:
            comm.end(slot)
            return f.value()

        fut.then(done)
        seen.append(time.perf_counter() - host0)
    torch.cuda.synchronize()

    totals = comm.device_totals(0, 3)
    rows = comm.drain()
    durations = rows["t_end"] - rows["t_start"]
    # the 5 ms the collective waited for on the device, not the microseconds of queueing it
    assert durations == pytest.approx(np.full(3, 0.005), rel=0.1), durations
    assert max(seen) < 0.004, f"the host waited: {seen}"
    np.testing.assert_allclose(totals, durations, rtol=1e-6)
    assert rows["bytes"].tolist() == [4 << 20] * 3


def test_sampled_nccl_messages_keep_host_times_between_samples(
    spin: Callable[[float], None], clock: tuple[int, int], nccl_world: Any
) -> None:
    """`device_every=2`: messages of even iterations last the 5 ms they waited for on the
    device; the odd ones' host times are the queueing (the host never waited)."""
    from hpcbench.trace.cuda import CudaCommRecorder

    comm = CudaCommRecorder(0, *clock, capacity=4, device_every=2)
    tensor = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    for i in range(4):
        slot = comm.begin(i, "allreduce", "bucket0", "float32", tensor.numel() * 4)
        spin(5.0)
        fut = nccl_world.all_reduce(tensor, async_op=True).get_future()

        def done(f: Any, slot: int = slot) -> Any:
            comm.end(slot)
            return f.value()

        fut.then(done)
    torch.cuda.synchronize()
    rows = comm.drain()
    durations = rows["t_end"] - rows["t_start"]
    assert durations[0::2] == pytest.approx([0.005, 0.005], rel=0.1), durations
    assert (durations[1::2] < 0.00125).all(), durations


def test_nvml_samples_the_gpu_under_load(clock: tuple[int, int]) -> None:
    from hpcbench.trace.sampler import Sampler

    sampler = Sampler(0, 0.05, *clock, gpu_index=0)
    try:
        assert sampler.sources["gpu"].startswith("nvml: GPU 0 ("), sampler.sources
        a = torch.randn(8192, 8192, device="cuda")
        sampler.start()
        deadline = time.perf_counter() + 1.5
        while time.perf_counter() < deadline:
            for _ in range(10):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    finally:
        sampler.stop()
    rows = sampler.drain()
    assert len(rows) >= 10
    assert (rows["gpu_mem_bytes"] >= a.numel() * 4).all(), "the 256 MiB matrix is resident"
    assert rows["gpu_util"].max() >= 50
    assert not np.isnan(rows["gpu_util"]).any()
    assert (rows["gpu_power_w"] > 0).all() and (rows["gpu_sm_clock_mhz"] > 0).all()
    assert sampler.errors == 0, sampler.sources


def test_ddp_over_nccl_through_the_sweep(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    """A whole point, as a user runs it: torchrun, DDP over NCCL, CUDA events, NVML."""
    text = spec_text(
        "gpu", {"model": ["resnet50"]}, framework="torch", backend="nccl", launcher="torchrun", device="cuda",
        batch_size=32, iterations=20, warmup=3, options={"sample_period_s": 0.1},
    )  # fmt: skip
    (data,) = run_sweep(write_spec, tmp_path / "sweep", text)
    assert data.complete
    prov = data.provenance
    assert prov["nccl"] and prov["cuda"] and "NVIDIA" in prov["gpu"]
    (sources,) = prov["resource_sources"]
    assert sources["gpu"].startswith("nvml: GPU 0 ("), sources

    it = data.iterations[0]
    timed = it[it["warmup"] == 0]
    for phase in ("h2d", "forward", "backward", "update"):
        assert (timed[phase] > 0).all(), phase
    # ResNet-50's backward costs more than its forward; before backward was marked on the
    # device, all of it was counted as communication.
    assert np.median(timed["backward"]) > np.median(timed["forward"])
    assert np.median(timed["comm"]) < np.median(timed["backward"])
    assert np.isfinite(it["loss"]).all()  # the block's losses, copied from the device at the flush

    comm = data.comm
    grad_bytes = 4 * models.count_parameters(models.model("resnet50"))
    for i in range(it.shape[0]):
        assert int(comm[comm["iteration"] == i]["bytes"].sum()) == grad_bytes, i
    durations = comm["t_end"] - comm["t_start"]
    assert (durations > 0).all()
    # comm_total is the sum of the messages' device times, iteration by iteration
    per_iteration = np.bincount(comm["iteration"], weights=durations, minlength=it.shape[0])
    np.testing.assert_allclose(it["comm_total"], per_iteration, rtol=1e-6, atol=1e-9)

    res = data.resources
    assert len(res) >= 3
    assert (res["gpu_mem_bytes"] > 0).all() and (res["gpu_sm_clock_mhz"] > 0).all()


@pytest.mark.parametrize("launcher", ["none", "torchrun"])
def test_commbench_all_reduces_gpu_buffers_through_nccl(tmp_path: Path, launcher: str) -> None:
    out = tmp_path / "nccl.h5"
    args = ["--device", "cuda", "--sizes", "1M,64M,256M", "--iters", "10", "-o", str(out)]
    if launcher == "torchrun":
        argv = ["torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "hpcbench.commbench", *args]
    else:
        argv = ["hpcbench.commbench", *args]
    res = run_module(*argv, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "nccl" in res.stdout
    rows = calibration.read_commbench(out)
    assert rows["bytes"].tolist() == [1 << 20, 64 << 20, 256 << 20]
    assert (rows["time_s"] > 0).all() and (rows["ranks"] == 1).all()
    # One GPU: NCCL's in-place all-reduce of one rank moves nothing (a launch, about 30 us at
    # any size on an H100), so there is no bus traffic; growth with size needs two GPUs.
    assert (rows["busbw"] == 0).all()
    np.testing.assert_allclose(rows["algbw"], rows["bytes"] / rows["time_s"], rtol=1e-9)
    assert "destroy_process_group() was not called" not in res.stderr
    import h5py

    with h5py.File(out) as f:
        assert f.attrs["backend"] == "nccl" and f.attrs["device"] == "cuda"
