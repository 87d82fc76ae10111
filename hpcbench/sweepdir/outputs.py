"""Where a command may write a file of its own: one policy for every output of every command
(docs/running.md#outputs-and-exit-codes).

A command's output (`compare -o`, `trace -o`, `predict --csv`, `export -o`, the analysis'
files in a sweep directory) is checked before the command does any work:

- never a file the command reads (its inputs, compared by device and inode, so a second name
  or a hard link of an input counts too);
- never one of a sweep directory's own names (layout.py): a point file's name (`*.h5`), the
  manifest, the spec, the lock, and anything under `points/`, `logs/` or the sweep's executor
  folder. A sweep directory is a folder with a manifest, one the command reads as a sweep, or
  one that holds point files. A text output never takes a point file's name anywhere
  (hpcbench reads every `*.h5` of a folder as a point file); an HDF5 output (`commbench -o`)
  may, outside sweep directories;
- only a regular file or a new path: never a directory, a device (/dev/full), a FIFO, a socket,
  nor a symbolic link (nothing is written through a link: name the file itself);
- never an existing file, unless the command is given `--force` (or the file is the command's
  own, rewritten on every run: `analyze`'s summary.csv, `report`'s files);
- its missing parent folders are made (and removed again if the command fails), and a
  temporary file is claimed beside it, which proves the folder writable, root or not;
- written whole: into the temporary file, then renamed onto its name (a new file by a hard link
  that fails if the name was taken meanwhile); on any failure nothing is left.

A refusal is an OutputError (exit status 2) naming the option, the path and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TextIO

from hpcbench.errors import HpcbenchError
from hpcbench.store.status import CREATING_SUFFIX
from hpcbench.sweepdir.layout import RESULT_SUFFIX, SweepDir
from hpcbench.sweepdir.lock import LOCK_FILE

BAD_INPUT = 2  # the exit status of a refusal (docs/running.md#outputs-and-exit-codes)
FORCE_HINT = "--force replaces it"


class OutputError(HpcbenchError):
    """An output that may not be written, or could not be: one line naming the path and why."""

    exit_code = BAD_INPUT

    def __init__(self, option: str, path: Path | str, reason: str) -> None:
        self.option = option
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{option}: {path}: {reason}" if option else f"{path}: {reason}")


_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def _kind(mode: int) -> str:
    """What a file is, in words."""
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def is_point_file_name(name: str) -> bool:
    """A point file's name (`<id>.h5`, `<id>.attemptN.h5`, `<id>.h5.new`)."""
    return name.endswith(RESULT_SUFFIX) or name.endswith(RESULT_SUFFIX + CREATING_SUFFIX)


def _executor_folder(directory: Path) -> str | None:
    """The executor named in the sweep's manifest (its folder is the sweep's), if it can be read."""
    try:
        data = json.loads((directory / SweepDir.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("executor") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name and "/" not in name else None


def sweep_names(directory: Path) -> tuple[set[str], set[str]]:
    """The names a sweep directory keeps for itself, as layout.py and lock.py name them: files
    in its root, and folders in its root whose every file is the sweep's."""
    sweep = SweepDir(directory)
    files = {SweepDir.MANIFEST, SweepDir.SPEC, LOCK_FILE}
    folders = {Path(sweep.log_name("x")).parts[0], sweep.run_file("x").parent.name}
    executor = _executor_folder(directory)
    if executor is not None:
        folders.add(executor)
    return files, folders


def _is_commbench_file(path: Path) -> bool:
    """A file `commbench -o` wrote: HDF5 with an `*.h5` name, but no point file."""
    try:
        import h5py

        from hpcbench.store.commfile import KIND

        with h5py.File(path, "r") as f:
            return bool(f.attrs.get("kind") == KIND)
    except Exception:  # noqa: BLE001 - unreadable: counted as a point file
        return False


def _holds_point_files(directory: Path) -> bool:
    """Whether `directory` holds a point file (an `*.h5` that is not a commbench file: a folder
    of commbench files is no sweep directory, and `commbench -o` may add to or replace them)."""
    try:
        return any(p.is_file() and not _is_commbench_file(p) for p in directory.glob(f"*{RESULT_SUFFIX}"))
    except OSError:
        return False


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _sweep_owner(target: Path, sweeps: set[Path]) -> str | None:
    """Why `target` (its folder resolved) is a sweep directory's own name; None if it is not."""
    real = _real(target.parent) / target.name
    for depth, folder in enumerate(real.parents):
        is_sweep = folder in sweeps or (folder / SweepDir.MANIFEST).is_file()
        if not is_sweep and depth == 0:
            is_sweep = _holds_point_files(folder)
        if not is_sweep:
            continue
        files, folders = sweep_names(folder)
        parts = real.relative_to(folder).parts
        first = parts[0]
        if first in folders:
            where = "is" if len(parts) == 1 else "is inside"
            return f"{where} the sweep directory {folder}'s own folder {first}/"
        if depth == 0 and first in files:
            return f"is the sweep directory {folder}'s own {first}"
        if depth == 0 and is_point_file_name(first):
            return f"has a point file's name (*{RESULT_SUFFIX}) in the sweep directory {folder}"
    return None


def _input_clash(target: Path, st: os.stat_result | None, reads: Iterable[Path]) -> str | None:
    """Why `target` is a file the command reads; None if it is not."""
    if st is None:
        return None
    for source in reads:
        try:
            other = os.stat(source)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return "is an input of this command" if str(source) == str(target) else f"is an input ({source})"
    return None


def _lstat(option: str, path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder on the way is a file (ENOTDIR), cannot be searched (EACCES), ...
        raise OutputError(option, path, f"cannot be written ({exc.strerror})") from None


def check_file(
    path: Path,
    *,
    option: str,
    force: bool = False,
    reads: Iterable[Path] = (),
    own: bool = False,
    hdf5: bool = False,
) -> os.stat_result | None:
    """Refuse `path` (OutputError) where the policy above says no; its lstat, None if it is new.
    `reads`: the files and folders the command reads (a folder as a sweep directory); `own`:
    the command's own file, rewritten on every run (no --force needed); `hdf5`: the output is
    an HDF5 file (`commbench -o`), which may take an `*.h5` name outside sweep directories."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(option, path, "names a folder, not a file: name a file in it")
    st = _lstat(option, path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        hint = "name the file itself" if stat.S_ISLNK(st.st_mode) else "name a new or regular file"
        raise OutputError(option, path, f"is {_kind(st.st_mode)}, not a regular file; {hint}")
    reads = list(reads)
    clash = _input_clash(path, st, reads)
    if clash is not None:
        raise OutputError(option, path, f"{clash}; it is never overwritten")
    sweeps = {_real(p) for p in reads if p.is_dir()}
    owner = _sweep_owner(path, sweeps)
    if owner is not None:
        raise OutputError(option, path, f"{owner}, which only hpcbench run writes; choose another name")
    if is_point_file_name(path.name) and not hdf5:
        raise OutputError(
            option,
            path,
            f"has a point file's name (*{RESULT_SUFFIX}), which hpcbench reads as one; choose another name",
        )
    if st is not None and not force and not own:
        raise OutputError(option, path, f"exists already; {FORCE_HINT}, or choose another name")
    return st


def check_folder(path: Path, *, option: str, reads: Iterable[Path] = ()) -> None:
    """Refuse an output folder that is not a folder (or a new path), or is one of a sweep
    directory's own names. Links to folders are followed."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(option, path, f"cannot be written ({exc.strerror})") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputError(option, path, f"is {_kind(st.st_mode)}, not a directory; name a new or existing directory")
    if is_point_file_name(path.name):
        raise OutputError(option, path, f"has a point file's name (*{RESULT_SUFFIX}); choose another name")
    real = _real(path)
    sweeps = {_real(p) for p in reads if p.is_dir()}
    if real in sweeps or (real / SweepDir.MANIFEST).is_file():
        return  # the sweep directory itself: its own names are checked file by file
    owner = _sweep_owner(real, sweeps)
    if owner is not None:
        raise OutputError(option, path, f"{owner}, which only hpcbench run writes; choose another directory")


def check_replaceable(option: str, path: Path) -> None:
    """With --force, an existing file is replaced only if it is a regular file."""
    st = _lstat(option, path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(option, path, f"is {_kind(st.st_mode)}, not a regular file; it is never replaced")


def make_folders(option: str, folder: Path) -> Path | None:
    """Make `folder` and its missing parents; the first folder made (None if it existed)."""
    first: Path | None = None
    probe = folder
    while not probe.exists() and probe != probe.parent:
        first, probe = probe, probe.parent
    if probe.exists() and not probe.is_dir() and first is not None:
        raise OutputError(option, probe, "is not a directory, so nothing can be written under it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        remove_made(first)
        raise OutputError(option, folder, f"cannot be made ({exc.strerror})") from None
    return first


def remove_made(first: Path | None) -> None:
    """Remove the folders `make_folders` made, where they are still empty."""
    if first is None:
        return
    for folder in sorted((p for p in first.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        first.rmdir()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def probe_writable(option: str, folder: Path) -> None:
    """Refuse a folder in which no file can be made (read-only, /proc, full inodes), root or not."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hpcbench-probe.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(option, folder, f"cannot be written ({exc.strerror})") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


class OutputFile:
    """One output file, claimed before the work and written whole after it::

        with OutputFile(path, option="-o/--output", force=args.force, reads=[a, b]) as output:
            text = ...                  # the work
            output.write_text(text)     # or: with output.open() as f: ...

    The constructor checks the policy (OutputError); entering makes the missing folders and
    a temporary file beside `path`; writing renames it onto `path`. Leaving without a
    complete write (an error, or no write at all) removes the temporary file and the folders
    made, so nothing is left."""

    def __init__(
        self,
        path: Path | str,
        *,
        option: str,
        force: bool = False,
        reads: Iterable[Path] = (),
        own: bool = False,
        hdf5: bool = False,
    ) -> None:
        self.path = Path(path)
        self.option = option
        self.replace = force or own  # an existing regular file may be replaced
        check_file(self.path, option=option, force=force, reads=reads, own=own, hdf5=hdf5)
        self._made: Path | None = None
        self._tmp: Path | None = None
        self.written = False

    def __enter__(self) -> OutputFile:
        self._made = make_folders(self.option, self.path.parent)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        except OSError as exc:
            remove_made(self._made)
            raise OutputError(self.option, self.path, f"cannot be written ({exc.strerror})") from None
        os.close(fd)
        self._tmp = Path(tmp)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        if not self.written:
            remove_made(self._made)

    @property
    def temporary(self) -> Path:
        """The claimed temporary file, for a writer of its own (h5py): write it, then `commit()`."""
        if self._tmp is None:
            raise RuntimeError("OutputFile.temporary outside its `with` block")
        return self._tmp

    def commit(self) -> None:
        """Put the temporary file, written by a writer of its own, in place."""
        try:
            os.chmod(self.temporary, 0o666 & ~_umask())  # mkstemp's 0600 would hide results from the group
        except OSError as exc:
            raise OutputError(self.option, self.path, f"cannot be written ({exc.strerror})") from None
        self._commit()

    def write_text(self, text: str) -> None:
        self.write_with(lambda f: f.write(text))

    def write_with(self, write: Callable[[TextIO], object]) -> None:
        """Write the file with `write(f)` (a text file, UTF-8), then put it in place."""
        with self.open() as f:
            write(f)

    @contextlib.contextmanager
    def open(self) -> Iterator[TextIO]:
        """The temporary file for writing; put in place when the block ends without an error."""
        if self._tmp is None:
            raise RuntimeError("OutputFile.open outside its `with` block")
        try:
            with open(self._tmp, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide results from the group
                yield f
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(self.option, self.path, f"cannot be written ({exc.strerror})") from None
        self._commit()

    def _commit(self) -> None:
        assert self._tmp is not None
        try:
            if self.replace:
                check_replaceable(self.option, self.path)
                os.replace(self._tmp, self.path)
            else:
                self._link_new()
        except OSError as exc:
            raise OutputError(self.option, self.path, f"cannot be written ({exc.strerror})") from None
        self.written = True

    def _link_new(self) -> None:
        """Put the file in place only if the name is still free (a hard link fails if it is taken)."""
        assert self._tmp is not None
        try:
            os.link(self._tmp, self.path)
        except FileExistsError:
            raise OutputError(self.option, self.path, f"was made meanwhile by something else; {FORCE_HINT}") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(self.path):  # no hard links here (some file systems): check, then rename
                raise OutputError(self.option, self.path, f"was made meanwhile; {FORCE_HINT}") from None
            os.replace(self._tmp, self.path)
            return
        self._tmp.unlink()
