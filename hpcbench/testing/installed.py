"""hpcbench installed as a user installs it (`pip install`, not editable) from a copy of the
source, run from a folder outside any checkout: shared by the site-install test and the
Slurm test of an installed package (their fixture, `installed`, is in tests/conftest.py).

The fresh environment sees the project's .venv through a .pth line (what
`--system-site-packages` would do with an interpreter that has them) so that torch & co are
not installed again; the hpcbench it imports is its own copy, not the checkout's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from hpcbench.plan import envs

ROOT = envs.ROOT


def copy_tree(dest: Path) -> None:
    """This working tree's files (tracked and not ignored), as a user's clone would hold."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


class Installed:
    """hpcbench installed (`pip install`, not editable) from a copy of the source into a
    fresh environment, run from a folder outside any checkout."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.venv = tmp / "installed"
        self.python = self.venv / "bin" / "python"
        self.elsewhere = tmp / "elsewhere"
        self.env = {k: v for k, v in os.environ.items() if k not in ("HPCBENCH_ENVS_DIR", "PYTHONPATH")}
        self.env.pop("HPCBENCH_PROFILES", None)
        self.env["XDG_DATA_HOME"] = str(tmp / "data")

    def purelib(self) -> Path:
        found = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(found.stdout.strip())

    def run(self, *argv: str | Path, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.elsewhere,
            env={**self.env, **extra},
        )


def install(tmp: Path) -> Installed:
    """hpcbench installed from a copy of this working tree into a fresh environment in `tmp`."""
    this = Installed(tmp)
    source = this.tmp / "source"
    copy_tree(source)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(this.venv)], check=True, timeout=120)
    # the project's .venv below it (torch, numpy, pip, setuptools), as --system-site-packages would
    (this.purelib() / "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    start = time.monotonic()
    pip = [str(this.python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=600, cwd=this.tmp)
    print(f"pip install (not editable) from a copy: {time.monotonic() - start:.0f} s")
    assert done.returncode == 0, done.stderr
    this.elsewhere.mkdir()
    return this
