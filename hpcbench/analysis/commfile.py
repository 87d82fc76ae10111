"""The HDF5 file `python -m hpcbench.commbench` writes, and reading it back (no MPI needed).

::

    /            attrs: kind = "hpcbench-commbench", version, ranks, hostnames, backend,
                        average (how per-rank times became one: avg | min | max | rank0),
                        iterations, warmup, created, hpcbench_version
    /results     (n_sizes,) RESULT_DTYPE, one row per collective and message size
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from hpcbench.analysis.fit import fit_ring_link
from hpcbench.analysis.model import LinkCost
from hpcbench.errors import HpcbenchError

KIND = "hpcbench-commbench"
VERSION = 1

RESULT_DTYPE = np.dtype(
    [
        ("op", "S16"),
        ("ranks", "<i4"),
        ("bytes", "<i8"),
        ("count", "<i8"),  # elements (float32)
        ("time_s", "<f8"),  # per operation, the ranks' times combined as `average` says
        ("time_min_s", "<f8"),  # fastest rank
        ("time_max_s", "<f8"),  # slowest rank
        ("algbw", "<f8"),  # bytes / time_s, bytes per second
        ("busbw", "<f8"),  # algbw times the collective's bus factor (nccl-tests)
    ]
)


def read_commbench(path: Path | str) -> pd.DataFrame:
    """The results rows of a commbench file, `op` as text."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("kind") != KIND or "results" not in f:
                raise HpcbenchError(f"{path}: not a commbench file (run python -m hpcbench.commbench -o FILE)")
            if int(f.attrs.get("version", 0)) > VERSION:
                raise HpcbenchError(f"{path}: commbench file version {f.attrs['version']} is newer than this hpcbench")
            rows = f["results"][()]
    except OSError as exc:
        raise HpcbenchError(f"{path}: not a readable HDF5 file ({exc})") from None
    frame = pd.DataFrame({name: rows[name] for name in RESULT_DTYPE.names or ()})
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
