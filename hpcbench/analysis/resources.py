"""CPU, memory and GPU use of a point, in the columns of seed 002's tables.

CPU percentages are of the whole node as sysstat reports them (every rank's sampler sees
its node; the mean is over all samples of all ranks). Memory is per rank: `mem_avg_mib`
is the mean over ranks of each rank's mean RSS, `mem_max_mib` the largest RSS any rank
reached (MiB = 2^20 bytes). Absent sources (NaN, or -1 for counters) are left out; a
column with no sample at all is NaN.
"""

from __future__ import annotations

import numpy as np

MIB = float(2**20)

RESOURCE_COLUMNS = [
    "cpu_user", "cpu_system", "cpu_iowait", "cpu_total", "mem_avg_mib", "mem_max_mib",
    "gpu_util", "gpu_mem_max_mib", "gpu_power_w",
]  # fmt: skip


def _mean(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def resource_row(resources: np.ndarray) -> dict[str, float]:
    """Per-point resource columns from the `resources` table rows of all ranks."""
    row = dict.fromkeys(RESOURCE_COLUMNS, float("nan"))
    if len(resources) == 0:
        return row
    user = resources["cpu_user"].astype(float)
    system = resources["cpu_system"].astype(float)
    iowait = resources["cpu_iowait"].astype(float)
    row["cpu_user"], row["cpu_system"], row["cpu_iowait"] = _mean(user), _mean(system), _mean(iowait)
    row["cpu_total"] = row["cpu_user"] + row["cpu_system"] + row["cpu_iowait"]
    rss = resources["rss_bytes"]
    ok = rss >= 0
    if ok.any():
        ranks = resources["rank"][ok]
        sums = np.bincount(ranks, weights=rss[ok].astype(float))
        counts = np.bincount(ranks)
        present = counts > 0
        row["mem_avg_mib"] = float((sums[present] / counts[present]).mean() / MIB)
        row["mem_max_mib"] = float(rss[ok].max() / MIB)
    row["gpu_util"] = _mean(resources["gpu_util"].astype(float))
    gpu_mem = resources["gpu_mem_bytes"]
    if (gpu_mem >= 0).any():
        row["gpu_mem_max_mib"] = float(gpu_mem[gpu_mem >= 0].max() / MIB)
    row["gpu_power_w"] = _mean(resources["gpu_power_w"].astype(float))
    return row
