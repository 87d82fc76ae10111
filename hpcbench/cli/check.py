"""`hpcbench check`: the capability report of this interpreter and of every named
environment (probed by hpcbench.plan.capabilities in each), as tables; `hpcbench check --peak`:
this machine's peak FLOP/s, measured and cached for MFU (hpcbench.devices)."""

from __future__ import annotations

import math
from typing import TextIO

from hpcbench.cli import textable
from hpcbench.errors import HpcbenchError
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


def command(
    out: TextIO, peak: bool = False, device: str | None = None, dtype: str | None = None, seconds: float | None = None
) -> int:
    """`hpcbench check` (the capability tables), or with `peak` the measured peaks."""
    if peak:
        return peaks(out, device or "cpu", dtype or "fp32", 2.0 if seconds is None else seconds)
    alone = [o for o, v in (("--device", device), ("--dtype", dtype), ("--seconds", seconds)) if v is not None]
    if alone:
        verb = "goes" if len(alone) == 1 else "go"
        raise HpcbenchError(f"{', '.join(alone)} {verb} with --peak (hpcbench check --peak {alone[0]} ...)")
    return check(out)


def _dtypes(text: str) -> list[str]:
    from hpcbench.devices.measure import MEASURABLE

    names = [name.strip() for name in text.split(",") if name.strip()]
    allowed = f"(allowed: {', '.join(MEASURABLE)}, comma-separated)"
    if not names:
        raise HpcbenchError(f"--dtype: no dtype given {allowed}")
    for name in names:
        if name not in MEASURABLE:
            raise HpcbenchError(f"--dtype: {name} cannot be measured {allowed}")
    return list(dict.fromkeys(names))


def peaks(out: TextIO, device: str = "cpu", dtype: str = "fp32", seconds: float = 2.0) -> int:
    """`hpcbench check --peak`: measure each dtype of `dtype` (comma-separated) on `device`,
    save each to the cache and print them, with the table's peak where the device is in it."""
    from hpcbench.devices import cache, measure
    from hpcbench.devices.peaks import T, match

    dtypes = _dtypes(dtype)
    if device not in measure.DEVICES:
        raise HpcbenchError(f"--device: {device} is no device (allowed: {', '.join(measure.DEVICES)})")
    if not (math.isfinite(seconds) and seconds > 0):
        raise HpcbenchError(f"--seconds: {seconds:g} is not a positive number of seconds")
    if device == "cpu" and "tf32" in dtypes:
        raise HpcbenchError("--dtype: tf32 is a CUDA matmul mode, not measured on --device cpu (measure fp32 there)")
    rows = [("device", "dtype", "TFLOP/s", "source")]
    path = None
    for name in dtypes:
        measured = measure.measure_peak(device, name, seconds)
        path = cache.save_measured(measured)
        rows.append((measured.device, name, f"{measured.flops_per_s / T:.4g}", measured.source))
        row = match(measured.device)
        table = row.peak(name, measured.device) if row is not None else None
        if table is not None:
            share = f"; measured {measured.flops_per_s / table.flops_per_s:.0%} of it"
            rows.append((measured.device, name, f"{table.flops_per_s / T:g}", table.source + share))
    print(textable.render(rows, indent="  "), file=out)
    print(f"  saved to {path} (MFU takes the table's peak first, else this one)", file=out)
    return 0
