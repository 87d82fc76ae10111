"""How much memory this host can give the benchmark's buffers, so that a size that cannot fit
is refused before any rank allocates it (`--sizes 1000G`)."""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
# A container's or a job's memory limit (cgroup v2, then v1); "max" or a huge number: none.
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
_NO_LIMIT = 1 << 60


def _meminfo_available(meminfo: Path) -> int | None:
    """MemAvailable of /proc/meminfo in bytes: what can be allocated without swapping."""
    try:
        text = meminfo.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return None


def _sysconf_available() -> int | None:
    try:
        pages, page = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def _cgroup_limit(limits: tuple[Path, ...]) -> int | None:
    for path in limits:
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
    return None


def available_memory(meminfo: Path = MEMINFO, limits: tuple[Path, ...] = CGROUP_LIMITS) -> int | None:
    """Bytes this host can give to new buffers: MemAvailable (else the free pages), no more than
    the memory limit of the cgroup the process runs in; None where nothing says."""
    available = _meminfo_available(meminfo)
    if available is None:
        available = _sysconf_available()
    limit = _cgroup_limit(limits)
    known = [v for v in (available, limit) if v is not None]
    return min(known) if known else None
