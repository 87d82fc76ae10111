"""The resource sampler's "gpu" source: the rank's GPU through NVML (nvidia-ml-py's `pynvml`).

``gpu_util`` (percent), ``gpu_mem_bytes`` (memory used on the whole device), ``gpu_power_w``
and ``gpu_sm_clock_mhz``. NVML is initialised once, at construction, and shut down by
`close`. Each metric is probed once then: one the GPU does not support stays NaN / -1.

``gpu_power_w`` is the board's instantaneous power (the field ``NVML_FI_DEV_POWER_INSTANT``)
where NVML answers it, else ``nvmlDeviceGetPowerUsage``, which recent boards average over the
last second (on one H200 both gave 690-692 W under a steady load); the source's description
says which (`power_reader`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hpcbench.trace.sources import SourceLog, describe

GPU_FLOAT_COLUMNS = ("gpu_util", "gpu_power_w", "gpu_sm_clock_mhz")


class GpuReader:
    """The "gpu" source for GPU `index` (None: absent)."""

    def __init__(self, log: SourceLog, index: int | None) -> None:
        self._log = log
        self._nvml: Any = None
        self._gpu: Any = None
        self._reads: list[tuple[str, Callable[[], float]]] = []
        if index is None:
            log.set("gpu", "absent: no GPU index given")
            return
        try:
            import pynvml
        except ImportError as exc:
            log.set("gpu", f"absent: {describe(exc)}")
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            log.set("gpu", f"absent: {describe(exc)}")
            return
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # noqa: BLE001 - no such GPU, no permission, ...
            log.set("gpu", f"absent: GPU {index}: {describe(exc)}")
            self._shutdown(pynvml)
            return
        if isinstance(name, bytes):  # older nvidia-ml-py returns bytes
            name = name.decode(errors="replace")
        self._nvml, self._gpu = pynvml, handle
        power, power_how = power_reader(pynvml, handle)
        reads: list[tuple[str, Callable[[], float]]] = [
            ("gpu_util", lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            ("gpu_mem_bytes", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)),
            ("gpu_power_w", power),
            ("gpu_sm_clock_mhz", lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))),
        ]
        # Probe each metric once: one a GPU does not support (power on some boards) stays
        # NaN / -1 for good instead of counting an error at every sample.
        missing = []
        for column, read in reads:
            try:
                read()
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported, ...
                missing.append(f"{column}: {describe(exc)}")
            else:
                self._reads.append((column, read))
        description = f"nvml: GPU {index} ({name})"
        if missing:
            description += " without " + ", ".join(missing)
        if ("gpu_power_w", power) in self._reads:
            description += f"; {power_how}"
        log.set("gpu", description)

    def _shutdown(self, nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - nothing to do about it but say so
            self._log.note_error("gpu", exc)

    def read(self, row: Any) -> None:
        for column in GPU_FLOAT_COLUMNS:
            row[column] = math.nan
        row["gpu_mem_bytes"] = -1
        for column, read in self._reads:
            try:
                row[column] = read()
            except Exception as exc:  # noqa: BLE001 - any NVMLError: this row's value stays NaN / -1
                self._log.note_error("gpu", exc)

    def close(self) -> None:
        """Shut NVML down where it was initialised; the GPU columns are NaN / -1 from now on."""
        nvml = self._nvml
        if nvml is not None:
            self._nvml = self._gpu = None
            self._reads = []
            self._shutdown(nvml)


INSTANT = "power: instantaneous (NVML_FI_DEV_POWER_INSTANT)"
AVERAGED = "power: nvmlDeviceGetPowerUsage (averaged by the board, over a second on recent GPUs)"


def power_reader(nvml: Any, handle: Any) -> tuple[Callable[[], float], str]:
    """How to read GPU `handle`'s power in watts, and its description: the instantaneous field
    where NVML has it and answers it for this GPU (asked once here), else the averaged reading."""
    field = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)

    def instant() -> float:
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field])
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(value.nvmlReturn)
        return float(value.value.uiVal) / 1000.0  # mW -> W

    why = "this pynvml has no NVML_FI_DEV_POWER_INSTANT"
    if field is not None:
        try:
            instant()
        except Exception as exc:  # noqa: BLE001 - NOT_SUPPORTED on older boards and drivers: the averaged reading
            why = f"no instantaneous power: {describe(exc)}"
        else:
            return instant, INSTANT
    return (lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0), f"{AVERAGED} ({why})"
