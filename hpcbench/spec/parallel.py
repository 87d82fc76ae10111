"""How a point splits its model and data over its ranks: the `parallel:` field.

A point without `parallel` is plain data parallelism: every rank holds the whole model and
all-reduces its gradients. With it, the ranks form a mesh of four named axes, outermost
first (as torchtitan orders them)::

    pp     pipeline stages: each holds a contiguous slice of the layers
    dp     replicas: the same (sharded) model, different data, gradients all-reduced
    fsdp   shards: parameters, gradients and optimizer state split over this many ranks
           (ZeRO), different data; with dp > 1 too, hybrid sharding (HSDP)
    tp     tensor parallel: each layer's matrices split over this many ranks, same data

Rank r's coordinates are r's digits in that mixed radix, tp varying fastest, so a
tensor-parallel group is consecutive ranks (on one node when tp divides ranks per node).
The product pp * dp * fsdp * tp is the point's ranks; `dp` may be left out (it is what
remains). `batch_size` is per data-parallel rank (dp * fsdp of them): tensor- and
pipeline-parallel peers share their batch.

Ground floor: imports nothing of hpcbench but the error types.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hpcbench.errors import SpecError

AXES = ("pp", "dp", "fsdp", "tp")  # the mesh's axes, outermost first
SCHEDULES = ("gpipe", "1f1b")  # pipeline schedules
ZERO_STAGES = (2, 3)  # what fsdp shards: 2 gradients and optimizer state, 3 parameters too
KEYS = (*AXES, "zero", "microbatches", "schedule")
MAX_DEGREE = 2**20


@dataclass(frozen=True)
class Layout:
    """A point's parallel layout (all degrees 1: plain data parallelism over `dp` ranks)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 3  # with fsdp > 1: 3 shards parameters too (re-gathered in backward), 2 keeps them after forward
    microbatches: int = 1  # per iteration, through the pipeline
    schedule: str = "1f1b"

    @property
    def ranks(self) -> int:
        return self.pp * self.dp * self.fsdp * self.tp

    @property
    def data_ranks(self) -> int:
        """Ranks that read different data: dp * fsdp."""
        return self.dp * self.fsdp

    @property
    def plain(self) -> bool:
        """Plain data parallelism: no sharding, tensor or pipeline split."""
        return self.fsdp == 1 and self.tp == 1 and self.pp == 1

    def degree(self, axis: str) -> int:
        return int(getattr(self, axis))

    def coords(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s index on every axis."""
        out: dict[str, int] = {}
        for axis in reversed(AXES):
            rank, out[axis] = divmod(rank, self.degree(axis))
        return out

    def rank_of(self, coords: Mapping[str, int]) -> int:
        rank = 0
        for axis in AXES:
            rank = rank * self.degree(axis) + coords.get(axis, 0)
        return rank

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `axis` (itself included), in axis order."""
        here = self.coords(rank)
        return tuple(self.rank_of({**here, axis: i}) for i in range(self.degree(axis)))

    def groups(self, axis: str) -> Iterator[tuple[int, ...]]:
        """Every group along `axis`, each once, in the order of their first rank."""
        seen: set[int] = set()
        for rank in range(self.ranks):
            if rank not in seen:
                group = self.group(rank, axis)
                seen.update(group)
                yield group

    def data_rank(self, rank: int) -> int:
        """Which of the `data_ranks` shards of the data `rank` reads."""
        here = self.coords(rank)
        return here["dp"] * self.fsdp + here["fsdp"]

    def as_items(self) -> tuple[tuple[str, Any], ...]:
        """The point's frozen form: the keys that differ from the defaults, `dp` always."""
        default = Layout()
        items = {"dp": self.dp}
        for key in KEYS:
            value = getattr(self, key)
            if key != "dp" and value != getattr(default, key):
                items[key] = value
        return tuple(sorted(items.items()))

    def label(self) -> str:
        """e.g. `dp2 tp2`, `fsdp4 zero2`, `pp2 mb4 1f1b`."""
        parts = [f"{axis}{self.degree(axis)}" for axis in AXES if self.degree(axis) > 1]
        if self.fsdp > 1 and self.zero != 3:
            parts.append(f"zero{self.zero}")
        if self.pp > 1:
            parts += [f"mb{self.microbatches}", self.schedule]
        return " ".join(parts) or "dp1"


def _degree(path: str, value: Any) -> int:
    allowed = f"integers >= 1 and <= {MAX_DEGREE}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"{value!r} is not an integer", allowed)
    if not 1 <= value <= MAX_DEGREE:
        raise SpecError(path, f"{value} is out of range", allowed)
    return value


def parse(path: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """The `parallel` field's checker: a mapping of the keys above, checked one by one (the
    product against the ranks is `check`'s, once the point exists)."""
    if not isinstance(value, Mapping):
        raise SpecError(path, f"{value!r} is not a mapping", f"a mapping of {', '.join(KEYS)}")
    if not value:
        return ()
    out: dict[str, Any] = {}
    for key, v in value.items():
        where = f"{path}.{key}"
        if key not in KEYS:
            raise SpecError(where, "unknown key", ", ".join(KEYS))
        if key == "schedule":
            if v not in SCHEDULES:
                raise SpecError(where, f"{v!r} is not a pipeline schedule", ", ".join(SCHEDULES))
            out[key] = v
        elif key == "zero":
            if isinstance(v, bool) or v not in ZERO_STAGES:
                raise SpecError(
                    where,
                    f"{v!r} is not a ZeRO stage fsdp runs",
                    "2 (gradients and optimizer state), 3 (parameters too)",
                )
            out[key] = v
        else:
            out[key] = _degree(where, v)
    return tuple(sorted(out.items()))


def layout_of(items: tuple[tuple[str, Any], ...], ranks: int) -> Layout:
    """The layout of a point's `parallel` items on `ranks` ranks (`dp` filled in when left
    out; a product that does not divide is `check`'s to refuse, here dp is then 0)."""
    values = dict(items)
    split = values.get("fsdp", 1) * values.get("tp", 1) * values.get("pp", 1)
    dp = values.get("dp", ranks // split if ranks % split == 0 else 0)
    pp = values.get("pp", 1)
    return Layout(
        dp=dp,
        fsdp=values.get("fsdp", 1),
        tp=values.get("tp", 1),
        pp=pp,
        zero=values.get("zero", 3),
        microbatches=values.get("microbatches", pp),
        schedule=values.get("schedule", "1f1b"),
    )


def check(items: tuple[tuple[str, Any], ...], ranks: int, batch_size: int) -> Iterator[tuple[str, str, str]]:
    """The layout's problems on a point of `ranks` ranks: (field, what is wrong, allowed)."""
    if not items:
        return
    values = dict(items)
    layout = layout_of(items, ranks)
    named = [axis for axis in AXES if axis in values]
    product = " * ".join(f"{axis} {values[axis]}" for axis in named) or "1"
    total = math.prod(values[axis] for axis in named)
    if "dp" in values and total != ranks:
        yield (
            "parallel",
            f"{product} = {total} is not the point's {ranks} ranks (nodes * ranks_per_node)",
            "degrees whose product is the ranks; leave dp out to have it fill the rest",
        )
    elif ranks % total:
        yield (
            "parallel",
            f"{product} = {total} does not divide the point's {ranks} ranks (nodes * ranks_per_node)",
            "degrees whose product divides the ranks (dp fills the rest)",
        )
    if "zero" in values and layout.fsdp == 1:
        yield "parallel.zero", "is set but nothing is sharded (fsdp is 1)", "zero with fsdp > 1"
    if layout.pp == 1 and ("microbatches" in values or "schedule" in values):
        yield "parallel.microbatches", "microbatches and schedule are the pipeline's: pp is 1", "them with pp > 1"
    if layout.pp > 1 and batch_size % layout.microbatches:
        yield (
            "parallel.microbatches",
            f"{layout.microbatches} micro-batches do not divide batch_size {batch_size}",
            "a divisor of batch_size",
        )
