"""The export's output folder: nothing in it is overwritten, and nothing half-written is left.

Every file is written into a staging folder inside the output folder first; only when all
are written are they moved to their names (renames within one file system). An existing
file of the same name stops the export before anything is written, naming it. On any
failure the staging folder is removed, and so is the output folder if the export made it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from hpcbench.errors import SpecError

OUTPUT_ARG = "-o/--output"


def check_free(out: Path, names: Iterable[str]) -> None:
    """Refuse an output folder that holds any of `names` already (or is not a folder)."""
    if out.exists() and not out.is_dir():
        raise SpecError(OUTPUT_ARG, f"{out} exists and is not a directory", "a new directory, or one without the files")
    taken = sorted(name for name in names if (out / name).exists() or (out / name).is_symlink())
    if taken:
        more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
        raise SpecError(
            OUTPUT_ARG,
            f"{out / taken[0]}{more} exist already; an export never overwrites",
            "remove them, or choose another directory with -o",
        )


class Staging:
    """`with Staging(out) as stage:` write under `stage.path`, then `stage.commit(names)`."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._made: Path | None = None  # the first folder of `out` this export made
        self.path = out

    def __enter__(self) -> Staging:
        try:
            if not self.out.exists():
                first = self.out
                while not first.parent.exists():
                    first = first.parent
                self.out.mkdir(parents=True)
                self._made = first
            self.path = Path(tempfile.mkdtemp(prefix=".export-", suffix=".tmp", dir=self.out))
        except OSError as exc:
            raise SpecError(
                OUTPUT_ARG, f"{self.out}: cannot write there ({exc.strerror})", "a writable directory"
            ) from None
        return self

    def commit(self, names: list[str]) -> list[Path]:
        """Move the staged files to their names in the output folder; the paths."""
        check_free(self.out, names)
        done = []
        for name in names:
            target = self.out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path / name, target)
            done.append(target)
        return done

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if kind is not None and self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
