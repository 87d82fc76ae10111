"""A device's peak FLOP/s, measured: the best rate of a timed square matrix product, and the
cache of such measurements, `$HPCBENCH_CACHE/peaks.json` (default ~/.cache/hpcbench), which
`hpcbench check --peak` fills and `peaks.peak_for` falls back on for a device the table lacks
(docs/metrics-and-model.md#peaks-and-mfu).

The product is torch's where torch imports (on the CPU with every CPU this process may run on,
on CUDA timed by CUDA events), else numpy's (fp32 on the CPU only, with its BLAS's threads).
Its size n starts at 512 and grows until one product takes at least 50 ms, or n reaches 8192;
then batches of products (each at least 50 ms) are timed for `seconds`, at least 3 of them,
and the best batch gives the rate: 2·n³ FLOPs per product.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hpcbench.devices.cache import load_measured, save_measured
from hpcbench.devices.peaks import Peak, peak_for
from hpcbench.errors import HpcbenchError

MEASURABLE: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")  # fp8 has no plain matmul: table only
DEVICES: tuple[str, ...] = ("cpu", "cuda")
TARGET_S = 0.05  # the shortest product (while sizing) and batch (while timing) that is timed
N_START = 512
N_CAP = 8192
MIN_REPEATS = 3
MAX_REPEATS = 1000

Timed = Callable[[int], float]  # seconds that `count` products take
Setup = Callable[[int], Timed]  # the timed product of n×n matrices


def _cpus() -> int:
    """The logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform) and the CPUs this process may use,
    e.g. "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz (2 CPUs)"."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
                break
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    cpus = _cpus()
    return f"{' '.join(model.split())} ({cpus} CPU{'' if cpus == 1 else 's'})"


def _cuda_name(torch: Any, index: int) -> str:
    """NVML's name of CUDA device `index` (found by its UUID: NVML counts every GPU, CUDA only
    the visible ones), else torch's (no pynvml, no NVML, a MIG slice, a ROCm device)."""
    try:
        import pynvml
    except ImportError:
        return str(torch.cuda.get_device_name(index))
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return str(torch.cuda.get_device_name(index))
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
        name = pynvml.nvmlDeviceGetName(handle)
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no such UUID (MIG, ROCm), no permission, ...
        return str(torch.cuda.get_device_name(index))
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _check(device: str, dtype: str, seconds: float) -> None:
    if device not in DEVICES:
        raise HpcbenchError(f"device {device!r} cannot be measured (allowed: {', '.join(DEVICES)})")
    if dtype not in MEASURABLE:
        raise HpcbenchError(f"dtype {dtype!r} cannot be measured (allowed: {', '.join(MEASURABLE)})")
    if device == "cpu" and dtype == "tf32":
        raise HpcbenchError(
            "tf32 is a CUDA matmul mode (fp32 data on tensor cores): a CPU has none; measure fp32 there"
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise HpcbenchError(f"seconds must be a positive number, not {seconds}")


def device_name(device: str = "cpu") -> str:
    """The name measurements of `device` are filed under: `cpu_name()`, or the current CUDA
    device's NVML name."""
    if device == "cpu":
        return cpu_name()
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        raise HpcbenchError(f"device {device!r}: no CUDA device is available to torch here")
    return _cuda_name(torch, torch.cuda.current_device())


def _numpy_setup(n: int) -> Timed:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)

    def timed(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            np.matmul(a, b, out=c)
        return time.perf_counter() - start

    return timed


def _torch_setup(torch: Any, device: Any, dtype: Any) -> Setup:
    def setup(n: int) -> Timed:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)

        def timed_cpu(count: int) -> float:
            start = time.perf_counter()
            for _ in range(count):
                torch.matmul(a, b, out=c)
            return time.perf_counter() - start

        def timed_cuda(count: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)  # nothing queued before is timed
            start.record()
            for _ in range(count):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3  # ms -> s

        return timed_cuda if device.type == "cuda" else timed_cpu

    return setup


@contextlib.contextmanager
def _torch_mode(torch: Any, device: str, dtype: str) -> Iterator[None]:
    """During the measurement only: every allowed CPU as a torch thread; on CUDA, tf32 matmuls
    for tf32 and none for fp32 (whatever the process had set)."""
    if device == "cpu":
        threads = torch.get_num_threads()
        torch.set_num_threads(_cpus())
        try:
            yield
        finally:
            torch.set_num_threads(threads)
        return
    matmul = torch.backends.cuda.matmul
    allow_tf32 = matmul.allow_tf32
    matmul.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        matmul.allow_tf32 = allow_tf32


def _next_size(n: int, seconds: float) -> int:
    """The size whose product should take TARGET_S (cubic in n), 10 % over, in steps of 256;
    at least one step more, at most N_CAP."""
    grown = n * math.pow(TARGET_S / max(seconds, 1e-9), 1 / 3) * 1.1
    return min(N_CAP, max(n + 256, math.ceil(grown / 256) * 256))


def _best_rate(setup: Setup, seconds: float) -> tuple[float, int]:
    """(FLOP/s of the best timed batch, n)."""
    n = N_START
    while True:
        timed = setup(n)
        timed(1)  # warm-up: first touch of the memory, library start-up, kernel choice
        once = timed(1)
        if once >= TARGET_S or n >= N_CAP:
            break
        n = _next_size(n, once)
    count = max(1, math.ceil(TARGET_S / max(once, 1e-9)))
    best = math.inf
    deadline = time.perf_counter() + seconds
    for repeat in range(1, MAX_REPEATS + 1):
        best = min(best, timed(count))
        if repeat >= MIN_REPEATS and time.perf_counter() >= deadline:
            break
    if not best > 0:
        raise HpcbenchError(f"a batch of {count} products of n={n} took no measurable time: no rate")
    return 2.0 * n**3 * count / best, n


def measure_peak(device: str = "cpu", dtype: str = "fp32", seconds: float = 2.0) -> Peak:
    """The best rate of an n×n matrix product in `dtype` on `device` ("cpu", or "cuda": the
    current CUDA device), timed for about `seconds` after sizing n."""
    _check(device, dtype, seconds)
    torch = _torch()
    if torch is None:
        if (device, dtype) != ("cpu", "fp32"):
            raise HpcbenchError(f"measuring {dtype} on {device} needs torch, which does not import here")
        name = cpu_name()
        rate, n = _best_rate(_numpy_setup, seconds)
    else:
        name = device_name(device)
        dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        try:
            with _torch_mode(torch, device, dtype):
                rate, n = _best_rate(_torch_setup(torch, dev, tdtype), seconds)
        except RuntimeError as exc:  # a dtype this torch has no matmul for on this device
            raise HpcbenchError(f"cannot measure {dtype} on {name}: {exc}") from exc
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return Peak(rate, dtype, f"measured: {name} {dtype} matmul n={n}, {date}", name)


def ensure_cpu_peaks(dtypes: Iterable[str], seconds: float = 1.0) -> list[Peak]:
    """Measure and cache this CPU's peak for each of `dtypes` that has none yet (in the table
    or the cache), so that a sweep run here has its MFU; the peaks measured now. A dtype this
    interpreter cannot measure (bf16 without torch) is left out: its MFU stays blank, and
    the analysis says why."""
    name = cpu_name()
    measured = []
    for dtype in sorted(set(dtypes)):
        if dtype == "tf32" or peak_for(name, dtype, load_measured()) is not None:
            continue
        try:
            peak = measure_peak("cpu", dtype, seconds)
        except HpcbenchError:
            continue
        save_measured(peak)
        measured.append(peak)
    return measured
