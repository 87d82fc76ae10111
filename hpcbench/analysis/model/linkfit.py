"""Link calibration from commbench files (format: hpcbench.store.commfile): their rows as a
table, where their ranks ran, and the link α, β of each network level.

A file's placement comes from its `hostnames` (one per rank): `nodes` distinct hosts and
`ranks_per_node` ranks on each. A file whose ranks all share one node measures the
intra-node level; a file with one rank per node on two or more nodes measures the network
(inter-node). A file with several ranks on each of several nodes mixes the two and is left
out of both (named in the fit's notes).

Per level, the link α, β are fitted by least squares over every size and rank count of that
level's files, each row costed as the all-reduce that ran it: a ring, t = 2(p−1)α +
2n(p−1)/p·β, or, where the file names the MPI library its MPI all-reduce ran on (attributes
`mpi`, `mpi_environment`), the algorithm that library picks for that size and rank count,
t = a·α + b·n·β (mpi_rules.py). β is only trusted when the
data can tell it from noise: the times must grow with the message size by clearly more than
they scatter about the fitted line (β at least `MIN_T` standard errors above zero). When every
size costs about the same (a loaded machine, sizes too small for the link), the fit says so
and is refused rather than returned as a link of infinite bandwidth.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import h5py
import numpy as np
import pandas as pd

from hpcbench.analysis.model import mpi_rules
from hpcbench.analysis.model.collectives import LinkCost
from hpcbench.errors import HpcbenchError
from hpcbench.store import commfile

Level = Literal["intra", "inter"]
LEVELS: tuple[Level, ...] = ("intra", "inter")
MIN_T = 3.0  # β / SE(β) below this: the bandwidth term is not told from noise


class CalibrationError(HpcbenchError):
    """Commbench files that cannot give a link (no all-reduce, β lost in noise, ...)."""


@dataclass(frozen=True)
class Placement:
    """Where a commbench run's ranks ran."""

    ranks: int
    nodes: int
    ranks_per_node: int  # the most ranks on one node

    @property
    def level(self) -> Level | None:
        """intra: all ranks on one node; inter: one rank per node on >= 2 nodes; None: mixed."""
        if self.ranks < 2:
            return None
        if self.nodes == 1:
            return "intra"
        return "inter" if self.ranks_per_node == 1 else None

    def __str__(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''} × {self.ranks_per_node} ranks per node"


@dataclass(frozen=True)
class LinkFit:
    """A level's fitted link and what it was fitted on."""

    level: Level
    link: LinkCost
    files: tuple[Path, ...]
    rows: int
    beta_t: float  # β over its standard error (inf on a perfect fit)
    notes: tuple[str, ...] = field(default=())
    costed_as: tuple[str, ...] = field(default=())  # each file's all-reduce as the fit costed it (`costed_as`)

    def describe(self) -> str:
        """One line: the level's α, β, what they were fitted on and how each file's all-reduce
        was costed, then the files left out."""
        rate = f"{8 / self.link.beta / 1e9:.3g} Gbit/s" if self.link.beta > 0 else "no bandwidth term"
        names = ", ".join(path.name for path in self.files)
        ways = "; ".join(sorted(set(self.costed_as)))
        sure = f"{self.beta_t:.3g}" if self.beta_t <= 1000 else "over 1000"
        line = (f"{self.level}: α {self.link.alpha * 1e6:.3g} µs, β {rate} per hop, fitted on {names} "
                f"({self.rows} rows, β at {sure} standard errors; all-reduce costed as {ways})")  # fmt: skip
        return "; ".join((line, *self.notes))


def read_commbench(path: Path | str) -> pd.DataFrame:
    """The results rows of a commbench file, `op` as text."""
    rows = commfile.read_results(path)
    frame = pd.DataFrame({name: rows[name] for name in commfile.RESULT_DTYPE.names or ()})
    frame["op"] = frame["op"].str.decode("utf-8")
    return frame


def placement(path: Path | str) -> Placement:
    """Nodes and ranks per node of a commbench file, from the hostname each rank recorded."""
    commfile.read_results(path)  # the same checks and errors as reading the rows
    with h5py.File(path, "r") as f:
        ranks = int(f.attrs.get("ranks", 0))
        raw = f.attrs.get("hostnames")
    hosts = [h.decode() if isinstance(h, bytes) else str(h) for h in (np.atleast_1d(raw) if raw is not None else [])]
    if not hosts:
        raise CalibrationError(f"{path}: records no hostnames, so its placement is unknown")
    counts: dict[str, int] = {}
    for host in hosts:
        counts[host] = counts.get(host, 0) + 1
    return Placement(ranks or len(hosts), len(counts), max(counts.values()))


def rules(path: Path | str) -> str:
    """The all-reduce rules (mpi_rules.py) of the MPI library a commbench file's all-reduce ran
    on, as the file records it (attributes `mpi`, the library's version, and `mpi_environment`,
    which commbench writes where its collectives were MPI's); "" (a ring) for a file that names
    no library, or one whose rules are unknown."""
    with h5py.File(path, "r") as f:
        version, raw = f.attrs.get("mpi", ""), f.attrs.get("mpi_environment", "{}")
    if not version:
        return ""
    try:
        environment = json.loads(raw)
    except (TypeError, ValueError):
        environment = {}
    return mpi_rules.library(version, environment)


def costed_as(path: Path | str) -> str:
    """How the fit costs a commbench file's all-reduce: its MPI library's algorithm per size
    (`rules`), a forced algorithm, or a ring (what the file's collective library ran is not
    recorded beyond an MPI library's name and settings, so a ring is taken)."""
    chosen = rules(path)
    if chosen.startswith(mpi_rules.FORCED):
        return f"{chosen[len(mpi_rules.FORCED) :]} (forced by the file's MPI settings)"
    if chosen:
        return f"{chosen}'s algorithm for each size and rank count"
    with h5py.File(path, "r") as f:
        backend, library = str(f.attrs.get("backend", "")), str(f.attrs.get("mpi", ""))
    if library:
        return f"a ring (the file names {library.split(',')[0]}, whose algorithms are not known)"
    return f"a ring ({backend or 'backend not named'}'s all-reduce: the file records no algorithm)"


def _allreduce_rows(paths: Sequence[Path]) -> pd.DataFrame:
    frames = [read_commbench(p).assign(rules=rules(p)) for p in paths]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["op", "ranks", "rules"])
    rows = rows[(rows["op"] == "allreduce") & (rows["ranks"] >= 2)]
    if rows.empty:
        raise CalibrationError("commbench files hold no all-reduce between >= 2 ranks to fit α and β on")
    return rows


def _describe(rows: pd.DataFrame) -> str:
    by_size = rows.groupby("bytes")["time_s"].median()
    small, large = by_size.index[0], by_size.index[-1]
    return f"{_size(small)}: {by_size.iloc[0] * 1e3:.3g} ms, {_size(large)}: {by_size.iloc[-1] * 1e3:.3g} ms"


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _design(rows: pd.DataFrame) -> np.ndarray:
    """Per row, [α steps, bytes sent] of the all-reduce its library ran for its size and rank
    count (mpi_rules.design; a ring where `rules` is "" or absent)."""
    names = rows["rules"].astype(str).to_numpy() if "rules" in rows else np.full(len(rows), "")
    m, p = rows["bytes"].to_numpy(dtype=float), rows["ranks"].to_numpy(dtype=int)
    x = np.zeros((len(rows), 2))
    for name in np.unique(names):
        mine = names == name
        x[mine] = mpi_rules.design(str(name), m[mine], p[mine])
    return x


def fit_link(rows: pd.DataFrame, what: str = "commbench files") -> tuple[LinkCost, float]:
    """(link, β's t-value) fitted on all-reduce rows with `ranks`, `bytes`, `time_s` (and the
    `rules` each ran under: a ring, or its MPI library's algorithm for that size); refuses
    (CalibrationError, with the reason) when β cannot be told from noise."""
    m = rows["bytes"].to_numpy(dtype=float)
    t = rows["time_s"].to_numpy(dtype=float)
    x = _design(rows)
    if np.linalg.matrix_rank(x) < 2:
        raise CalibrationError(f"{what}: one message size only ({_size(m[0])}): α and β cannot be told apart; "
                               "measure several sizes (--sizes 4K,1M,16M)")  # fmt: skip
    (alpha, beta), *_ = np.linalg.lstsq(x, t, rcond=None)
    dof = len(t) - 2
    residual = t - x @ np.array([alpha, beta])
    if dof > 0:
        sigma2 = float(residual @ residual) / dof
        cov = sigma2 * np.linalg.inv(x.T @ x)
        se = math.sqrt(max(float(cov[1, 1]), 0.0))
        beta_t = float(beta) / se if se > 0 else (math.inf if beta > 0 else 0.0)
    else:  # two points: a line through both, no scatter to judge it by
        beta_t = math.inf if beta > 0 else 0.0
    if not (beta > 0 and beta_t >= MIN_T):
        raise CalibrationError(
            f"{what}: the all-reduce time does not grow with message size beyond its scatter "
            f"({_describe(rows)}; β = {beta:.3g} s/B at {beta_t:.2g} standard errors, needs >= {MIN_T:g}): "
            "bandwidth cannot be told from noise; measure larger sizes, more --iters, or on an idle machine"
        )
    if alpha < 0:  # latency below resolution: the line through the origin, β refitted alone
        alpha = 0.0
        beta = float(x[:, 1] @ t) / float(x[:, 1] @ x[:, 1])
    return LinkCost(float(alpha), float(beta)), beta_t


def link_from_commbench(paths: Sequence[Path]) -> LinkCost:
    """The link α, β fitted on the all-reduce rows of commbench files (any rank counts and
    placements: one link for the whole machine)."""
    return fit_link(_allreduce_rows(paths))[0]


def levels_from_commbench(paths: Sequence[Path | str]) -> dict[Level, LinkFit]:
    """A link per network level found among the files: intra from the files with all ranks on
    one node, inter from those with one rank per node. Levels no file measures are absent."""
    by_level: dict[Level, list[Path]] = {"intra": [], "inter": []}
    notes = []
    for raw in paths:
        path = Path(raw)
        where = placement(path)
        if where.level is None:
            why = "one rank" if where.ranks < 2 else "mixes both levels"
            notes.append(f"{path.name}: {where} ({why}): not used")
        else:
            by_level[where.level].append(path)
    if not by_level["intra"] and not by_level["inter"]:
        detail = "; ".join(notes) or "no files"
        raise CalibrationError(
            f"commbench files measure neither all ranks on one node nor one rank per node ({detail})"
        )
    fits: dict[Level, LinkFit] = {}
    for level in LEVELS:
        files = by_level[level]
        if files:
            rows = _allreduce_rows(files)
            link, beta_t = fit_link(rows, f"{level}-node commbench files ({', '.join(p.name for p in files)})")
            ways = tuple(costed_as(path) for path in files)
            fits[level] = LinkFit(level, link, tuple(files), len(rows), beta_t, tuple(notes), ways)
    return fits
