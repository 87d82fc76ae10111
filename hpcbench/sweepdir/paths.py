"""Paths inside a sweep directory, refused when they would lead out of it.

Everything hpcbench writes for a sweep (results, logs, run files, manifest, summaries,
Slurm scripts) goes under the sweep directory. A name with `..`, an absolute name, or a
symlink in the way (a `logs` link to /etc, a result file linked to someone's data) would
make a run write elsewhere; `inside` refuses those before anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

from hpcbench.errors import HpcbenchError


def inside(directory: Path, relative: str | PurePath) -> Path:
    """`directory / relative`, checked to stay inside `directory` after following symlinks."""
    rel = PurePath(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise HpcbenchError(f"{str(relative)!r}: not a plain path inside the sweep directory {directory}; refused")
    path = directory / rel
    root = os.path.realpath(directory)
    real = os.path.realpath(path)  # follows every symlink on the way, dangling ones too
    if os.path.commonpath([root, real]) != root:
        raise HpcbenchError(f"{path} leads out of the sweep directory (a symlink to {real}); refused")
    return path
