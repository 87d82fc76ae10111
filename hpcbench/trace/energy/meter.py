"""A rank's energy readings for the point file: `EnergyMeter`.

The worker opens one per rank before the timed loop (`PointRun.start`) and reads it between
steps only: when the loop begins, when warm-up ends, at every flush inside the loop and when
the loop ends; never inside a step. Each reading is one row of the `/energy` table
(store/schema.py `ENERGY_DTYPE`) per domain, stamped on the common clock as the resource
samples are. Which counters a rank reads:

- its GPU's, through NVML (`NvmlEnergyReader`), where the point runs on CUDA: the GPU of its
  local rank, as the sampler's; recorded as source "nvml-counter" (the energy counter) or
  "nvml-power" (power integrated between reads);
- its host's RAPL domains (`RaplReader`), by the host's local rank 0 only (one reader per
  host: the counters are the host's, not the rank's); source "rapl";
- where the site sets ``HPCBENCH_NODE_METER`` (ipmi.py), its node's power meter through a DCMI
  power reading, by the host's local rank 0 only; source "ipmi-power", domain "node".

`sources` says, per source, how it is read (the reader's `describe()`), or "absent: <why>"
where it cannot be, or "not read: <why>" where this rank is not the one to read it: the
provenance `energy_sources` records every rank's. A reader that fails later (OSError, an
NVMLError) is closed and read no more; the run goes on, and `sources` and stderr say so.

``HPCBENCH_POWERCAP_ROOT`` points the RAPL reader at another powercap tree than
``/sys/class/powercap``: for tests, which lay one out as the kernel does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import numpy as np

from hpcbench.store.energy import IPMI_POWER, NVML_COUNTER, NVML_POWER, RAPL, Absent
from hpcbench.store.schema import ENERGY_DTYPE
from hpcbench.trace.energy.ipmi import VARIABLE as NODE_METER_VARIABLE
from hpcbench.trace.energy.ipmi import IpmiPowerReader
from hpcbench.trace.energy.nvml import COUNTER, NvmlEnergyReader
from hpcbench.trace.energy.rapl import POWERCAP_ROOT, RaplReader
from hpcbench.trace.sources import describe

ROOT_VARIABLE = "HPCBENCH_POWERCAP_ROOT"  # tests: a powercap tree laid out as the kernel's


def powercap_root() -> str:
    """The powercap tree to read: ``HPCBENCH_POWERCAP_ROOT`` where set (tests), else the kernel's."""
    return os.environ.get(ROOT_VARIABLE) or POWERCAP_ROOT


class EnergyMeter:
    """The energy counters one rank reads, and its readings since the last `drain`.

    Attributes:
        sources: "rapl" and "nvml": how each is read, "absent: <why>" or "not read: <why>".
        errors: readers stopped by a failure.
    """

    def __init__(
        self,
        rank: int,
        clock_offset_ns: int,
        epoch_ns: int,
        local_rank: int,
        gpu_index: int | None,
        root: str | None = None,
        nvml: Any = None,
    ) -> None:
        self.rank = rank
        self._offset_ns = clock_offset_ns - epoch_ns
        self.sources: dict[str, str] = {}
        self.errors = 0
        # (name in sources, recorded source, reader)
        self._readers: list[tuple[str, str, RaplReader | NvmlEnergyReader | IpmiPowerReader]] = []
        self._rows: list[tuple[int, float, bytes, bytes, int]] = []
        node_meter = os.environ.get(NODE_METER_VARIABLE)
        if local_rank == 0:
            rapl = RaplReader.open(root or powercap_root())
            self._add("rapl", RAPL, rapl)
            if node_meter is not None:
                self._add("node", IPMI_POWER, IpmiPowerReader.open(node_meter))
        else:
            self.sources["rapl"] = "not read: local rank 0 reads its host's"
            if node_meter is not None:
                self.sources["node"] = "not read: local rank 0 reads its host's"
        if gpu_index is None:
            self.sources["nvml"] = "not read: the point runs on the CPU"
        else:
            gpu = NvmlEnergyReader.open(gpu_index, nvml)
            recorded = NVML_POWER if isinstance(gpu, Absent) or gpu.method != COUNTER else NVML_COUNTER
            self._add("nvml", recorded, gpu)

    def _add(self, name: str, recorded: str, reader: RaplReader | NvmlEnergyReader | IpmiPowerReader | Absent) -> None:
        if isinstance(reader, Absent):
            self.sources[name] = str(reader)
            return
        self.sources[name] = reader.describe()
        self._readers.append((name, recorded, reader))

    @property
    def reading(self) -> bool:
        """Whether any source is read."""
        return bool(self._readers)

    def read(self) -> None:
        """Read every source now (between steps), a row per domain; a source that fails is
        closed, noted in `sources` and on stderr, and not read again."""
        for entry in list(self._readers):
            name, recorded, reader = entry
            now = time.perf_counter_ns()
            try:
                values = reader.read()
            except Exception as exc:  # noqa: BLE001 - OSError, ValueError, NVMLError: the run goes on
                self._readers.remove(entry)
                self.errors += 1
                self.sources[name] += f"; stopped: {describe(exc)}"
                print(f"hpcbench.worker: rank {self.rank}: energy source {name} stopped: {describe(exc)}",
                      file=sys.stderr, flush=True)  # fmt: skip
                _close(reader)
                continue
            t = (now + self._offset_ns) / 1e9
            source = recorded.encode()
            self._rows += [(self.rank, t, source, domain.encode(), uj) for domain, uj in values.items()]

    def drain(self) -> np.ndarray:
        """The rows (ENERGY_DTYPE) read since the last drain, oldest first."""
        rows, self._rows = self._rows, []
        return np.array(rows, dtype=ENERGY_DTYPE)

    def close(self) -> None:
        """Close every reader (once)."""
        readers, self._readers = self._readers, []
        for _, _, reader in readers:
            _close(reader)


def _close(reader: RaplReader | NvmlEnergyReader | IpmiPowerReader) -> None:
    with contextlib.suppress(Exception):  # closing after a failure already reported
        reader.close()
