"""A node's power meter through IPMI's DCMI power reading (``ipmitool dcmi power reading``).

Where a site's nodes have a baseboard management controller with DCMI power management, its
"Instantaneous power reading" is the power the whole node draws (power supplies, fans, CPUs,
memory, GPUs), what MLPerf power measures at the wall. It is a power, not an energy counter:
the reader integrates it over time itself, trapezoids between its reads, so the figure is
only as good as the reads are frequent (the rank reads it when the timed loop begins, when
warm-up ends, at every flush and when the loop ends), and the BMC averages the reading over
its own sampling period (about a second). The meter is an option, set per site with
``HPCBENCH_NODE_METER`` in the ranks' environment (a site profile's ``env``): ``ipmi`` for
``ipmitool dcmi power reading``, or the command line of another tool that prints the same
lines (``ipmitool -I open dcmi power reading``, a wrapper through sudo). Its output::

    Instantaneous power reading:                   312 Watts
    Minimum during sampling period:                 89 Watts
    ...
    Power reading state is:                   activated

Nothing is estimated where the command is missing, fails, prints no reading or reports the
reading deactivated: the source is absent with the reason.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

from hpcbench.store.energy import Absent
from hpcbench.trace.sources import describe

VARIABLE = "HPCBENCH_NODE_METER"
DCMI_COMMAND = ("ipmitool", "dcmi", "power", "reading")
TIMEOUT_S = 10.0
_READING = re.compile(r"^\s*Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts?\s*$", re.MULTILINE | re.IGNORECASE)
_STATE = re.compile(r"^\s*Power reading state is:\s*(\S+)", re.MULTILINE | re.IGNORECASE)


def command_for(setting: str) -> tuple[str, ...]:
    """The command of an ``HPCBENCH_NODE_METER`` value: ``ipmi``, or a command line."""
    return DCMI_COMMAND if setting.strip() == "ipmi" else tuple(shlex.split(setting))


def parse_watts(output: str) -> float:
    """The instantaneous power of DCMI's power reading; ValueError where it has none."""
    state = _STATE.search(output)
    if state is not None and state.group(1).lower() != "activated":
        raise ValueError(f"the BMC's power reading is {state.group(1)}")
    found = _READING.search(output)
    if found is None:
        raise ValueError("no 'Instantaneous power reading: N Watts' line in its output")
    return float(found.group(1))


class IpmiPowerReader:
    """The node's power through a DCMI power reading, integrated between reads; domain "node"."""

    source = "ipmi"
    domain = "node"

    def __init__(self, command: Sequence[str], watts: float, clock_ns: Callable[[], int]) -> None:
        self.command = tuple(command)
        self._clock_ns = clock_ns
        self._last_ns = clock_ns()
        self._last_w = watts
        self._integrated_uj = 0.0

    @classmethod
    def open(cls, setting: str, clock_ns: Callable[[], int] = time.perf_counter_ns) -> IpmiPowerReader | Absent:
        """Read the meter once (the command found, answering, its reading active), or say why not."""
        command = command_for(setting)
        if not command:
            return Absent(f"{VARIABLE} is empty")
        if shutil.which(command[0]) is None:
            return Absent(f"no {command[0]} on PATH ({VARIABLE}={setting})")
        try:
            watts = _watts(command)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return Absent(f"{shlex.join(command)}: {describe(exc)}")
        return cls(command, watts, clock_ns)

    @property
    def domains(self) -> list[str]:
        return [self.domain]

    def describe(self) -> str:
        return f"node power through `{shlex.join(self.command)}`: power x time, integrated between reads"

    def read(self) -> dict[str, int]:
        """Microjoules integrated since `open`. Raises OSError, ValueError or SubprocessError
        where the meter stops answering."""
        watts = _watts(self.command)
        now = self._clock_ns()
        # W x ns = 1e-9 J = 1e-3 uJ; the trapezoid between the previous reading and this one
        self._integrated_uj += (self._last_w + watts) / 2 * (now - self._last_ns) / 1e3
        self._last_ns, self._last_w = now, watts
        return {self.domain: round(self._integrated_uj)}

    def close(self) -> None:
        """Nothing is held open between reads."""


def _watts(command: Sequence[str]) -> float:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise ValueError(f"exit {done.returncode}: {said[-1] if said else 'no output'}")
    return parse_watts(done.stdout)
