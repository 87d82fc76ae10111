"""Link calibration from commbench files (format: hpcbench.store.commfile): their rows as a
table, and the ring all-reduce α, β fitted on them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hpcbench.analysis.collectives import LinkCost
from hpcbench.analysis.fit import fit_ring_link
from hpcbench.errors import HpcbenchError
from hpcbench.store import commfile


def read_commbench(path: Path | str) -> pd.DataFrame:
    """The results rows of a commbench file, `op` as text."""
    rows = commfile.read_results(path)
    frame = pd.DataFrame({name: rows[name] for name in commfile.RESULT_DTYPE.names or ()})
    frame["op"] = frame["op"].str.decode("utf-8")
    return frame


def link_from_commbench(paths: list[Path]) -> LinkCost:
    """The ring all-reduce link α, β fitted on the all-reduce rows of commbench files (any rank counts)."""
    frames = [read_commbench(p) for p in paths]
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows["op"] == "allreduce"]
    if rows.empty or (rows["ranks"] < 2).all():
        raise HpcbenchError("commbench files hold no all-reduce between >= 2 ranks to fit α and β on")
    return fit_ring_link(rows["ranks"].to_numpy(), rows["bytes"].to_numpy(), rows["time_s"].to_numpy())
