"""The state of a point's result file, as the executors and the worker see it."""

from __future__ import annotations

from pathlib import Path

import h5py

from hpcbench.store import schema

CREATING_SUFFIX = ".new"


def creating(path: Path) -> Path:
    """Where the point file for `path` is made (store.writer), until its layout is on disk."""
    return path.with_name(path.name + CREATING_SUFFIX)


def result_status(path: Path) -> str | None:
    """The status attribute of a result file; None if there is no readable file."""
    try:
        with h5py.File(path, "r") as f:
            return str(f.attrs.get("status", ""))
    except (OSError, KeyError):
        return None


def stop_reason(path: Path) -> str:
    """Why the ranks of a stopped result stopped (`stop_reason`), '' if not stopped or unreadable."""
    try:
        with h5py.File(path, "r") as f:
            if str(f.attrs.get("status", "")) != schema.STATUS_STOPPED:
                return ""
            return str(f.attrs.get("stop_reason", ""))
    except (OSError, KeyError):
        return ""


def mark_failed(path: Path, reason: str) -> None:
    """Record the failure in the result file too, if one was left behind, and remove a file
    the ranks were still making (`creating(path)`): it was never published, so no
    iteration was timed into it, and nothing reads it."""
    creating(path).unlink(missing_ok=True)
    try:
        with h5py.File(path, "r+") as f:
            f.attrs["status"] = schema.STATUS_FAILED
            f.attrs["failure"] = reason
    except OSError:
        pass


def final(status: str | None) -> bool:
    """A result nothing reruns: complete, or out of memory (running out again is certain)."""
    return status in (schema.STATUS_COMPLETE, schema.STATUS_OOM)


def mark_stop_reason(path: Path, reason: str) -> None:
    """Replace a stopped result's `stop_reason` with what the executor knows better (the ranks
    saw a signal; the scheduler knows it was a cancel, a requeue, a preemption)."""
    try:
        with h5py.File(path, "r+") as f:
            if str(f.attrs.get("status", "")) == schema.STATUS_STOPPED:
                f.attrs["stop_reason"] = reason
    except OSError:
        pass
