"""What works in this interpreter: `python -m hpcbench.plan.capabilities [--json]`.

Probes every framework x backend of the registry (`Framework.unavailable`), every launcher
(its program on PATH, its modules), which launcher can start which framework x backend
(`plan.launch.check_point`), parallel HDF5 (without it the ranks use the gather writer), whether
the MPI and HDF5 libraries loaded are the ones the environment was built against (its build
record, hpcbench.rank.linkage), NVML and the BLAS libraries threadpoolctl sees.
Each entry is "works" (error None, with a short detail) or the reason it does not.

`python -m hpcbench.sweep check` runs this module once in each environment's interpreter
(`survey`), so no framework is ever imported into the sweep process; `--json` prints one JSON object
(`REPORT_VERSION`) on stdout, whatever the frameworks print while they import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from hpcbench.errors import HpcbenchError, one_line
from hpcbench.workloads import zoo

if TYPE_CHECKING:
    from hpcbench.frameworks.base import Framework

REPORT_VERSION = 3  # 2: the build item; 3: the models each framework refuses
MAX_REASON = 300  # characters of a reason kept (import errors can be long)
# Distributions whose versions are reported (read from metadata: nothing is imported).
DISTRIBUTIONS = ("numpy", "torch", "tensorflow-cpu", "tensorflow", "keras", "mxnet", "horovod", "h5py", "mpi4py", "jax",
                 "jaxlib", "chainer", "Theano", "pytensor")  # fmt: skip
# Libraries whose import is reported, when installed (for horovod.X: horovod and X installed).
# (chainer and theano are left out: a plain import of either fails; their adapters set them up)
LIBRARIES = ("numpy", "torch", "tensorflow", "mxnet", "horovod.torch", "horovod.tensorflow", "horovod.mxnet", "mpi4py",
             "jax")  # fmt: skip


class Item(TypedDict):
    error: str | None  # None: works
    detail: str  # what works (versions, libraries); empty when it does not


class Cell(TypedDict):
    framework: str
    backend: str
    launcher: str
    error: str | None


class Report(TypedDict):
    version: int
    python: str
    python_version: str
    distributions: dict[str, str]
    broken_modules: dict[str, str]
    frameworks: dict[str, dict[str, str | None]]  # framework -> backend -> error
    launchers: dict[str, str | None]  # launcher -> error
    cells: list[Cell]
    models: dict[str, dict[str, str]]  # framework that imports -> zoo model it refuses here -> why
    libraries: dict[str, Item]  # module -> import result (version, or Horovod's controllers)
    hdf5: Item  # error: why point files are written by the gather writer
    build: Item  # the loaded MPI and HDF5 against the environment's build record
    nvml: Item
    blas: Item


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return _short(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _short(text: str) -> str:
    text = one_line(text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _guarded(probe: Callable[[], Item]) -> Item:
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer: the reason it does not work
        return {"error": _reason(exc), "detail": ""}


def distributions() -> dict[str, str]:
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _installed(module: str) -> bool:
    return all(importlib.util.find_spec(part) is not None for part in module.split("."))


def library(module: str) -> Item:
    imported = importlib.import_module(module)
    top = sys.modules[module.split(".")[0]]
    detail = str(getattr(top, "__version__", "?"))
    if module.startswith("horovod."):
        controllers = [c for c in ("mpi", "gloo") if getattr(imported, f"{c}_built")()]
        detail += f" (built with {', '.join(controllers) or 'no controller'})"
    return {"error": None, "detail": detail}


def hdf5() -> Item:
    import h5py

    config = h5py.get_config()
    detail = f"h5py {h5py.__version__}, HDF5 {'.'.join(map(str, h5py.version.hdf5_version_tuple))}"
    if not config.mpi:
        why = (
            "built without MPI: rank 0 writes every point file (envs/setup.sh uses a parallel HDF5 where it finds one)"
        )
        return {"error": f"{detail} {why}", "detail": ""}
    return {"error": None, "detail": detail + ", MPI ('mpio' driver)"}


def build() -> Item:
    """The MPI and HDF5 libraries this interpreter loads against its build record."""
    from hpcbench.rank import linkage

    path = linkage.record_path()
    if not path.is_file():
        return {"error": None, "detail": f"nothing to compare: no build record at {path} (envs/setup.sh writes one)"}
    reason = linkage.mismatch(path, load_mpi=True)  # the probe is a process of its own
    if reason is not None:
        return {"error": reason, "detail": ""}  # whole: it names both libraries
    return {"error": None, "detail": f"the MPI and HDF5 loaded are those of {path}"}


def nvml() -> Item:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    texts = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return {"error": None, "detail": f"{count} GPU(s) {', '.join(texts)}; driver {driver}"}


def blas() -> Item:
    from threadpoolctl import threadpool_info

    libraries = [
        f"{info.get('internal_api')} {info.get('version') or ''} ({info.get('num_threads')} threads, "
        f"{Path(str(info.get('filepath'))).name})".replace("  ", " ")
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]
    if not libraries:
        return {"error": "threadpoolctl sees no BLAS library loaded", "detail": ""}
    return {"error": None, "detail": "; ".join(libraries)}


def _launcher_error(program: str | None, requires: tuple[str, ...]) -> str | None:
    from hpcbench.registry import import_error

    # As the sweep does: the environment's own scripts (its horovodrun) first, then PATH.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if program and shutil.which(program, path=search) is None:
        return f"{program!r} is not on PATH"
    error = import_error(requires)
    return None if error is None else _short(error)


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr while frameworks import (some print to stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def refused_models(framework: type[Framework], backend: str, device: str) -> dict[str, str]:
    """The zoo's models that `framework` refuses in this interpreter, each with the reason."""
    from hpcbench.spec import Point

    refused = {}
    for name in zoo.NAMES:
        point = Point(framework=framework.name, backend=backend, model=name, device=device)
        why = [what for field, what, _ in framework.check_point(point) if field == "model"]
        if why:
            refused[name] = why[0]
    return refused


def probe() -> Report:
    """Probe this interpreter (imports every framework it has)."""
    from hpcbench.frameworks import FRAMEWORKS
    from hpcbench.launchers import LAUNCHERS
    from hpcbench.plan.launch import check_point
    from hpcbench.spec import Point

    nvml_item = _guarded(nvml)
    device = "cuda" if nvml_item["error"] is None and not nvml_item["detail"].startswith("0 ") else "cpu"
    frameworks: dict[str, dict[str, str | None]] = {}
    for fw in FRAMEWORKS:
        frameworks[fw.name] = {}
        for backend in fw.backends:
            try:
                error = fw.unavailable(backend)
            except Exception as exc:  # noqa: BLE001 - a probe that fails is the reason
                error = _reason(exc)
            frameworks[fw.name][backend] = None if error is None else _short(error)
    launchers = {la.name: _launcher_error(la.program, la.requires) for la in LAUNCHERS}
    cells: list[Cell] = []
    for fw in FRAMEWORKS:
        model = next(iter(getattr(fw, "models", ())), "lenet")
        for backend in fw.backends:
            for la in LAUNCHERS:
                point = Point(framework=fw.name, backend=backend, launcher=la.name, model=model, device=device)
                problems = [p for p in check_point(point) if p[0] != "model"]
                # The first reason: the framework does not import, the combination is not
                # supported, or the launcher is missing.
                error = frameworks[fw.name][backend]
                if error is None and problems:
                    error = "; ".join(message for _, message, _ in problems)
                error = error or launchers[la.name]
                cells.append({"framework": fw.name, "backend": backend, "launcher": la.name, "error": error})
    models: dict[str, dict[str, str]] = {}
    for fw in FRAMEWORKS:
        working = [backend for backend, error in frameworks[fw.name].items() if error is None]
        if working and set(fw.models) & set(zoo.NAMES):  # a framework of the zoo's models that imports here
            refused = refused_models(fw, working[0], device)
            if refused:
                models[fw.name] = refused
    broken = {f"frameworks.{k}": v for k, v in FRAMEWORKS.broken.items()}
    broken.update({f"launchers.{k}": v for k, v in LAUNCHERS.broken.items()})
    return {
        "version": REPORT_VERSION,
        "python": sys.executable,
        "python_version": platform.python_version(),
        "distributions": distributions(),
        "broken_modules": {k: _short(v) for k, v in broken.items()},
        "frameworks": frameworks,
        "launchers": launchers,
        "cells": cells,
        "models": models,
        "libraries": {m: _guarded(partial(library, m)) for m in LIBRARIES if _installed(m)},
        "hdf5": _guarded(hdf5),
        "build": _guarded(build),
        "nvml": nvml_item,
        "blas": _guarded(blas),  # last: sees the BLAS libraries the frameworks loaded
    }


def run_probe(python: Path, timeout: float = 600, extra_path: Path | None = None) -> Report | str:
    """The report of interpreter `python` (run in a subprocess), or why there is none."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(
            [str(python), "-m", __name__, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd="/",  # hpcbench must come from the environment itself, not from the current folder
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probe failed: {_reason(exc)}"
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode != 0:
        return f"probe failed (exit {proc.returncode}): {_short(last)}"
    try:
        report: Report = json.loads(proc.stdout)
    except ValueError:
        return f"probe printed no report: {_short(proc.stdout.strip()[-200:] or last)}"
    if report.get("version") != REPORT_VERSION:
        return f"probe report version {report.get('version')!r}, expected {REPORT_VERSION}"
    return report


def this_label() -> str:
    """The name of the interpreter that runs `hpcbench check` in its report: its virtual
    environment's folder (".venv"), else its program ("python3"); its prefix where that would
    be taken for a named environment's."""
    from hpcbench.plan import envs

    label = Path(sys.prefix).name if sys.prefix != sys.base_prefix else Path(sys.executable).name
    return str(sys.prefix) if label in envs.NAMES or not label else label


def survey(only: str | None = None) -> list[tuple[str, Report | str]]:
    """(name, report or reason) for this interpreter (`this_label()`) and every named
    environment, or for the one named `only` (raises naming the allowed ones if none is)."""
    from hpcbench.plan import envs

    this = this_label()
    allowed = (this, *envs.NAMES)
    if only is not None and only not in allowed:
        raise HpcbenchError(f"--env: no environment {only!r} (allowed: {', '.join(allowed)})")
    targets: list[tuple[str, Path | None, Path | None]] = []
    if only in (None, this):
        targets.append((this, Path(sys.executable), envs.ROOT))
    for name in envs.NAMES:
        if only not in (None, name):
            continue
        try:
            targets.append((name, envs.python(name), None))
        except HpcbenchError:
            targets.append((name, None, None))
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        futures = {label: pool.submit(run_probe, python, 600, path) for label, python, path in targets if python}
    results: list[tuple[str, Report | str]] = []
    for label, python, _ in targets:
        if python is None:
            results.append((label, f"not built: {envs.build_command(label)} (looked in {envs.envs_dir() / label})"))
            continue
        result = futures[label].result()
        if isinstance(result, str) and label != this:
            result += f" (rebuild: {envs.build_command(label)})"
        results.append((label, result))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcbench.plan.capabilities", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with _stdout_to_stderr():
        report = probe()
    # one JSON object (registry order kept); `hpcbench check` renders it as a table
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
