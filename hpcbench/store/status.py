"""The state of a point's result file, as the executors and the worker see it."""

from __future__ import annotations

from pathlib import Path

import h5py

from hpcbench.store import schema


def result_status(path: Path) -> str | None:
    """The status attribute of a result file; None if there is no readable file."""
    try:
        with h5py.File(path, "r") as f:
            return str(f.attrs.get("status", ""))
    except (OSError, KeyError):
        return None


def mark_failed(path: Path, reason: str) -> None:
    """Record the failure in the result file too, if one was left behind."""
    try:
        with h5py.File(path, "r+") as f:
            f.attrs["status"] = schema.STATUS_FAILED
            f.attrs["failure"] = reason
    except OSError:
        pass
