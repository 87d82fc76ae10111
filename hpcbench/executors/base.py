"""The executor contract: run a sweep's launches and keep the manifest true."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, TextIO

from hpcbench.errors import SpecError
from hpcbench.plan.launch import Launch
from hpcbench.plan.profiles import SiteProfile
from hpcbench.registry import Registry
from hpcbench.spec import OptionsParser, Sweep
from hpcbench.sweepdir.manifest import Manifest

CANCELLED = "cancelled by the user"  # `hpcbench cancel` (and scancel): the points it stops say so
INTERRUPTED = "cancelled: the sweep was interrupted"  # Ctrl-C, or SIGTERM from anything else


class Interrupted(SystemExit):
    """The sweep command told to stop (SIGTERM: `kill`, a CI timeout, `hpcbench cancel`), and
    why: the point it is running is stopped and recorded with `reason`. Its code is the
    signal's exit status (128 + signal number)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.reason = reason


class Executor(ABC):
    """Runs a sweep's launches. An executor with options owns a section of the spec named
    after it (and of site profiles): `parse_options` validates it (path, raw) -> values."""

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    local: ClassVar[bool]  # every rank on this host
    has_options: ClassVar[bool] = False

    @classmethod
    def parse_options(cls, path: str, raw: Any) -> dict[str, Any]:
        """The validated values of this executor's options section (only the keys given)."""
        raise SpecError(path, f"executor {cls.name!r} takes no options", "no such section")

    def __init__(
        self, manifest: Manifest, sweep: Sweep, profile: SiteProfile, out: TextIO, verbose: bool = False
    ) -> None:
        self.manifest = manifest
        self.sweep = sweep
        self.options = sweep.options
        self.profile = profile
        self.out = out
        self.verbose = verbose

    @abstractmethod
    def run(self, launches: Sequence[Launch]) -> None:
        """Run (or submit) the launches, recording each point's state in the manifest."""

    def dry_run(self, launches: Sequence[Launch]) -> list[Path]:
        """Files that show what would be submitted (none for executors that submit nothing)."""
        return []

    def refresh(self) -> None:  # noqa: B027 - nothing to ask where points run in the foreground
        """Bring the manifest's states up to date with the scheduler."""

    def cancel(self) -> list[str]:
        """Stop the points still queued or running; their ids. A local executor's points run in
        the sweep command that holds the directory's lock, so its `cancel` is called without
        the lock (it stops that command and waits for it); a scheduler's with it."""
        return []


EXECUTORS: Registry[type[Executor]] = Registry("executor", "hpcbench.executors")


def catalog() -> dict[str, OptionsParser | None]:
    """Every registered executor's name and options parser, as spec loading wants them."""
    return {cls.name: cls.parse_options if cls.has_options else None for cls in EXECUTORS}
