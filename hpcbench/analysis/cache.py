"""The analysis cache: each complete point's derived tables (per_point.py) kept beside its file.

`SWEEP_DIR/.hpcbench-cache/<point file name>.npz` holds what the analysis derived from that
file alone; `sweep.npz` beside them the model's predictions and held-out check, which need
every point. An entry is used only where its key is the present one:

- the point file's identity: size, modification and change times (nanoseconds), inode and
  device; a file rewritten, replaced or touched has another, so it is read and derived again;
- the analysis code: a hash of the sources the tables come from (`code_version`), and the
  point file schema this hpcbench reads; a changed analysis derives every point again;
- what the tables were asked for (the time-to-accuracy target).

Only complete points are cached, and only when the file's identity was the same before and
after it was read (a file still being written is not). Files with no entry, a removed point's
entry (deleted), an entry that cannot be read (ignored and rewritten): all fall back to reading
the file. Entries are written to a temporary name and renamed; a sweep directory that cannot
be written is analysed without them. The sweep entry is keyed by every point's key, so a
changed, added or removed point recomputes the model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import hpcbench
from hpcbench.analysis.cache_codec import Decoder, Encoder, dumps, loads, row
from hpcbench.analysis.per_point import PointTables
from hpcbench.analysis.stragglers.find import PointStragglers
from hpcbench.spec import Point
from hpcbench.store import schema

CACHE_DIR = ".hpcbench-cache"
SWEEP_ENTRY = "sweep.npz"
FORMAT = 3  # bump when an entry's layout changes
# sources the cached tables do not come from: a change in them keeps the entries
_NOT_ANALYSIS = {"frameworks", "cli", "launchers", "executors", "testing", "trace", "report", "export"}
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile, EOFError)


@functools.cache
def code_version() -> str:
    """A hash of the package's sources the analysis derives its tables with (and FORMAT)."""
    root = Path(hpcbench.__file__).parent
    digest = hashlib.sha256(f"{FORMAT} {schema.SCHEMA_VERSION}".encode())
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_ANALYSIS and d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            path = Path(folder, name)
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def identity(path: Path) -> list[int] | None:
    """The file's size, modification and change times, inode and device; None: gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


@dataclass
class CacheStats:
    """What one analysis took from the cache: point entries used and derived again, the sweep entry."""

    hits: int = 0
    misses: int = 0
    written: int = 0
    ignored: int = 0  # entries that could not be read or had another key
    sweep_hit: bool = False


class Store:
    """The entries of one sweep directory."""

    def __init__(self, directory: Path, target_accuracy: float | None = None) -> None:
        self.directory = directory / CACHE_DIR
        self.target_accuracy = target_accuracy
        self.stats = CacheStats()
        self._writable = True

    def key(self, identity: list[int]) -> dict[str, Any]:
        return {"file": identity, "code": code_version(), "target": self.target_accuracy}

    def get(self, path: Path, identity: list[int]) -> PointTables | None:
        """The entry of the point file `path` whose identity is `identity`, None where there is none that fits."""
        entry = self._entry(path)
        if not entry.exists():
            self.stats.misses += 1
            return None
        try:
            tables = _read_point(entry, self.key(identity), path)
        except _UNREADABLE:
            tables = None
        if tables is None:
            self.stats.ignored += 1
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        return tables

    def absent(self, path: Path) -> bool:
        """Whether the point file `path` has no entry (`get` would find none)."""
        return not self._entry(path).exists()

    def put(self, identity: list[int], tables: PointTables) -> None:
        encoder = Encoder()
        meta = {"key": self.key(identity), **_encode_point(encoder, tables)}
        self._write(self._entry(tables.path), meta, encoder.arrays)

    def sweep(self, key: str) -> dict[str, pd.DataFrame] | None:
        """The sweep entry's tables where its key is `key`."""
        entry = self.directory / SWEEP_ENTRY
        try:
            with np.load(entry, allow_pickle=False) as arrays:
                meta = loads(str(arrays["meta"]))
                if meta.get("key") != key:
                    return None
                decoder = Decoder(arrays["blob"])
                frames = {str(name): decoder.frame(spec) for name, spec in meta["frames"].items()}
        except FileNotFoundError:
            return None
        except _UNREADABLE:
            self.stats.ignored += 1
            return None
        self.stats.sweep_hit = True
        return frames

    def put_sweep(self, key: str, frames: dict[str, pd.DataFrame]) -> None:
        encoder = Encoder()
        try:
            meta = {"key": key, "frames": {name: encoder.frame(frame) for name, frame in frames.items()}}
        except TypeError:  # a table the codec does not keep as it is: not cached
            return
        self._write(self.directory / SWEEP_ENTRY, meta, encoder.arrays)

    def prune(self, files: list[Path]) -> None:
        """Remove the entries of point files no longer there."""
        if not self.directory.is_dir():
            return
        kept = {self._entry(path).name for path in files} | {SWEEP_ENTRY}
        for entry in self.directory.glob("*.npz"):
            if entry.name not in kept:
                with contextlib.suppress(OSError):
                    entry.unlink()

    def _entry(self, path: Path) -> Path:
        return self.directory / f"{path.name}.npz"

    def _write(self, entry: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Write `entry` whole or not at all; a directory that cannot be written is left alone."""
        if not self._writable:
            return
        try:
            self.directory.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".tmp", dir=self.directory)
        except OSError:
            self._writable = False
            return
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # as the point files: readable by the group where they are
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.array(dumps(meta)), **arrays)  # type: ignore[arg-type]
            os.replace(tmp, entry)
            self.stats.written += 1
        except (OSError, TypeError, ValueError):
            Path(tmp).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sweep_key(keys: list[tuple[str, list[int]]], target_accuracy: float | None) -> str:
    """The sweep entry's key: every point file's name and identity, the code, the target."""
    text = dumps({"points": keys, "code": code_version(), "target": target_accuracy})
    return hashlib.sha256(text.encode()).hexdigest()


def _encode_point(encoder: Encoder, t: PointTables) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "point": t.point.to_json(),
        "point_id": t.point_id,
        "target": t.target_accuracy,
        "placement": t.placement,
        "evaluations": encoder.columns(t.evaluations),
        "collectives": None if t.collectives is None else encoder.frame(t.collectives),
    }
    for part in ("metrics", "extra", "resources", "workload", "energy", "listing"):
        meta[part] = row(getattr(t, part))
    s = t.stragglers
    if s is not None:
        meta["stragglers"] = {
            "point_id": s.point_id,
            "label": s.label,
            "t_iter_s": s.t_iter_s,
            "heat": encoder.array(s.heat),
            **{part: encoder.columns(getattr(s, part)) for part in _STRAGGLER_COLUMNS},
        }
    return meta


_STRAGGLER_COLUMNS = ("rank_columns", "row_columns", "whatif_columns", "bucket_columns")


def _read_point(entry: Path, key: dict[str, Any], path: Path) -> PointTables | None:
    with np.load(entry, allow_pickle=False) as arrays:
        meta = loads(str(arrays["meta"]))
        if meta.get("key") != loads(dumps(key)):  # compared as JSON reads it back
            return None
        d = Decoder(arrays["blob"])
        s = meta.get("stragglers")
        slow = None
        if s is not None:
            parts = {part: d.columns(s[part]) for part in _STRAGGLER_COLUMNS}
            slow = PointStragglers(s["point_id"], s["label"], heat=d.array(s["heat"]), t_iter_s=s["t_iter_s"], **parts)
        collected = meta["collectives"]
        listing = {**meta["listing"], "file": str(path)}  # where the file is now (a sweep directory moves)
        return PointTables(
            Point.from_json(meta["point"]),
            str(meta["point_id"]),
            path,
            meta["target"],
            meta["metrics"],
            meta["extra"],
            meta["resources"],
            meta["workload"],
            meta["energy"],
            listing,
            str(meta["placement"]),
            d.columns(meta["evaluations"]),
            slow,
            None if collected is None else d.frame(collected),
        )
