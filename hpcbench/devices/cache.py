"""The cache of measured peaks, `$HPCBENCH_CACHE/peaks.json` (default ~/.cache/hpcbench):
`hpcbench check --peak` fills it (measure.py), the worker and the analysis read it for a
device the table lacks (peaks.peak_for). Reading it imports nothing but the standard library."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hpcbench.devices.peaks import Peak
from hpcbench.errors import HpcbenchError

Measured = dict[str, dict[str, dict[str, Any]]]  # device -> dtype -> {flops_per_s, source, measured_at}


def cache_path() -> Path:
    """`$HPCBENCH_CACHE/peaks.json` (default ~/.cache/hpcbench/peaks.json)."""
    root = os.environ.get("HPCBENCH_CACHE") or Path.home() / ".cache" / "hpcbench"
    return Path(root) / "peaks.json"


def _damaged(path: Path, why: str) -> HpcbenchError:
    return HpcbenchError(f"{path}: not a cache of measured peaks ({why}); delete it and run `hpcbench check --peak`")


def load_measured(path: Path | None = None) -> Measured:
    """The cached measurements, device -> dtype -> {flops_per_s, source, measured_at}; {} when
    there is no cache."""
    path = path or cache_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _damaged(path, str(exc)) from None
    if not isinstance(data, dict):
        raise _damaged(path, "not a JSON object")
    for device, by_dtype in data.items():
        if not isinstance(by_dtype, dict) or not all(isinstance(e, dict) for e in by_dtype.values()):
            raise _damaged(path, f"{device!r} is not an object of objects by dtype")
    return data


def save_measured(peak: Peak, path: Path | None = None, measured_at: str | None = None) -> Path:
    """Add (or replace) `peak` in the cache, written whole to a temporary file then renamed
    over the old one: a crash leaves the old cache or the new one, never half of one. Two
    processes saving at once may lose one's entry, never damage the file. The cache's path."""
    path = path or cache_path()
    data = load_measured(path)
    when = measured_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data.setdefault(peak.device, {})[peak.dtype] = {
        "flops_per_s": peak.flops_per_s,
        "source": peak.source,
        "measured_at": when,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".peaks.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(temporary, 0o644)  # as an ordinary file would be (mkstemp's is 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=2, sort_keys=True)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
