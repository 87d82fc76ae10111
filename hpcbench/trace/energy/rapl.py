"""CPU and memory energy: RAPL counters through the kernel's powercap tree (``/sys/class/powercap``).

The kernel's layout (intel_rapl_msr / intel_rapl_common; AMD Zen processors appear under
the same ``intel-rapl`` names since Linux 5.8, and an ``amd-rapl`` prefix is read alike)::

    /sys/class/powercap/
        intel-rapl/                  the control type ("enabled"), its zones inside it again
        intel-rapl:0/                a package zone: name "package-0"
            name  energy_uj  max_energy_range_uj
            intel-rapl:0:0/          a sub-zone: name "core", "uncore" or "dram"
        intel-rapl:0:0 -> ...        every zone is also listed flat, as a link
        intel-rapl:1/                name "package-1", or "psys" (the whole SoC, on client parts)

Each zone is found once however many ways it is listed. ``intel-rapl-mmio:N`` (the same
package's counter through MMIO, on some laptops) is not read: it would count the package
twice.

Domains are named after the zone: a top-level zone by its ``name`` ("package-0", "psys"), a
sub-zone by its ``name`` and its package's number ("dram-0", "core-1").

``energy_uj`` is a counter of microjoules that wraps at ``max_energy_range_uj`` (about
262 kJ on many servers: 22 minutes at 200 W). A reading lower than the previous one means it
wrapped once: the range is added. Two wraps between readings cannot be seen, so the reader
must be read at least once per wrap period (the sampler's period is a second). Since the
PLATYPUS fix (CVE-2020-8694, kernels from late 2020) ``energy_uj`` is readable by root
only: then the source is absent and says so.

Each ``energy_uj`` is opened once and read with one ``pread`` per `read` (as the sampler's
kept files are); `close` releases them. A reader is used from one thread at a time.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbench.store.energy import Absent, EnergySample
from hpcbench.trace.sources import describe

POWERCAP_ROOT = "/sys/class/powercap"
ZONE_NAME = re.compile(r"^(?:intel|amd)-rapl:(\d+)(?::(\d+))?$")
CONTROL_TYPES = ("intel-rapl", "amd-rapl")
_READ_BYTES = 32  # a counter is at most 20 digits and a newline

Opener = Callable[[str], int]


def open_read_only(path: str) -> int:
    return os.open(path, os.O_RDONLY)


@dataclass
class _Zone:
    domain: str
    path: Path
    fd: int
    range_uj: int
    last_uj: int  # the last raw reading
    total_uj: int  # cumulative: the first raw reading plus every difference since, wraps counted


def find_zones(root: Path) -> dict[str, Path]:
    """Every RAPL zone under `root`, by its directory name ("intel-rapl:0:1"), each found once."""
    found: dict[str, Path] = {}
    level = [root]
    for _ in range(3):  # control type / package / sub-zone: never into "device", "subsystem" (loops)
        below = []
        for directory in level:
            try:
                entries = sorted(directory.iterdir())
            except OSError:
                continue
            for entry in entries:
                zone = ZONE_NAME.match(entry.name)
                if (zone or entry.name in CONTROL_TYPES) and entry.is_dir():
                    below.append(entry)
                    if zone:  # level by level: a zone keeps its shortest path (/sys/class/powercap/intel-rapl:0:0)
                        found.setdefault(entry.name, entry)
        level = below
    return dict(sorted(found.items(), key=lambda item: _zone_key(item[0])))


def _zone_key(name: str) -> tuple[int, int]:
    zone = ZONE_NAME.match(name)
    assert zone is not None
    return int(zone.group(1)), -1 if zone.group(2) is None else int(zone.group(2))


def _unreadable(path: Path, exc: BaseException) -> str:
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM):
        return (
            f"energy_uj is readable by root only: {path}: {describe(exc)}"
            " (kernels since late 2020, the PLATYPUS fix CVE-2020-8694)"
        )
    return f"{path}: {describe(exc)}"


class RaplReader:
    """The RAPL zones under a powercap root; `open` builds one, or says why there is none.

    Attributes:
        root: the powercap directory read.
        missing: the zones found but not readable, each with its reason (the others are read).
    """

    source = "rapl"

    def __init__(self, root: str, zones: list[_Zone], missing: list[str]) -> None:
        self.root = root
        self._zones = zones
        self.missing = missing

    @classmethod
    def open(cls, root: str = POWERCAP_ROOT, opener: Opener = open_read_only) -> RaplReader | Absent:
        """Find the zones under `root` and take a first reading of each.

        `opener` opens a file read-only and returns its descriptor (`os.open`); tests give one
        that refuses, as the kernel refuses a non-root reader (root itself ignores file modes).
        """
        base = Path(root)
        if not base.is_dir():
            return Absent(f"no {root} (no RAPL: a VM or a kernel without powercap)")
        zone_dirs = find_zones(base)
        if not zone_dirs:
            return Absent(f"no RAPL zones under {root} (no intel-rapl / amd-rapl: the rapl driver is not loaded)")
        names = {}
        for zone_id, path in zone_dirs.items():
            try:
                names[zone_id] = (path / "name").read_text().strip()
            except OSError:  # named by its directory then
                names[zone_id] = zone_id
        zones: list[_Zone] = []
        missing: list[str] = []
        used: set[str] = set()
        for zone_id, path in zone_dirs.items():
            domain = _domain(zone_id, names)
            if domain in used:  # two zones with one name: tell them apart by their directory
                domain = f"{domain}@{zone_id}"
            used.add(domain)
            try:
                range_uj = int((path / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as exc:
                missing.append(f"{domain}: no max_energy_range_uj, a wrap could not be told: {describe(exc)}")
                continue
            energy = path / "energy_uj"
            try:
                fd = opener(str(energy))
            except OSError as exc:
                missing.append(f"{domain}: {_unreadable(energy, exc)}")
                continue
            try:
                first = int(os.pread(fd, _READ_BYTES, 0))
            except (OSError, ValueError) as exc:
                os.close(fd)
                missing.append(f"{domain}: {_unreadable(energy, exc)}")
                continue
            zones.append(_Zone(domain, path, fd, range_uj, first, first))
        if not zones:
            more = f"; {len(missing) - 1} other zone(s) unreadable too" if len(missing) > 1 else ""
            return Absent(missing[0].split(": ", 1)[1] + more)
        return cls(root, zones, missing)

    @property
    def domains(self) -> list[str]:
        return [z.domain for z in self._zones]

    @property
    def ranges_uj(self) -> dict[str, int]:
        """Each domain's ``max_energy_range_uj``: its counter wraps after that many microjoules."""
        return {z.domain: z.range_uj for z in self._zones}

    def describe(self) -> str:
        """The readable domains ("package-0, dram-0 (readable)"), then the zones that are not, with why."""
        text = f"{', '.join(self.domains)} (readable)"
        if self.missing:
            text += "; not read: " + "; ".join(self.missing)
        return text

    def read(self) -> dict[str, int]:
        """Cumulative microjoules per domain, counting wraps since the previous `read` (or `open`).

        Raises OSError / ValueError where a counter cannot be read any more (the sampler
        counts that as an error of the source).
        """
        out = {}
        for z in self._zones:
            raw = int(os.pread(z.fd, _READ_BYTES, 0))
            step = raw - z.last_uj
            if step < 0:  # wrapped (at most once, if read once per wrap period)
                step += z.range_uj
            z.total_uj += step
            z.last_uj = raw
            out[z.domain] = z.total_uj
        return out

    def sample(self, t_ns: int) -> list[EnergySample]:
        """`read`, as one `EnergySample` per domain stamped `t_ns`."""
        return [EnergySample(t_ns, self.source, domain, uj) for domain, uj in self.read().items()]

    def close(self) -> None:
        for z in self._zones:
            os.close(z.fd)
        self._zones = []


def _domain(zone_id: str, names: dict[str, str]) -> str:
    """A top-level zone's name ("package-0"); a sub-zone's with its package's number ("dram-0")."""
    zone = ZONE_NAME.match(zone_id)
    assert zone is not None
    name = names[zone_id]
    if zone.group(2) is None:
        return name
    parent_id = zone_id.rsplit(":", 1)[0]
    parent = re.search(r"-(\d+)$", names.get(parent_id, ""))
    return f"{name}-{parent.group(1) if parent else zone.group(1)}"
