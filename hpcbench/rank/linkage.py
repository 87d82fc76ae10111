"""Does this rank load the MPI and HDF5 libraries its environment was built against?

On a cluster the environment is built on a login node (`envs/setup.sh`, `envs/build.sh`)
against whatever MPI and HDF5 the loaded modules provide, and the ranks run on compute
nodes whose job may load other modules. mpi4py then loads another MPI library than the
one h5py's parallel HDF5 was linked with, and a point fails late, obscurely, or not at all
but wrongly. So the build writes a record beside the interpreter (`BUILD_RECORD` in the
environment's prefix: `python -m hpcbench.rank.linkage record`), and every rank compares
what it loads with it (`mismatch`) before anything else.

`python -m hpcbench.rank.linkage check [RECORD]` prints the comparison (exit 1 when they
differ), e.g. in a job script or under `srun -n 1` on a compute node.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpcbench.errors import one_line
from hpcbench.rank import collectives

BUILD_RECORD = "hpcbench-build.json"
RECORD_VERSION = 1
# Basenames of the shared libraries looked for in /proc/self/maps (Open MPI libmpi.so.40,
# MPICH and Intel MPI libmpi.so.12, Cray MPICH libmpi_cray.so.12 / libmpi_gnu_*.so.12).
_MPI_LIBRARY = ("libmpi.so", "libmpi_")
_HDF5_LIBRARY = ("libhdf5.so", "libhdf5_openmpi.so", "libhdf5_mpich.so", "libhdf5-")


def record_path(prefix: Path | None = None) -> Path:
    """Where the build record of the environment at `prefix` (default: this one) is."""
    return (Path(sys.prefix) if prefix is None else prefix) / BUILD_RECORD


def loaded_library(prefixes: tuple[str, ...]) -> str | None:
    """The path of a shared library mapped into this process whose name starts with one
    of `prefixes`, the earlier prefixes first (None when there is none, or off Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.append(parts[5])
    for prefix in prefixes:
        for path in paths:
            if Path(path).name.startswith(prefix):
                return path
    return None


def _mpi(load: bool) -> tuple[str | None, str | None]:
    """(library version, why it does not load), both None when MPI is not loaded in this
    process and `load` is False; else one of them is None."""
    if not load and "mpi4py.MPI" not in sys.modules:
        return None, None
    try:
        version = collectives.library_version()
    except Exception as exc:  # noqa: BLE001 - a library that does not load is the answer
        return None, one_line(f"{type(exc).__name__}: {exc}")
    if version is None:
        return None, "mpi4py does not import"
    return version, None


def current(load_mpi: bool = True) -> dict[str, Any]:
    """What this process loads: the MPI library (mpi4py's) and the HDF5 library (h5py's).

    With `load_mpi` False, MPI is looked at only if mpi4py.MPI is imported already (a rank
    of an MPI job); with True it is imported if need be, without initialising MPI (which
    then cannot be initialised by importing mpi4py.MPI again: only for processes of
    their own, like the `check` command)."""
    import h5py

    mpi_library, mpi_error = _mpi(load_mpi)
    return {
        "mpi_library": mpi_library,
        "mpi_error": mpi_error,
        "mpi_path": loaded_library(_MPI_LIBRARY),
        "hdf5_version": h5py.version.hdf5_version,
        "hdf5_parallel": bool(h5py.get_config().mpi),
        "hdf5_path": loaded_library(_HDF5_LIBRARY),
        "h5py": h5py.__version__,
    }


def build_record(compiler: str = "", mpicc: str = "") -> dict[str, Any]:
    """The record the build writes: what this interpreter loads now, how mpi4py was
    configured, and the compiler the build used (given by the build script)."""
    found = current()
    try:
        import mpi4py

        config = {str(k): str(v) for k, v in mpi4py.get_config().items()}
        mpi4py_version = str(mpi4py.__version__)
    except ImportError:
        config, mpi4py_version = {}, ""
    found.pop("mpi_error")
    found.update(version=RECORD_VERSION, mpi4py=mpi4py_version, mpi4py_config=config, compiler=compiler, mpicc=mpicc)
    return found


def _where(path: Any) -> str:
    return f" ({path})" if path else ""


def _hdf5_text(info: dict[str, Any]) -> str:
    kind = "parallel" if info.get("hdf5_parallel") else "serial"
    return f"HDF5 {info.get('hdf5_version')} ({kind}){_where(info.get('hdf5_path'))}"


def compare(built: dict[str, Any], now: dict[str, Any]) -> str | None:
    """One line naming what differs between the build record and what loads now, or None."""
    reasons = []
    mpi_built = built.get("mpi_library")
    mpi_looked_at = now.get("mpi_library") or now.get("mpi_error")  # not when this process has no MPI
    if mpi_built and mpi_looked_at and now.get("mpi_library") != mpi_built:
        running = (
            f"'{now['mpi_library']}'{_where(now.get('mpi_path'))}"
            if now.get("mpi_library")
            else f"none ({now.get('mpi_error') or 'mpi4py does not import'})"
        )
        reasons.append(
            f"MPI library differs from the build: built with '{mpi_built}'{_where(built.get('mpi_path'))}, "
            f"this rank loads {running}"
        )
    same_hdf5 = (built.get("hdf5_version"), bool(built.get("hdf5_parallel"))) == (
        now.get("hdf5_version"),
        bool(now.get("hdf5_parallel")),
    )
    if built.get("hdf5_version") and not same_hdf5:
        reasons.append(
            f"HDF5 differs from the build: built with {_hdf5_text(built)}, this rank loads {_hdf5_text(now)}"
        )
    if not reasons:
        return None
    return one_line(
        "; ".join(reasons) + " (load the modules the environment was built with, or rebuild it with envs/setup.sh)"
    )


def mismatch(record: Path | None = None, load_mpi: bool = False) -> str | None:
    """Why this process's MPI or HDF5 is not the one its environment was built against
    (one line naming both), or None when they agree or there is no build record.

    `record` defaults to `BUILD_RECORD` in this interpreter's prefix (`sys.prefix`).
    Imports h5py. The MPI library is compared when this process has imported mpi4py.MPI
    already (a rank that uses MPI) or, with `load_mpi`, always (see `current`)."""
    path = record_path() if record is None else record
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"build record {path} cannot be read: {one_line(str(exc))}"
    try:
        built = json.loads(text)
    except ValueError as exc:
        return f"build record {path} is not JSON ({exc}): rebuild the environment with envs/setup.sh"
    if not isinstance(built, dict):
        return f"build record {path} holds {type(built).__name__}, not an object: rebuild the environment"
    return compare(built, current(load_mpi))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcbench.rank.linkage", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="print the build record of this interpreter (JSON)")
    rec.add_argument("--compiler", default="", help="the compiler the build used (its version line)")
    rec.add_argument("--mpicc", default="", help="the MPI compiler wrapper the build used")
    chk = sub.add_parser("check", help="compare what this interpreter loads with its build record")
    chk.add_argument("record", nargs="?", type=Path, help=f"the record (default: {BUILD_RECORD} in sys.prefix)")
    args = parser.parse_args(argv)
    if args.command == "record":
        print(json.dumps(build_record(args.compiler, args.mpicc), indent=2, sort_keys=True))
        return 0
    path = args.record or record_path()
    if not path.is_file():
        print(f"no build record at {path}: nothing to compare", file=sys.stderr)
        return 0
    reason = mismatch(path, load_mpi=True)
    if reason is not None:
        print(reason)
        return 1
    now = current(load_mpi=True)
    print(f"agrees with {path}: MPI '{now['mpi_library']}', {_hdf5_text(now)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
