"""The out_of_memory result: a point whose rank ran out of memory, recorded as such.

The rank that ran out says where and how much it reached (rank/memory.py); its peers, blocked
in a collective with it, end with the job. The executor then marks the point file
`out_of_memory` with the `oom_*` attributes (schema.OOM_ATTRS), as it marks a crashed one
`failed` (status.py). Where the ranks ran out before they created the file (building the
model, loading its data), the executor writes one with no rows: the point, the status and the
attributes, so that the analysis lists it as every other result.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import hpcbench
from hpcbench.rank.memory import OutOfMemory
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.status import creating
from hpcbench.store.writer import FileMeta, attr_value, write_rowless

NO_FILE = "the executor: the ranks ran out of memory before they created the point file"


def attrs_of(oom: OutOfMemory) -> dict[str, Any]:
    """The `oom_*` attributes (schema.OOM_ATTRS) of what the rank said."""
    return {f"oom_{key}": value for key, value in asdict(oom).items()}


def mark_out_of_memory(path: Path, oom: OutOfMemory, point: Point | None = None, sweep: str = "") -> bool:
    """Record the point of `path` out of memory: its file marked, or, where the ranks left
    none and `point` is given, a file with no rows written. False where no file is left."""
    creating(path).unlink(missing_ok=True)
    attrs = {**attrs_of(oom), "status": schema.STATUS_OOM}
    if path.exists():
        try:
            with h5py.File(path, "r+") as f:
                f.attrs.update({k: attr_value(v) for k, v in attrs.items()})
        except OSError:
            return False
        return True
    if point is None:
        return False
    point_attrs = {k: v for k, v in point.as_dict().items() if v is not None and v != {}}
    point_attrs.update(id=point.id, json=point.to_json(), ranks=point.ranks)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    root = {"hpcbench_version": hpcbench.__version__, "created": created, "sweep": sweep, "spec": "", "epoch_ns": 0}
    write_rowless(path, FileMeta(root=root, point=point_attrs, provenance={"recorded_by": NO_FILE}), point.ranks, attrs)
    return True


def out_of_memory(path: Path) -> OutOfMemory | None:
    """What an out_of_memory result file says of it; None for any other file, or none."""
    try:
        with h5py.File(path, "r") as f:
            if str(f.attrs.get("status", "")) != schema.STATUS_OOM:
                return None
            facts: dict[str, Any] = {k: f.attrs[f"oom_{k}"] for k in OutOfMemory.__dataclass_fields__}
    except (OSError, KeyError):
        return None
    return OutOfMemory(**{k: v.item() if isinstance(v, np.generic) else v for k, v in facts.items()})
