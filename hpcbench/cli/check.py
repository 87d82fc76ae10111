"""`hpcbench check`: what works where, over this interpreter and every named environment
(each probed by hpcbench.plan.capabilities in its own interpreter): one table of framework x
backend, the environments it works in and the launchers it runs under, with the reasons where
it works nowhere, each once; `--env NAME`: one environment's report in detail; `--json`: all
of it as JSON. `hpcbench check --peak`: this machine's peak FLOP/s, measured and cached for MFU
(hpcbench.devices)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from hpcbench.cli import textable
from hpcbench.errors import HpcbenchError
from hpcbench.plan.capabilities import Report, survey
from hpcbench.spec import Point
from hpcbench.workloads import zoo

JSON_VERSION = 1  # of `hpcbench check --json`


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


Results = list[tuple[str, Report | str]]  # (environment, its report or why there is none), as `survey`


@dataclass(frozen=True)
class Row:
    """One framework x backend over every environment probed."""

    framework: str
    backend: str
    launchers: dict[str, list[str]]  # environment it works in -> the launchers it runs under there
    reasons: dict[str, list[str]]  # where it works nowhere: reason -> environments it was found in
    note: str = ""  # where it works nowhere: what the reasons' environments are, in words

    @property
    def name(self) -> str:
        return f"{self.framework}/{self.backend}"

    def as_json(self) -> dict[str, object]:
        launchers = sorted({la for names in self.launchers.values() for la in names})
        return {"framework": self.framework, "backend": self.backend, "environments": list(self.launchers),
                "launchers": launchers, "by_environment": self.launchers, "reasons": self.reasons}  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """Models of the zoo a framework refuses, for one reason, in the environments it imports in."""

    framework: str
    models: list[str]
    reason: str
    environments: list[str]  # where it refuses them
    everywhere: bool  # in every environment the framework imports in

    def text(self) -> str:
        names = ", ".join(self.models)
        models = f"the {len(self.models)} transformers" if self.transformers else names
        where = "" if self.everywhere else f" (in {', '.join(self.environments)})"
        return f"{self.framework}: {models}{where}: {self.reason}"

    @property
    def transformers(self) -> bool:
        return self.models == list(zoo.TRANSFORMER_NAMES)

    def as_json(self) -> dict[str, object]:
        return {"framework": self.framework, "models": self.models, "reason": self.reason,
                "environments": self.environments}  # fmt: skip


def _reports(results: Results) -> dict[str, Report]:
    return {label: result for label, result in results if not isinstance(result, str)}


def _row(framework: str, backend: str, reports: dict[str, Report], unprobed: list[str]) -> Row:
    """Where framework x backend works; where nowhere, the reasons of the environments that got
    furthest with it: those where it imports (no launcher starts it), else those where another of
    the framework's backends imports (this one needs more), else all (the framework imports nowhere)."""
    launchers: dict[str, list[str]] = {}
    found: dict[int, dict[str, list[str]]] = {1: {}, 2: {}, 3: {}}
    for label, report in reports.items():
        backends = report["frameworks"].get(framework)
        if backends is None or backend not in backends:
            broken = report["broken_modules"].get(f"frameworks.{framework}")
            error: str | None = f"does not import: {broken}" if broken else "not in this environment's hpcbench"
            level = 1
        else:
            error = backends[backend]
            level = 2 if error is not None and any(e is None for e in backends.values()) else 1
        if error is not None:
            found[level].setdefault(error, []).append(label)
            continue
        cells = [c for c in report["cells"] if (c["framework"], c["backend"]) == (framework, backend)]
        working = [c["launcher"] for c in cells if c["error"] is None]
        if working:
            launchers[label] = sorted(working)
        for cell in cells:
            if cell["error"] is not None and not working:
                found[3].setdefault(cell["error"], [])
                if label not in found[3][cell["error"]]:
                    found[3][cell["error"]].append(label)
    if launchers:
        return Row(framework, backend, launchers, {})
    level = max((n for n in found if found[n]), default=0)
    if level == 0:
        return Row(framework, backend, {}, {"no environment could be probed": unprobed}, "")
    where = sorted({env for envs in found[level].values() for env in envs}, key=list(reports).index)
    note = {
        3: f"where it imports: {', '.join(where)}",
        2: f"where {framework} imports: {', '.join(where)}",
        1: f"not probed: {', '.join(unprobed)}" if unprobed else "",
    }[level]
    return Row(framework, backend, {}, found[level], note)


def rows(results: Results) -> list[Row]:
    """One row per framework x backend of the registry (as the environments' hpcbench has it),
    frameworks by name, backends in their order."""
    reports = _reports(results)
    unprobed = [label for label, result in results if isinstance(result, str)]
    pairs: dict[str, list[str]] = {}
    for report in reports.values():
        for framework, backends in report["frameworks"].items():
            known = pairs.setdefault(framework, [])
            known += [b for b in backends if b not in known]
    return [_row(fw, backend, reports, unprobed) for fw in sorted(pairs) for backend in pairs[fw]]


def refusals(results: Results) -> list[Refusal]:
    """The models each framework refuses, once per framework and reason (not per model or
    environment)."""
    found: dict[str, dict[str, tuple[list[str], list[str]]]] = {}
    imports: dict[str, list[str]] = {}  # framework -> the environments where one of its backends imports
    for label, report in _reports(results).items():
        for framework, backends in report["frameworks"].items():
            if any(error is None for error in backends.values()):
                imports.setdefault(framework, []).append(label)
        for framework, refused in report["models"].items():
            for model, why in refused.items():
                models, envs = found.setdefault(framework, {}).setdefault(why, ([], []))
                if model not in models:
                    models.append(model)
                if label not in envs:
                    envs.append(label)
    return [
        Refusal(framework, [m for m in zoo.NAMES if m in models], why, envs, envs == imports.get(framework, envs))
        for framework, reasons in sorted(found.items())
        for why, (models, envs) in reasons.items()
    ]


def _launchers(row: Row) -> str:
    """The launchers it runs under; one that does only in some of its environments names them."""
    names = sorted({la for names in row.launchers.values() for la in names})
    return ", ".join(
        la
        if all(la in working for working in row.launchers.values())
        else f"{la} ({', '.join(env for env, working in row.launchers.items() if la in working)})"
        for la in names
    )


def _environment(label: str, result: Report | str) -> list[str]:
    """An environment's line, then its problems beyond the table (each indented below it)."""
    if isinstance(result, str):
        return [result]
    problems = [f"module {name}: does not import: {error}" for name, error in result["broken_modules"].items()]
    if result["hdf5"]["error"] is not None:
        problems.append(f"parallel HDF5: {_gather(result['hdf5']['error'])}")
    if result["build"]["error"] is not None:
        problems.append(f"build record: no: {result['build']['error']}")
    return [f"{result['python']} (Python {result['python_version']})", *problems]


def overview(results: Results) -> str:
    """The one table: each framework x backend, where it works and under which launchers; the
    reasons where it works nowhere, each once; the models refused; the environments."""
    table = rows(results)
    notes: dict[str, list[str]] = {}  # reason (with where it was found) -> the rows it stands for
    lines = [("framework", "backend", "environments", "launchers")]
    for row in table:
        if row.launchers:
            lines.append((row.framework, row.backend, ", ".join(row.launchers), _launchers(row)))
            continue
        refs = []
        for reason in row.reasons:
            text = f"{reason} ({row.note})" if row.note else reason
            notes.setdefault(text, []).append(row.name)
            refs.append(str(list(notes).index(text) + 1))
        lines.append((row.framework, row.backend, f"nowhere [{', '.join(refs)}]", ""))
    out = ["Where each framework x backend works, and under which launchers:", textable.render(lines, indent="  ")]
    if notes:
        out += ["", "Why it works nowhere:"]
        out += [f"  [{i}] {', '.join(names)}: {text}" for i, (text, names) in enumerate(notes.items(), 1)]
    refused = refusals(results)
    if refused:
        transformers = (
            f"; the transformers: {', '.join(zoo.TRANSFORMER_NAMES)}" if any(r.transformers for r in refused) else ""
        )
        out += ["", f"Models refused (each framework runs the zoo's others wherever it works{transformers}):"]
        out += [f"  {refusal.text()}" for refusal in refused]
    out += ["", "Energy sources on this host (what its ranks record in /energy):"]
    out += [f"  {line}" for line in energy_sources()]
    out += ["", "Environments (hpcbench check --env NAME: one in detail):"]
    width = max(len(label) for label, _ in results)
    for label, result in results:
        first, *problems = _environment(label, result)
        out.append(f"  {label:<{width}}  {first}")
        out += [f"  {'':<{width}}  {problem}" for problem in problems]
    return "\n".join(out)


def energy_sources() -> list[str]:
    """This host's energy sources, a line each: how it is read, or "absent: <why>"."""
    from hpcbench.trace.energy import sources_here
    from hpcbench.trace.energy.meter import powercap_root

    return sources_here(powercap_root())


def as_json(results: Results) -> dict[str, object]:
    """The one table, the models refused and each environment's report, as JSON."""
    return {
        "version": JSON_VERSION,
        "rows": [row.as_json() for row in rows(results)],
        "models": [refusal.as_json() for refusal in refusals(results)],
        "energy": energy_sources(),
        "environments": {
            label: {"error": result, "report": None} if isinstance(result, str) else {"error": None, "report": result}
            for label, result in results
        },
    }


def check(out: TextIO, env: str | None = None, as_json_: bool = False) -> int:
    """`hpcbench check`: the one table over every environment; with `env` that environment's
    detailed report; with `as_json_` the same as JSON."""
    results = survey(env)
    if as_json_:
        print(json.dumps(as_json(results), indent=2), file=out)
    elif env is None:
        print(overview(results), file=out)
    else:
        ((label, result),) = results
        print(
            f"{label}: {result}" if isinstance(result, str) else f"{heading(label, result)}\n{render(result)}", file=out
        )
    return 0


def command(
    out: TextIO,
    peak: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    seconds: float | None = None,
    env: str | None = None,
    as_json_: bool = False,
) -> int:
    """`hpcbench check` (the capability table), or with `peak` the measured peaks."""
    if peak:
        if env is not None or as_json_:
            raise HpcbenchError(f"{'--env' if env is not None else '--json'} goes without --peak")
        return peaks(out, device or "cpu", dtype or "fp32", 2.0 if seconds is None else seconds)
    alone = [o for o, v in (("--device", device), ("--dtype", dtype), ("--seconds", seconds)) if v is not None]
    if alone:
        verb = "goes" if len(alone) == 1 else "go"
        raise HpcbenchError(f"{', '.join(alone)} {verb} with --peak (hpcbench check --peak {alone[0]} ...)")
    return check(out, env, as_json_)


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


def measure_cpu_peaks(points: Sequence[Point], out: TextIO) -> None:
    """Before a local sweep of transformers on the CPU: this CPU's peak for their precisions,
    measured once (cached) where none is known, so that their MFU has a peak."""
    from hpcbench.devices import measure, peaks
    from hpcbench.workloads import zoo

    needed = {
        peaks.dtype_for_precision(point.precision)
        for point in points
        if point.device == "cpu" and point.model in zoo.TRANSFORMER_NAMES
    }
    for peak in measure.ensure_cpu_peaks(needed):
        print(f"measured this CPU's {peak.dtype} peak for MFU: {peak.flops_per_s / 1e12:.3g} TFLOP/s "
              "(hpcbench check --peak measures it again)", file=out)  # fmt: skip
