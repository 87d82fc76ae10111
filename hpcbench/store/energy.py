"""What the energy readers hand on: `Absent` (a source that cannot be read, and why), one
reading (`EnergySample`), the energy of one window between two readings (`energy_between`)
and of a whole run of readings (`summarise`).

Energy is kept in integer microjoules, cumulative from an origin that belongs to the source
(the RAPL counter's first reading, the NVML counter's zero when the driver loaded, the
power integration's start): only differences between two readings of the same source and
domain mean anything.

The readers (hpcbench/trace/energy/) make these; the point file's `/energy` table stores them
(store/schema.py `ENERGY_DTYPE`, one row per reading, the source named as recorded:
`RECORDED_SOURCES`), and the analysis (hpcbench/analysis/energy.py, which imports nothing of
the rank side) reads its windows back with `energy_between` and `summarise`: so this module
lives with the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

NVML_UPDATE_INTERVAL_S = 0.1  # NVML's energy counter moves every 20-100 ms (the slowest boards: 100)
RAPL_UPDATE_INTERVAL_S = 0.001  # RAPL's counters move about every millisecond
IPMI_UPDATE_INTERVAL_S = 1.0  # a BMC's DCMI power reading: averaged over about a second

# The `source` of a recorded row (/energy), and the update interval below which a window of
# it is not a measurement: RAPL; NVML's energy counter; NVML's power integrated between reads;
# a node meter's power (IPMI DCMI) integrated between reads.
RAPL = "rapl"
NVML_COUNTER = "nvml-counter"
NVML_POWER = "nvml-power"
IPMI_POWER = "ipmi-power"
RECORDED_SOURCES = {
    RAPL: RAPL_UPDATE_INTERVAL_S,
    NVML_COUNTER: NVML_UPDATE_INTERVAL_S,
    NVML_POWER: NVML_UPDATE_INTERVAL_S,
    IPMI_POWER: IPMI_UPDATE_INTERVAL_S,
}


@dataclass(frozen=True)
class Absent:
    """A source that cannot be read here; ``str()`` gives ``"absent: <reason>"`` as the sampler's sources do."""

    reason: str

    def __str__(self) -> str:
        return f"absent: {self.reason}"


@dataclass(frozen=True)
class EnergySample:
    """One reading of one domain: ``microjoules`` cumulative at ``t_ns`` (the caller's clock, ns).

    ``source``: "rapl" or "nvml"; ``domain``: "package-0", "dram-1", "gpu-0", ...
    """

    t_ns: int
    source: str
    domain: str
    microjoules: int

    @property
    def joules(self) -> float:
        return self.microjoules / 1e6


@dataclass(frozen=True)
class EnergyWindow:
    """The energy between two readings of one domain.

    ``trustworthy`` is False, and ``why`` says why, where the figure cannot be taken as a
    measurement: the window is shorter than the counter's update interval (the counter may
    not have moved at all, or moved once for energy mostly spent before the window), or the
    counter went backwards (a driver reload resets NVML's). The figure is returned either
    way, so that it can be shown marked as such; it is never to be printed as measured when
    ``trustworthy`` is False.
    """

    joules: float
    seconds: float
    trustworthy: bool
    why: str = ""

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else math.nan


def energy_between(
    before: EnergySample, after: EnergySample, update_interval_s: float = NVML_UPDATE_INTERVAL_S
) -> EnergyWindow:
    """The energy of `after` minus `before` (same source and domain, `after` not earlier).

    A window shorter than `update_interval_s` (default 0.1 s: NVML's counter; RAPL's moves
    about every millisecond) gives the difference with ``trustworthy=False``.
    """
    if (before.source, before.domain) != (after.source, after.domain):
        raise ValueError(
            f"energy_between: two domains ({before.source} {before.domain} and {after.source} {after.domain})"
        )
    if after.t_ns < before.t_ns:
        raise ValueError(f"energy_between: the second reading is earlier ({after.t_ns} < {before.t_ns} ns)")
    seconds = (after.t_ns - before.t_ns) / 1e9
    joules = (after.microjoules - before.microjoules) / 1e6
    if joules < 0:
        return EnergyWindow(joules, seconds, False, "the counter went backwards (reset: a driver reload?)")
    if seconds < update_interval_s:
        why = (
            f"a {seconds * 1e3:.3g} ms window is shorter than the counter's update interval"
            f" ({update_interval_s * 1e3:.3g} ms): the counter may not have moved within it"
        )
        return EnergyWindow(joules, seconds, False, why)
    return EnergyWindow(joules, seconds, True)


class Summary(NamedTuple):
    """One domain over a window: joules spent, seconds covered, average watts (NaN where unknown)."""

    joules: float
    seconds: float
    average_watts: float


def summarise(samples: Iterable[EnergySample]) -> dict[str, Summary]:
    """Per domain, from its earliest to its latest reading in `samples`: energy, time, average power.

    A domain read once gives 0 s and NaN watts; one whose counter went backwards (reset)
    gives NaN joules and watts: nothing is made up for a counter that cannot be followed.
    A domain name read from two sources raises ValueError.
    """
    first: dict[str, EnergySample] = {}
    last: dict[str, EnergySample] = {}
    for s in samples:
        seen = first.get(s.domain)
        if seen is not None and seen.source != s.source:
            raise ValueError(f"summarise: domain {s.domain} from two sources ({seen.source}, {s.source})")
        if seen is None or s.t_ns < seen.t_ns:
            first[s.domain] = s
        if s.domain not in last or s.t_ns >= last[s.domain].t_ns:
            last[s.domain] = s
    summary = {}
    for domain, a in first.items():
        b = last[domain]
        seconds = (b.t_ns - a.t_ns) / 1e9
        joules = (b.microjoules - a.microjoules) / 1e6
        if joules < 0:
            joules = math.nan
        watts = joules / seconds if seconds > 0 else math.nan
        summary[domain] = Summary(joules, seconds, watts)
    return summary
