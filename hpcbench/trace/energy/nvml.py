"""GPU energy through NVML (nvidia-ml-py's `pynvml`).

Where the GPU has it (Volta and later), ``nvmlDeviceGetTotalEnergyConsumption``: millijoules
since the driver loaded, updated every 20-100 ms by the driver (so a window shorter than that
is not measured: see `energy_between`). Where that call is NOT_SUPPORTED (older boards) but
``nvmlDeviceGetPowerUsage`` (milliwatts) answers, the reader integrates power over time
itself: the trapezoid between each two reads, so the figure is only as good as the reads are
frequent (the power reading is itself averaged by the board), and `method` says it was
integrated. Any other failure (no permission, no library, no driver, no such GPU) leaves
the source absent with NVML's reason; nothing is estimated in its place.

NVML is initialised by `open` and shut down by `close` (NVML counts its initialisations:
this reader beside the sampler's "gpu" source is fine). `nvml` may be any object with
pynvml's functions and error classes (tests pass a fake; there is no GPU on CI).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from hpcbench.store.energy import NVML_UPDATE_INTERVAL_S, Absent, EnergySample
from hpcbench.trace.sources import describe

COUNTER = "counter"
INTEGRATION = "power integration"
_METHOD_TEXT = {
    COUNTER: "total-energy counter (nvmlDeviceGetTotalEnergyConsumption)",
    INTEGRATION: "power x time, integrated between reads (nvmlDeviceGetPowerUsage; no energy counter: {why})",
}


def import_nvml() -> Any:
    """pynvml, or an `Absent` saying it is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        return Absent(f"no pynvml (nvidia-ml-py): {describe(exc)}")
    return pynvml


def _not_supported(nvml: Any, exc: BaseException) -> bool:
    return isinstance(exc, nvml.NVMLError) and getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(Exception):  # on the way out of a failure already reported, or at close
        nvml.nvmlShutdown()


class NvmlEnergyReader:
    """One GPU's energy: its domain is "gpu-<index>"; `method` is "counter" or "power integration"."""

    source = "nvml"
    update_interval_s = NVML_UPDATE_INTERVAL_S

    def __init__(
        self, nvml: Any, handle: Any, index: int, name: str, method: str, why: str, clock_ns: Callable[[], int]
    ) -> None:
        self._nvml: Any = nvml
        self._handle = handle
        self.index = index
        self.name = name
        self.method = method
        self._why = why
        self._clock_ns = clock_ns
        self.domain = f"gpu-{index}"
        self._last_ns = clock_ns()
        self._last_mw = 0
        self._integrated_uj = 0.0
        if method == INTEGRATION:
            self._last_mw = nvml.nvmlDeviceGetPowerUsage(handle)

    @classmethod
    def open(
        cls, index: int, nvml: Any = None, clock_ns: Callable[[], int] = time.perf_counter_ns
    ) -> NvmlEnergyReader | Absent:
        """Initialise NVML, find GPU `index` and choose how its energy is read (or say why it cannot be).

        `clock_ns` times the power integration (the counter needs no clock).
        """
        nvml = _initialised(nvml)
        if isinstance(nvml, Absent):
            return nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # noqa: BLE001 - no such GPU, no permission, ...
            _shutdown(nvml)
            return Absent(f"GPU {index}: {describe(exc)}")
        if isinstance(name, bytes):  # older nvidia-ml-py returns bytes
            name = name.decode(errors="replace")
        method, why = COUNTER, ""
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as exc:  # noqa: BLE001 - any NVMLError
            if not _not_supported(nvml, exc):  # NO_PERMISSION, GPU_IS_LOST, ...: absent, no fallback
                _shutdown(nvml)
                return Absent(f"GPU {index} ({name}): nvmlDeviceGetTotalEnergyConsumption: {describe(exc)}")
            method, why = INTEGRATION, describe(exc)
        try:
            return cls(nvml, handle, index, name, method, why, clock_ns)
        except Exception as exc:  # noqa: BLE001 - the power reading of the integration path
            _shutdown(nvml)
            return Absent(
                f"GPU {index} ({name}): nvmlDeviceGetTotalEnergyConsumption: {why};"
                f" nvmlDeviceGetPowerUsage: {describe(exc)}"
            )

    @classmethod
    def open_all(
        cls, nvml: Any = None, clock_ns: Callable[[], int] = time.perf_counter_ns
    ) -> list[NvmlEnergyReader | Absent] | Absent:
        """A reader (or why not) for each GPU NVML sees; `Absent` where NVML itself cannot be used."""
        nvml = _initialised(nvml)
        if isinstance(nvml, Absent):
            return nvml
        try:  # each reader holds its own initialisation: this one only spans the opening
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                return Absent("no GPU (NVML counts none)")
            return [cls.open(i, nvml, clock_ns) for i in range(count)]
        except Exception as exc:  # noqa: BLE001 - NVMLError from nvmlDeviceGetCount
            return Absent(f"nvmlDeviceGetCount: {describe(exc)}")
        finally:
            _shutdown(nvml)

    @property
    def domains(self) -> list[str]:
        return [self.domain]

    def describe(self) -> str:
        return f"GPU {self.index} ({self.name}): {_METHOD_TEXT[self.method].format(why=self._why)}"

    def read(self) -> dict[str, int]:
        """Cumulative microjoules: the counter's (since the driver loaded), or the integral since `open`.

        Raises pynvml's NVMLError where the GPU stops answering.
        """
        if self.method == COUNTER:
            return {self.domain: int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) * 1000}
        now = self._clock_ns()
        mw = self._nvml.nvmlDeviceGetPowerUsage(self._handle)
        # mW x ns = 1e-12 J = 1e-6 uJ; the trapezoid between the previous reading and this one
        self._integrated_uj += (self._last_mw + mw) / 2 * (now - self._last_ns) / 1e6
        self._last_ns, self._last_mw = now, mw
        return {self.domain: round(self._integrated_uj)}

    def sample(self, t_ns: int) -> list[EnergySample]:
        """`read`, as an `EnergySample` stamped `t_ns`."""
        return [EnergySample(t_ns, self.source, domain, uj) for domain, uj in self.read().items()]

    def close(self) -> None:
        """Shut NVML down (once)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            _shutdown(nvml)


def _initialised(nvml: Any) -> Any:
    """`nvml` (pynvml where None) after nvmlInit, or why NVML cannot be used (`Absent`)."""
    if nvml is None:
        nvml = import_nvml()
        if isinstance(nvml, Absent):
            return nvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return Absent(describe(exc))
    return nvml
