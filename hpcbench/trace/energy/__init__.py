"""Energy readers: what a node's counters say it spent, or why they cannot say.

- `RaplReader` (rapl.py): CPU packages and their DRAM / core / uncore sub-zones, and psys,
  from the kernel's powercap tree; cumulative microjoules, wraps counted.
- `NvmlEnergyReader` (nvml.py): a GPU's energy counter through NVML, or its power
  integrated over time where the board has no counter.
- `IpmiPowerReader` (ipmi.py): a node's power meter (IPMI DCMI power reading), integrated over
  time, where the site sets ``HPCBENCH_NODE_METER``.
- hpcbench/store/energy.py (beside the point file's `/energy` table, which the analysis reads
  with it): `EnergySample` (one reading), `energy_between` (two readings, flagged where the
  window is shorter than the counter's update interval), `summarise` (a window's joules,
  seconds and average watts per domain), `Absent` (a source that cannot be read, and why).
- meter.py: `EnergyMeter`, what one rank reads for the point file's `/energy` table (the
  worker reads it between steps only).

Each reader's ``open`` returns the reader or an `Absent`; a reader's ``read`` returns
``{domain: cumulative microjoules}`` and ``sample(t_ns)`` the same as `EnergySample` rows.
Where nothing can be read the source is absent with its reason: no energy is estimated in
its place. These readers do not depend on the resource sampler; `sources_here` says what
this machine offers (for ``hpcbench check``).
"""

from __future__ import annotations

import os
from typing import Any

from hpcbench.store.energy import (
    NVML_UPDATE_INTERVAL_S,
    Absent,
    EnergySample,
    EnergyWindow,
    Summary,
    energy_between,
    summarise,
)
from hpcbench.trace.energy.ipmi import VARIABLE as NODE_METER_VARIABLE
from hpcbench.trace.energy.ipmi import IpmiPowerReader
from hpcbench.trace.energy.nvml import NvmlEnergyReader
from hpcbench.trace.energy.rapl import POWERCAP_ROOT, RaplReader

__all__ = [
    "NVML_UPDATE_INTERVAL_S",
    "POWERCAP_ROOT",
    "Absent",
    "EnergySample",
    "EnergyWindow",
    "IpmiPowerReader",
    "NvmlEnergyReader",
    "RaplReader",
    "Summary",
    "energy_between",
    "sources_here",
    "summarise",
]


def sources_here(root: str = POWERCAP_ROOT, nvml: Any = None) -> list[str]:
    """One line per energy source of this machine: "rapl: package-0, dram-0 (readable)",
    "rapl: absent: <why>", "node meter: ..." (where ``HPCBENCH_NODE_METER`` is set), "nvml energy:
    GPU 0 (<name>): <method>", "nvml energy: absent: <why>".

    Opens each source, reads it once and closes it again. `nvml`: pynvml or a stand-in.
    """
    rapl = RaplReader.open(root)
    if isinstance(rapl, Absent):
        lines = [f"rapl: {rapl}"]
    else:
        lines = [f"rapl: {rapl.describe()}"]
        rapl.close()
    node_meter = os.environ.get(NODE_METER_VARIABLE)
    if node_meter is not None:
        node = IpmiPowerReader.open(node_meter)
        lines.append(f"node meter: {node if isinstance(node, Absent) else node.describe()}")
    gpus = NvmlEnergyReader.open_all(nvml)
    if isinstance(gpus, Absent):
        return [*lines, f"nvml energy: {gpus}"]
    for gpu in gpus:
        if isinstance(gpu, Absent):
            lines.append(f"nvml energy: {gpu}")
        else:
            lines.append(f"nvml energy: {gpu.describe()}")
            gpu.close()
    return lines
