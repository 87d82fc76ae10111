"""The executor contract: run a sweep's launches and keep the manifest true."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, TextIO

from hpcbench.manifest import Manifest
from hpcbench.plan import Launch
from hpcbench.registry import Registry
from hpcbench.spec import Options


class Executor(ABC):
    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    local: ClassVar[bool]  # every rank on this host

    def __init__(self, manifest: Manifest, options: Options, out: TextIO, verbose: bool = False) -> None:
        self.manifest = manifest
        self.options = options
        self.out = out
        self.verbose = verbose

    @abstractmethod
    def run(self, launches: Sequence[Launch]) -> None:
        """Run (or submit) the launches, recording each point's state in the manifest."""


EXECUTORS: Registry[type[Executor]] = Registry("executor", "hpcbench.executors")
