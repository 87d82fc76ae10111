"""`hpcbench check`: the capability report of this interpreter and of every named
environment (probed by hpcbench.plan.capabilities in each), as tables."""

from __future__ import annotations

from typing import TextIO

from hpcbench.cli import textable
from hpcbench.plan.capabilities import Report, survey


def _status(error: str | None, notes: list[str]) -> str:
    """'works', or 'no [n]' with the reason appended to `notes` (each reason once)."""
    if error is None:
        return "works"
    if error not in notes:
        notes.append(error)
    return f"no [{notes.index(error) + 1}]"


def _works(error: str | None, detail: str = "") -> str:
    if error is not None:
        return f"no: {error}"
    return f"works: {detail}" if detail else "works"


def _gather(error: str) -> str:
    return f"no (gather writer): {error}"


def _refused(refused: dict[str, str], notes: list[str]) -> str:
    """'all but A, B [n]; C [m]': the zoo's models a framework refuses here, by reason."""
    by_reason: dict[str, list[str]] = {}
    for model, why in refused.items():
        by_reason.setdefault(why, []).append(model)
    return "all but " + "; ".join(
        f"{', '.join(models)} {_status(why, notes).removeprefix('no ')}" for why, models in by_reason.items()
    )


def render(report: Report, indent: str = "  ") -> str:
    """The report as text: a framework x backend x launcher table, then the other items."""
    notes: list[str] = []
    launchers = sorted(report["launchers"])
    cells = {(c["framework"], c["backend"], c["launcher"]): c["error"] for c in report["cells"]}
    rows = [("framework", "backend", "imports", *launchers)]
    for fw, backends in sorted(report["frameworks"].items()):
        for backend, error in backends.items():
            row = [fw, backend, _status(error, notes)]
            row += [_status(cells.get((fw, backend, la), "not probed"), notes) for la in launchers]
            rows.append(tuple(row))
    extra = [(f"models {fw}", _refused(refused, notes)) for fw, refused in sorted(report["models"].items())]
    extra += [(f"import {m}", _works(item["error"], item["detail"])) for m, item in report["libraries"].items()]
    extra += [(f"launcher {la}", _works(report["launchers"][la])) for la in launchers]
    extra += [(f"module {name}", f"no: does not import: {error}") for name, error in report["broken_modules"].items()]
    hdf5 = report["hdf5"]
    # without parallel HDF5 the points still run: their files are written by the gather writer
    extra.append(("parallel HDF5", _works(None, hdf5["detail"]) if hdf5["error"] is None else _gather(hdf5["error"])))
    for name, item in (("build record", report["build"]), ("NVML", report["nvml"]), ("BLAS", report["blas"])):
        extra.append((name, _works(item["error"], item["detail"])))
    lines = [textable.render(rows, indent=indent)]
    lines += [f"{indent}{name:<{max(len(n) for n, _ in extra)}}  {text}" for name, text in extra]
    lines += [f"{indent}[{i}] {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines)


def heading(label: str, report: Report) -> str:
    return f"{label}: {report['python']} (Python {report['python_version']})"


def check(out: TextIO) -> int:
    """The capability table of every environment (`hpcbench check`)."""
    for i, (label, result) in enumerate(survey()):
        if i:
            print(file=out)
        if isinstance(result, str):
            print(f"{label}: {result}", file=out)
        else:
            print(heading(label, result), file=out)
            print(render(result), file=out)
    return 0
