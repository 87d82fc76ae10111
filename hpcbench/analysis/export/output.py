"""The export's output folder: nothing in it is overwritten, and nothing half-written is left.

The folder follows the output policy of every command (hpcbench.sweepdir.outputs): a new or
existing directory, never a file, a device or one of a sweep directory's own folders
(`points/`, `logs/`, ...), its missing parents made the same way. Every file is written into
a staging folder inside the output folder first; only when all are written are they moved to
their names (renames within one file system). An existing file of the same name stops the
export before anything is written, naming it (with `force`, a regular file is replaced, never
a folder, link or device). On any failure the staging folder is removed, and so is the
output folder if the export made it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from hpcbench.errors import SpecError
from hpcbench.sweepdir import outputs

OUTPUT_ARG = "-o/--output"


def check_free(out: Path, names: Iterable[str], force: bool = False, reads: Iterable[Path] = ()) -> None:
    """Refuse an output folder that is not a folder (or a new path) or is a sweep directory's
    own, or that holds any of `names` already (with `force`: any that is not a regular file).
    `reads`: what the export reads (the sweep directory)."""
    outputs.check_folder(out, option=OUTPUT_ARG, reads=reads)
    taken = sorted(name for name in names if (out / name).exists() or (out / name).is_symlink())
    if force:
        for name in taken:
            outputs.check_replaceable(OUTPUT_ARG, out / name)
        return
    if taken:
        more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
        raise SpecError(
            OUTPUT_ARG,
            f"{out / taken[0]}{more} exist already; an export never overwrites",
            "remove them, or choose another directory with -o",
        )


class Staging:
    """`with Staging(out) as stage:` write under `stage.path`, then `stage.commit(names)`."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.out = out
        self.force = force
        self._made: Path | None = None  # the first folder of `out` this export made
        self.path = out

    def __enter__(self) -> Staging:
        self._made = outputs.make_folders(OUTPUT_ARG, self.out)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=".export-", suffix=".tmp", dir=self.out))
        except OSError as exc:
            outputs.remove_made(self._made)
            raise SpecError(
                OUTPUT_ARG, f"{self.out}: cannot write there ({exc.strerror})", "a writable directory"
            ) from None
        return self

    def commit(self, names: list[str]) -> list[Path]:
        """Move the staged files to their names in the output folder; the paths."""
        check_free(self.out, names, self.force)
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
