"""What a backend needs of the launcher that starts its ranks (`LauncherNeed`), and what it
sees of a launcher class (`LauncherKind`): checked at planning (`Framework.check_launcher`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class LauncherKind(Protocol):
    """What a framework asks of a launcher class (`hpcbench.launchers.base.Launcher`, a layer
    above: it reaches the frameworks as this)."""

    @property
    def name(self) -> str: ...

    @property
    def mpi(self) -> bool:
        """Its ranks find their peers through MPI_Init."""

    @property
    def horovod(self) -> bool:
        """It is Horovod's own launcher: Horovod connects its ranks."""


@dataclass(frozen=True)
class LauncherNeed:
    """What a backend needs of the launcher that starts its ranks: ranks that find their
    peers through MPI_Init (`Launcher.mpi`), or, with `horovod`, also those of Horovod's own
    launcher (`Launcher.horovod`)."""

    why: str  # what MPI is needed for, as said in the messages
    horovod: bool = False
    field: str = "launcher"  # the point's field a refusal names

    def accepts(self, launcher: LauncherKind) -> bool:
        return launcher.mpi or (self.horovod and launcher.horovod)

    @property
    def launchers(self) -> str:
        return "an MPI launcher or Horovod's own" if self.horovod else "an MPI launcher"
