"""`SweepDir`: every path and name in a sweep directory, in one place.

::

    SWEEP_DIR/manifest.json          the points and what became of each (manifest.py)
    SWEEP_DIR/spec.yaml              the spec as last submitted
    SWEEP_DIR/points/<id>.json       run files: the worker's one argument (runfile.py)
    SWEEP_DIR/logs/<id>.log          launcher output of every attempt, appended
    SWEEP_DIR/<id>.h5                the point's result, written by all its ranks
    SWEEP_DIR/<id>.attempt<N>.h5     an earlier, incomplete attempt, kept aside (never deleted)
    SWEEP_DIR/<id>.h5.new            the point's file being made (store.status.creating)
    SWEEP_DIR/<executor>/            what an executor keeps (Slurm: scripts and job logs)
    SWEEP_DIR/summary.csv, report.*  what the analysis writes

Every path is checked to stay inside the directory (paths.inside): a symlink or a name
that would lead out of it is refused before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpcbench.sweepdir.paths import inside

RESULT_SUFFIX = ".h5"
_ATTEMPT = re.compile(r"\.attempt(\d+)$")


@dataclass(frozen=True)
class SweepDir:
    root: Path

    MANIFEST = "manifest.json"
    SPEC = "spec.yaml"

    @classmethod
    def of_run_file(cls, run_file: Path) -> SweepDir:
        """The sweep directory a run file (SWEEP_DIR/points/<id>.json) belongs to."""
        return cls(run_file.parent.parent)

    @property
    def manifest(self) -> Path:
        return inside(self.root, self.MANIFEST)

    @property
    def spec(self) -> Path:
        return inside(self.root, self.SPEC)

    @staticmethod
    def run_file_name(point_id: str) -> str:
        """The run file of a point, relative to the sweep directory."""
        return f"points/{point_id}.json"

    def run_file(self, point_id: str) -> Path:
        return inside(self.root, self.run_file_name(point_id))

    @staticmethod
    def log_name(point_id: str) -> str:
        """The log of a point, relative to the sweep directory (as the manifest records it)."""
        return f"logs/{point_id}.log"

    def log(self, point_id: str) -> Path:
        return inside(self.root, self.log_name(point_id))

    @staticmethod
    def result_name(point_id: str) -> str:
        return f"{point_id}{RESULT_SUFFIX}"

    def result(self, point_id: str) -> Path:
        return inside(self.root, self.result_name(point_id))

    def executor_dir(self, name: str) -> Path:
        """The folder an executor keeps its own files in (its name)."""
        return inside(self.root, name)

    def check_inside(self, point_ids: Iterable[str], executor: str | None = None) -> None:
        """Refuse (HpcbenchError), before anything is written, a name the sweep would write for
        these points that leads out of the directory (a `logs` or `points` link to elsewhere):
        the manifest, the spec, each point's run file, log and result, and the executor's folder."""
        names = [self.MANIFEST, self.SPEC]
        for point_id in point_ids:
            names += [self.run_file_name(point_id), self.log_name(point_id), self.result_name(point_id)]
        if executor is not None:
            names.append(executor)
        for name in names:
            inside(self.root, name)

    def results(self) -> list[Path]:
        """The point files in the directory, earlier attempts left out."""
        return sorted(p for p in self.root.glob(f"*{RESULT_SUFFIX}") if not is_attempt(p))


def is_attempt(path: Path) -> bool:
    """Whether `path` is an earlier attempt kept aside (`<id>.attempt<N>.h5`)."""
    return _ATTEMPT.search(path.stem) is not None


def keep_aside(result: Path) -> Path | None:
    """Move an incomplete earlier result out of the way as the next `<id>.attempt<N>.h5`,
    never deleting it; None if there is none."""
    if not result.exists():
        return None
    n = 1
    while (aside := result.with_name(f"{result.stem}.attempt{n}{result.suffix}")).exists():
        n += 1
    result.rename(aside)
    return aside
