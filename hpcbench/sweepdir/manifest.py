"""The sweep directory's bookkeeping: which points exist and what became of each
(SWEEP_DIR/manifest.json, rewritten atomically after every change; the directory's other
files are named in layout.py)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point, labels
from hpcbench.sweepdir.atomic import write_text_atomic
from hpcbench.sweepdir.layout import SweepDir

PENDING, QUEUED, RUNNING, DONE, FAILED = "pending", "queued", "running", "done", "failed"
STOPPED = "stopped"  # told to stop (cancelled, requeued, preempted, time limit): rows kept, resumable
OUT_OF_MEMORY = "out of memory"  # a rank ran out of memory: a result (the point file's out_of_memory), not rerun
STATES = (PENDING, QUEUED, RUNNING, DONE, OUT_OF_MEMORY, FAILED, STOPPED)
ACTIVE = (QUEUED, RUNNING)  # handed to a scheduler and not finished
ENDED = (DONE, OUT_OF_MEMORY, FAILED, STOPPED)  # nothing more will happen to them without a resume
MANIFEST_VERSION = 1
POINT_ID = re.compile(r"[0-9a-f]{12}")  # what spec.point_id makes; names files, so nothing else


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Entry:
    id: str
    label: str
    point: dict[str, object]
    state: str = PENDING
    attempts: int = 0
    reason: str = ""
    job_id: str = ""
    log: str = ""  # the latest attempt's log, relative to the sweep directory or absolute
    started: str = ""
    ended: str = ""

    def __post_init__(self) -> None:
        self.log = self.log or SweepDir.log_name(self.id)

    @property
    def result(self) -> str:
        return SweepDir.result_name(self.id)


@dataclass
class Manifest:
    directory: Path
    name: str
    executor: str
    entries: dict[str, Entry] = field(default_factory=dict)
    _added: bool = field(default=False, repr=False, compare=False)  # entries added since the labels were made

    FILE = SweepDir.MANIFEST

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / cls.FILE
        if not directory.is_dir():
            what = "not a directory" if directory.exists() else "no such directory"
            raise HpcbenchError(f"{directory}: not a sweep directory ({what})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise HpcbenchError(f"{directory}: not a sweep directory (no {cls.FILE})") from None
        except OSError as exc:  # a folder by that name, no permission, ...
            raise HpcbenchError(f"{path}: cannot be read ({exc.strerror})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HpcbenchError(f"{path}: unreadable manifest ({exc})") from None
        if not isinstance(data, dict):
            raise HpcbenchError(f"{path}: unreadable manifest (not a JSON object)")
        if data.get("version") != MANIFEST_VERSION:
            raise HpcbenchError(f"{path}: manifest version {data.get('version')} is not {MANIFEST_VERSION}")
        try:
            entries = {e["id"]: Entry(**e) for e in data["entries"]}
            bad = [i for i in entries if not isinstance(i, str) or not POINT_ID.fullmatch(i)]
            if bad:
                raise HpcbenchError(f"{path}: unreadable manifest (point ids {bad[:3]} are not 12 hex digits)")
            manifest = cls(directory, data["name"], data["executor"], entries)
        except (KeyError, TypeError) as exc:
            raise HpcbenchError(f"{path}: unreadable manifest ({type(exc).__name__}: {exc})") from None
        manifest.relabel()  # a manifest written before labels told points apart
        return manifest

    @classmethod
    def open(cls, directory: Path, name: str, executor: str) -> Manifest:
        """The directory's manifest, or a new one if there is none yet."""
        if (directory / cls.FILE).exists():
            manifest = cls.load(directory)
            manifest.name, manifest.executor = name, executor
            return manifest
        return cls(directory, name, executor)

    def add(self, point: Point) -> Entry:
        entry = self.entries.get(point.id)
        if entry is None:
            entry = self.entries[point.id] = Entry(point.id, point.label(), point.as_dict())
            self._added = True
        return entry

    def relabel(self) -> None:
        """Labels that tell the entries apart (`status`, `run`): Point.label(), and where points
        share it the fields in which they differ (hpcbench.spec.labels). An entry whose point
        cannot be read back keeps its label."""
        points = []
        for entry in self.entries.values():
            try:
                points.append(Point.from_dict(entry.point))
            except (HpcbenchError, TypeError, ValueError):
                continue
        found = labels(points)
        for entry in self.entries.values():
            entry.label = found.get(entry.id, entry.label)
        self._added = False

    def save(self) -> None:
        if self._added:
            self.relabel()
        data = {
            "version": MANIFEST_VERSION,
            "name": self.name,
            "executor": self.executor,
            "entries": [dataclasses.asdict(e) for e in self.entries.values()],
        }
        write_text_atomic(self.directory / self.FILE, json.dumps(data, indent=1))

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for e in self.entries.values():
            out[e.state] += 1
        return out
