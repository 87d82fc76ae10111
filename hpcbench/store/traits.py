"""What the analysis must know of how a point's backend and launcher behave: their traits.

Each backend declares its traits on its own framework class and each launcher on its own
class (its owner); the rank writes the traits it ran with into the point file's provenance
(`traits`, a JSON object), and the analysis reads them from there. So the analysis names no
backend, framework or launcher, and a plugin backend is modelled by what it declares.

Files written before the traits were recorded (schema 7 and older) are given the traits the
built-in backends had then (`LEGACY`): the history of the file format, kept here once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

# How a backend groups its gradients into messages (analysis/model/exchange.py gives each its sizes):
Grouping = Literal["per_tensor", "one_message", "buckets", "fusion"]
GROUPINGS: tuple[Grouping, ...] = ("per_tensor", "one_message", "buckets", "fusion")


@dataclass(frozen=True)
class Traits:
    """A backend's and its launcher's behaviour, as the performance model needs it."""

    # gradients grouped into messages: one per tensor, one in all, DDP's buckets, Horovod's fusion
    grouping: Grouping = "per_tensor"
    # waiting ranks sleep until data arrives (gloo's and gRPC's event loops): the scheduler must wake them
    sleeping_wait: bool = False
    # every message's collective waits for the rank's runtime threads (JAX: a program per all-reduce)
    waits_per_message: bool = False
    # the exchange is MPI_Allreduce, progressed only inside MPI calls: served after backward, no overlap
    mpi_exchange: bool = False
    # a background thread runs the collectives and polls while the controller is MPI (Horovod)
    background_thread: bool = False
    # gradients go to parameter servers (push / pull round trips), not a ring
    parameter_server: bool = False
    # parameter servers apply each rank's gradients without waiting for the others, unless the
    # point's extra says `sync: true`
    asynchronous: bool = False
    # the launcher starts its ranks through MPI_Init (mpirun, srun): a background thread's
    # controller is MPI there
    launcher_mpi: bool = True
    # the optimizer's momentum where the optimizer has one (SGD with momentum)
    momentum: float = 0.9

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Traits:
        """Traits from a recorded mapping; keys this version does not know are ignored, absent
        ones take their defaults (a file from a newer or older writer still reads)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        grouping = values.get("grouping", "per_tensor")
        if grouping not in GROUPINGS:
            values["grouping"] = "per_tensor"
        return cls(**values)

    def with_launcher(self, *, mpi: bool) -> Traits:
        return replace(self, launcher_mpi=mpi)


# The traits the built-in backends had when files of schema 7 and older were written, keyed by
# backend name as the analysis of that time read them (it knew one meaning per name, TensorFlow's
# `ps` aside); a backend not named here had the defaults. Never extended: new backends declare
# their traits on their own class and the rank records them.
_HOROVOD = Traits(grouping="fusion", background_thread=True)
LEGACY: Mapping[str, Traits] = {
    "gloo": Traits(grouping="buckets", sleeping_wait=True),
    "nccl": Traits(grouping="buckets"),
    "mpi": Traits(mpi_exchange=True),
    "naive": Traits(mpi_exchange=True),
    "horovod": _HOROVOD,
    "multiworker": Traits(grouping="one_message", sleeping_wait=True),
    "dist_sync": Traits(parameter_server=True),
    "dist_async": Traits(parameter_server=True, asynchronous=True),
    "pmean": Traits(sleeping_wait=True, waits_per_message=True),
    "pmean_fused": Traits(grouping="one_message", sleeping_wait=True, waits_per_message=True),
    "pure_nccl": Traits(grouping="one_message"),
}
LEGACY_TENSORFLOW_PS = Traits(parameter_server=True, asynchronous=True)
LEGACY_MPI_LAUNCHERS = ("mpirun", "srun")


def legacy(framework: str, backend: str, launcher: str) -> Traits:
    """The traits a file written before they were recorded ran with."""
    tensorflow_ps = framework == "tensorflow" and backend == "ps"
    traits = LEGACY_TENSORFLOW_PS if tensorflow_ps else LEGACY.get(backend, Traits())
    return traits.with_launcher(mpi=launcher in LEGACY_MPI_LAUNCHERS)
