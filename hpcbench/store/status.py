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


def keep_aside(path: Path) -> Path | None:
    """Move an incomplete earlier result out of the way, never deleting it."""
    if not path.exists():
        return None
    n = 1
    while (aside := path.with_name(f"{path.stem}.attempt{n}{path.suffix}")).exists():
        n += 1
    path.rename(aside)
    return aside


def mark_failed(path: Path, reason: str) -> None:
    """Record the failure in the result file too, if one was left behind."""
    try:
        with h5py.File(path, "r+") as f:
            f.attrs["status"] = schema.STATUS_FAILED
            f.attrs["failure"] = reason
    except OSError:
        pass
