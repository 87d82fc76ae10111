"""The executor contract: run a sweep's launches and keep the manifest true."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, TextIO

from hpcbench.manifest import Manifest
from hpcbench.plan import Launch
from hpcbench.profiles import SiteProfile
from hpcbench.registry import Registry
from hpcbench.spec import Sweep


class Executor(ABC):
    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    local: ClassVar[bool]  # every rank on this host

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
        """Stop the points still queued or running; their ids."""
        return []


EXECUTORS: Registry[type[Executor]] = Registry("executor", "hpcbench.executors")
