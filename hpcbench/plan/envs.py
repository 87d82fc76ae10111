"""Named Python environments that points run in (the spec's `env` field).

Each framework stack has its own environment, built by `envs/build.sh NAME` from the
pinned `envs/NAME.txt` into `ENVS_DIR/NAME`: `modern` (PyTorch + TensorFlow + Horovod) and
`legacy` (MXNet 1.9 + numpy 1.23 + Horovod), which cannot share one interpreter, and `cntk`
(the rank's interpreter with CNTK 2.7's Python 3.6 beside it: envs/build-cntk.sh), and `caffe`
(a Debian 11 root filesystem with pycaffe, entered by its `bin/python`: envs/build-caffe.sh). ENVS_DIR
is `$HPCBENCH_ENVS_DIR`; else `.envs/` of the source checkout hpcbench runs from (where
envs/build.sh puts them); else, for an installed package, the user's data directory
(`$XDG_DATA_HOME/hpcbench/envs`, default `~/.local/share/hpcbench/envs`). A point without
`env` runs in the interpreter that runs the sweep.

envs/build.sh is part of the source, not of the installed package: an installed hpcbench
names the command to run in a checkout, with HPCBENCH_ENVS_DIR set to where it looks
(`build_command`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpcbench.errors import HpcbenchError

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the hpcbench package (a checkout: its root)
NAMES = ("modern", "legacy", "cntk", "caffe")


def envs_dir() -> Path:
    if os.environ.get("HPCBENCH_ENVS_DIR"):
        return Path(os.environ["HPCBENCH_ENVS_DIR"])
    if in_checkout():
        return ROOT / ".envs"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "hpcbench" / "envs"


def in_checkout() -> bool:
    """True when hpcbench runs from a source checkout (envs/build.sh beside the package)."""
    return (ROOT / "envs" / "build.sh").is_file()


def build_command(name: str) -> str:
    """The command that builds environment `name` where envs_dir() will find it."""
    if in_checkout():
        return f"bash envs/build.sh {name}"
    return f"HPCBENCH_ENVS_DIR={shlex.quote(str(envs_dir()))} bash envs/build.sh {name} (in a source checkout)"


def python(name: str | None) -> Path:
    """The interpreter of environment `name` (None: the current one). Raises if not built."""
    if name is None:
        return Path(sys.executable)
    if name not in NAMES:
        raise HpcbenchError(f"unknown environment {name!r}; known: {', '.join(NAMES)}")
    exe = envs_dir() / name / "bin" / "python"
    if not exe.exists():
        raise HpcbenchError(f"environment {name!r} is not built ({exe} missing): {build_command(name)}")
    return exe


_FIND = """
import importlib.util, json, sys
missing = []
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        missing.append(name)
print(json.dumps(missing))
"""


def missing_modules(name: str | None, modules: Sequence[str]) -> list[str]:
    """Which of `modules` environment `name` cannot find (without importing them: the
    frameworks take seconds to import). Raises if the environment is not built."""
    exe = python(name)
    if not modules:
        return []
    proc = subprocess.run([str(exe), "-c", _FIND, *modules], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise HpcbenchError(f"environment {name or 'current'!r} ({exe}) does not start: {proc.stderr.strip()[-300:]}")
    missing: list[str] = json.loads(proc.stdout)
    return missing
