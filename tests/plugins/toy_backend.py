"""A toy framework whose two backends live outside hpcbench: a plugin module named in
$HPCBENCH_PLUGINS.

Both backends run the synthetic workload's exchange (blocking MPI all-reduces once backward
has ended), and differ only in what they declare of it: `ring` says nothing beyond the
defaults (the model may overlap its messages with backward), `mpi` declares an MPI_Allreduce
exchange (`mpi_exchange`: served after backward, no overlap). Nothing in hpcbench names
them: that the model predicts them differently shows that a backend's traits are its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from hpcbench.frameworks.base import FRAMEWORKS, LauncherNeed
from hpcbench.frameworks.synthetic import SyntheticFramework
from hpcbench.store.traits import Traits


@FRAMEWORKS.register
class ToyFramework(SyntheticFramework):
    name = "toyfw"
    backends = ("ring", "mpi")
    traits: ClassVar[Mapping[str, Traits]] = {"ring": Traits(), "mpi": Traits(mpi_exchange=True)}
    launcher_needs: ClassVar[Mapping[str, LauncherNeed]] = {}
