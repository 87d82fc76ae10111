"""What every study script shares: pick the spec, drop the cells that cannot run here, run the
sweep, analyse it, write the paper's table.

A study is a sweep spec (`seedNNN_*.yaml`, CPU-sized; `seedNNN_*.gpu.yaml` for GPU clusters)
and a script that turns the sweep's tables into the table its seed paper publishes. The
script runs only the framework / backend cells that work in their environment here
(`python -m hpcbench.sweep check`) and prints a note for each cell it leaves out.

    python analysis/seed000_scaling.py [--gpu] [--smoke] [--frameworks torch,...] [--models lenet,...]
                                       [--data-dir DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python analysis/seedNNN_x.py` from a checkout
    sys.path.insert(0, str(ROOT))

from hpcbench.analysis import pipeline, tables  # noqa: E402
from hpcbench.analysis.report import html as report  # noqa: E402
from hpcbench.errors import HpcbenchError  # noqa: E402
from hpcbench.plan import capabilities, envs  # noqa: E402
from hpcbench.sweepdir.atomic import write_text_atomic  # noqa: E402

STACK_FIELDS = ("framework", "backend", "launcher", "env")
SMOKE = {"iterations": 2, "warmup": 1, "epochs": 1}  # smoke runs: prove the pipeline, measure nothing
SMOKE_MAX_RANKS = 2
SMOKE_MAX_BATCH = 4

TableMaker = Callable[[pipeline.Analysis], pd.DataFrame]


def parse_args(argv: Sequence[str] | None, name: str, about: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=name, description=about)
    p.add_argument("--gpu", action="store_true", help="the GPU-cluster spec (device cuda, more ranks)")
    p.add_argument("--smoke", action="store_true", help="tiny run (2 iterations, <= 2 ranks, first value of each "
                   "other axis): checks that the study runs, measures nothing")  # fmt: skip
    p.add_argument("--frameworks", help="only these frameworks or framework/backend cells (comma-separated)")
    p.add_argument("--models", help="only these models (comma-separated; any model of the framework zoo)")
    p.add_argument("--data-dir", help="directory with the real dataset files (MNIST / CIFAR-10); "
                   "without it synthetic data stands in")  # fmt: skip
    p.add_argument("--out", help="output directory (default runs/STUDY)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------
# which cells can run here


def _stacks(raw: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """(grouped-axis name or None, a stack's fields) for every framework cell of the spec."""
    fixed = raw.get("fixed") or {}
    matrix = raw.get("matrix") or {}
    base = {k: fixed[k] for k in STACK_FIELDS if k in fixed}
    out: list[tuple[str | None, dict[str, Any]]] = []
    for key, value in matrix.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and "framework" in value[0]:
            out += [(key, {**base, **entry}) for entry in value]
    if not out:
        frameworks = matrix.get("framework", [fixed.get("framework", "torch")])
        out = [(None, {**base, "framework": f}) for f in frameworks]
    return out


def _reports(env_names: set[str | None]) -> dict[str | None, capabilities.Report | str]:
    found: dict[str | None, capabilities.Report | str] = {}
    for name in sorted(env_names, key=str):
        try:
            python = envs.python(name)
        except HpcbenchError as exc:
            found[name] = str(exc)
            continue
        found[name] = capabilities.run_probe(python, extra_path=envs.ROOT if name is None else None)
    return found


def cell_problem(stack: dict[str, Any], reports: dict[str | None, capabilities.Report | str]) -> str | None:
    """Why this framework / backend / launcher cannot run in its environment here (None: it can)."""
    env = stack.get("env")
    result = reports[env]
    if isinstance(result, str):
        return result
    framework, backend = stack["framework"], stack.get("backend")
    launcher = stack.get("launcher", "mpirun")
    for cell in result["cells"]:
        if cell["framework"] == framework and cell["backend"] == backend and cell["launcher"] == launcher:
            return cell["error"]
    return f"{framework}/{backend} under {launcher} is not a known cell"


def runnable(raw: dict[str, Any], only: set[str] | None) -> tuple[dict[str, Any], list[str]]:
    """The spec with only the cells that can run here, and a note for each cell left out."""
    raw = copy.deepcopy(raw)
    stacks = _stacks(raw)

    def chosen(stack: dict[str, Any]) -> bool:
        return only is None or stack["framework"] in only or f"{stack['framework']}/{stack.get('backend')}" in only

    wanted = [s for _, s in stacks if chosen(s)]
    reports = _reports({s.get("env") for s in wanted})  # probe only the environments that are needed
    notes, keep = [], []
    for axis, stack in stacks:
        label = f"{stack['framework']}/{stack.get('backend')} (env {stack.get('env') or 'default'})"
        if not chosen(stack):
            notes.append(f"skipped {label}: not in --frameworks")
            continue
        problem = cell_problem(stack, reports)
        if problem:
            notes.append(f"skipped {label}: {problem}")
            continue
        keep.append((axis, stack))
    matrix = raw.setdefault("matrix", {})
    axis_name = stacks[0][0] if stacks else None
    if axis_name is not None:
        fixed_keys = set(raw.get("fixed") or {})
        matrix[axis_name] = [{k: v for k, v in s.items() if k not in fixed_keys} for _, s in keep]
    elif "framework" in matrix:
        matrix["framework"] = [s["framework"] for _, s in keep]
    elif not keep:
        matrix["framework"] = []
    return raw, notes


def smoke(raw: dict[str, Any]) -> dict[str, Any]:
    """A tiny version of the spec: few iterations, few ranks, the first value of other axes."""
    raw = copy.deepcopy(raw)
    fixed = raw.setdefault("fixed", {})
    matrix = raw.setdefault("matrix", {})
    for key, value in SMOKE.items():
        if key in matrix:
            matrix[key] = [value]
        elif key != "epochs" or key in fixed:
            fixed[key] = value
    for key, value in list(matrix.items()):
        if not isinstance(value, list) or not value:
            continue
        if key in ("ranks_per_node", "gpus_per_node"):
            matrix[key] = [v for v in value if v <= SMOKE_MAX_RANKS] or [1]
        elif not (all(isinstance(v, dict) for v in value) and "framework" in value[0]):
            matrix[key] = value[:1]
    for key in ("batch_size",):
        if key in fixed:
            fixed[key] = min(fixed[key], SMOKE_MAX_BATCH)
        if key in matrix:
            matrix[key] = [min(v, SMOKE_MAX_BATCH) for v in matrix[key]]
    matrix.pop("nodes", None)
    fixed["nodes"] = 1
    raw.pop("exclude", None)  # excludes may name values smoke removed
    return raw


def with_data(raw: dict[str, Any], data_dir: str | None) -> tuple[dict[str, Any], list[str]]:
    raw = copy.deepcopy(raw)
    fixed = raw.setdefault("fixed", {})
    if fixed.get("dataset", "synthetic") == "synthetic":
        return raw, []
    if data_dir:
        fixed["data_dir"] = data_dir
        return raw, []
    wanted = fixed["dataset"]
    fixed["dataset"] = "synthetic"
    return raw, [f"no --data-dir: synthetic data stands in for {wanted} (accuracy is on synthetic data)"]


# --------------------------------------------------------------------------------------
# running and writing


def markdown(table: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v).replace("|", "\\|")

    head = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def per_stack(raw: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One spec per framework cell (so a cell that cannot start does not stop the others)."""
    matrix = raw.get("matrix") or {}
    axis = next((k for k, v in matrix.items() if isinstance(v, list) and v and all(isinstance(e, dict) for e in v)
                 and "framework" in v[0]), None)  # fmt: skip
    if axis is None:
        return [(raw["name"], raw)]
    out = []
    for i, entry in enumerate(matrix[axis]):
        sub = copy.deepcopy(raw)
        del sub["matrix"][axis]
        sub.setdefault("fixed", {}).update(entry)
        label = f"{entry['framework']}-{entry.get('backend', '')}-{i}"
        sub["name"] = f"{raw['name']}-{label}"
        out.append((label, sub))
    return out


def run_sweeps(raw: dict[str, Any], out: Path) -> Path:
    """Run every cell's sweep under `out`; link the complete point files into `out/all`."""
    combined = out / "all"
    combined.mkdir(parents=True, exist_ok=True)
    for label, sub in per_stack(raw):
        spec_path = out / f"{label}.yaml"
        write_text_atomic(spec_path, yaml.safe_dump(sub, sort_keys=False))
        sweep_dir = out / label
        run = subprocess.run([sys.executable, "-m", "hpcbench.sweep", str(spec_path), "--out", str(sweep_dir)],
                             cwd=ROOT)  # fmt: skip
        if run.returncode != 0:
            print(f"note: {label}: the sweep ended with status {run.returncode}; its failed points are left out "
                  f"(python -m hpcbench.sweep status {sweep_dir})")  # fmt: skip
        for h5 in tables.point_files(sweep_dir) if sweep_dir.is_dir() else []:
            link = combined / h5.name
            if not link.exists():
                link.symlink_to(h5.resolve())
    return combined


def main(spec: Path, title: str, make_table: TableMaker, argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, spec.stem, title)
    path = spec.with_suffix(".gpu.yaml") if args.gpu else spec
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    only = set(args.frameworks.split(",")) if args.frameworks else None
    raw, notes = runnable(raw, only)
    raw, data_notes = with_data(raw, args.data_dir)
    notes += data_notes
    if args.models:
        models = args.models.split(",")
        raw.setdefault("matrix", {}).pop("model", None)
        if len(models) == 1:
            raw.setdefault("fixed", {})["model"] = models[0]
        else:
            raw.setdefault("fixed", {}).pop("model", None)
            raw["matrix"]["model"] = models
    if args.smoke:
        raw = smoke(raw)
    out = Path(args.out) if args.out else ROOT / "runs" / raw["name"]
    for note in notes:
        print(f"note: {note}")
    if any(isinstance(v, list) and not v for v in (raw.get("matrix") or {}).values()):
        print(f"{title}: no cell of this study can run here; nothing to do")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "spec.yaml", yaml.safe_dump(raw, sort_keys=False))
    combined = run_sweeps(raw, out)
    try:
        analysis = pipeline.analyse(combined)
    except HpcbenchError as exc:
        print(f"{title}: no results to tabulate ({exc})")
        return 0
    report.write_report(analysis)
    table = make_table(analysis)
    write_text_atomic(out / "table.csv", table.to_csv(index=False))
    write_text_atomic(out / "table.md", f"# {title}\n\n" + markdown(table) + "\n")
    print(f"\n{title}\n")
    print(markdown(table))
    print(f"\nwrote {out / 'table.md'}, {out / 'table.csv'} and {combined / 'report.html'}")
    return 0


def columns(frame: pd.DataFrame, wanted: dict[str, str]) -> pd.DataFrame:
    """The `wanted` columns of `frame` that exist, renamed to their titles."""
    present = [c for c in wanted if c in frame.columns]
    return frame[present].rename(columns=wanted)
