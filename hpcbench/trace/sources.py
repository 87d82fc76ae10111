"""What the resource sampler's sources share: the record of how each is read and of what
failed (the sampler's `sources` and `errors`), and files kept open for one read per sample."""

from __future__ import annotations

import os


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SourceLog:
    """How each source is read, or ``"absent: <reason>"``; failures counted and the last one noted."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.errors = 0
        self._described: dict[str, str] = {}  # each source's description before any error

    def set(self, name: str, description: str) -> None:
        self._described[name] = description
        self.sources[name] = description

    def note_error(self, name: str, exc: BaseException) -> None:
        self.errors += 1
        base = self._described.get(name, name)
        self.sources[name] = f"{base}; last error: {describe(exc)}"


class KeptFiles:
    """Descriptors opened once and kept until `close`: a sample reads each with one `pread`."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def open(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
