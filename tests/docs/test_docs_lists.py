"""Every list in the manual of what the code registers or declares, against the code: frameworks
with their backends and launchers, models, datasets, environments, launchers, executors, spec
fields and options, the analysis' and the export's outputs and columns, the compare rules.
A list that drifts from its registry fails here, naming what one has and the other lacks.
(tests/docs/test_docs.py checks the point-file schema and the links; test_docs_commands.py runs
the command lines and validates the YAML.)"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest

import hpcbench
from hpcbench.analysis import compare, metrics
from hpcbench.analysis.export import FORMATS
from hpcbench.analysis.export.columns import STRING, Column
from hpcbench.analysis.export.parquet import TABLES
from hpcbench.analysis.export.sweep import PARQUET_TABLES
from hpcbench.cli import compare as compare_cli
from hpcbench.executors import EXECUTORS
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.launchers import LAUNCHERS
from hpcbench.plan import envs
from hpcbench.plan.launch import check_point
from hpcbench.spec import DEVICES, FIELD_NAMES, OPTIMIZERS, SYNONYMS, WRITERS, Options, Point
from hpcbench.store import provenance as per_run

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CELL = re.compile(r"(?<!\\)\|")
CODE = re.compile(r"`([^`]+)`")


def doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def table(text: str, header: list[str], after: str = "") -> list[list[str]]:
    """The rows (cells stripped, `\\|` unescaped) of the first Markdown table under `after`
    whose header row is `header`."""
    text = text.split(after, 1)[1] if after else text
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and cells(line) == header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            return rows
    raise AssertionError(f"no table with the header {header} (after {after!r})")


def cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in CELL.split(line.strip().strip("|"))]


def code(text: str) -> list[str]:
    """The code spans of a text, in order."""
    return CODE.findall(text)


def row(rows: list[list[str]], first: str) -> list[str]:
    found = [r for r in rows if r[0] == first]
    assert len(found) == 1, f"no single row {first!r}"
    return found[0]


def same(listed: Iterable[object], registered: Iterable[object], what: str) -> None:
    docs, code_ = set(listed), set(registered)
    assert docs == code_, (
        f"{what}: the docs list {sorted(map(str, docs - code_))} that the code does not; "
        f"the code has {sorted(map(str, code_ - docs))} that the docs do not list"
    )


SPEC = doc("docs/spec.md")
FRAMEWORKS_MD = doc("docs/frameworks.md")
SPEC_FIELDS = table(SPEC, ["field", "default", "allowed"])
MODELS = sorted({m for f in FRAMEWORKS for m in f.models})
DATASETS = sorted({d for f in FRAMEWORKS for d in f.datasets})


# ------------------------------------------------------------------------------------ frameworks


def test_spec_lists_every_framework() -> None:
    same(code(row(SPEC_FIELDS, "`framework`")[2]), FRAMEWORKS.names(), "docs/spec.md, field framework")


def named(text: str, *kinds: list[str]) -> list[str]:
    """The code spans of a text less the names of other kinds (`sleep` for `synthetic`)."""
    other = {name for kind in kinds for name in kind}
    return [name for name in code(text) if name not in other]


def test_readme_layout_lists_every_framework() -> None:
    listed = re.search(r"frameworks/\{([^}]*)\}", doc("README.md"))
    assert listed is not None
    same(listed.group(1).split(","), FRAMEWORKS.names(), "README.md's layout, frameworks/{...}")


MATRIX = table(FRAMEWORKS_MD, ["framework", "backend", "how gradients travel", "env", "launchers"])


def documented_cells() -> dict[tuple[str, str], set[str]]:
    """(framework, backend) -> the launchers docs/frameworks.md gives it."""
    out = {}
    for framework, backends, _, _, launchers in MATRIX:
        (name,) = code(framework)
        given = set(LAUNCHERS.names()) if launchers == "all" else {w.strip() for w in launchers.split(",")}
        for backend in code(backends):
            out[(name, backend)] = given
    return out


def accepted_launchers(framework: str, backend: str) -> set[str]:
    """The launchers the spec check accepts for a cell (cuda for the GPU-only backends)."""
    cls = FRAMEWORKS.get(framework)
    device = "cuda" if backend in ("nccl", "pure_nccl") else "cpu"
    out = set()
    for launcher in LAUNCHERS.names():
        point = Point(framework=framework, backend=backend, launcher=launcher, device=device, model=cls.models[0])
        if not list(check_point(point)):
            out.add(launcher)
    return out


def test_the_framework_table_holds_every_framework_and_backend() -> None:
    cells_ = documented_cells()
    same({f for f, _ in cells_}, FRAMEWORKS.names(), "docs/frameworks.md's table, frameworks")
    for cls in FRAMEWORKS:
        same({b for f, b in cells_ if f == cls.name}, cls.backends, f"docs/frameworks.md's table, {cls.name} backends")


@pytest.mark.parametrize("cell", sorted(documented_cells()), ids="/".join)
def test_the_framework_table_gives_each_cell_its_launchers(cell: tuple[str, str]) -> None:
    same(documented_cells()[cell], accepted_launchers(*cell), f"docs/frameworks.md's table, launchers of {cell}")


def test_models_and_datasets_are_listed() -> None:
    model_row, dataset_row = row(SPEC_FIELDS, "`model`")[2], row(SPEC_FIELDS, "`dataset`")[2]
    same(named(model_row, FRAMEWORKS.names()), MODELS, "docs/spec.md, field model")
    same(code(dataset_row), DATASETS, "docs/spec.md, field dataset")
    same([r[0].strip("`") for r in table(SPEC, ["model", "input", "classes", "what"])], set(MODELS) - {"sleep"},
         "docs/spec.md's model table")  # fmt: skip
    listed = re.search(r"All models \(([^)]*)\) and datasets \(([^)]*)\)", FRAMEWORKS_MD)
    assert listed is not None
    same(code(listed.group(1)), set(MODELS) - {"sleep"}, "docs/frameworks.md, All models (...)")
    same(code(listed.group(2)), DATASETS, "docs/frameworks.md, datasets (...)")


# --------------------------------------------------------------------- environments, launchers


def test_environments_are_listed() -> None:
    same(code(row(SPEC_FIELDS, "`env`")[2]), envs.NAMES, "docs/spec.md, field env")
    listed = [r[0].split()[0].strip("`") for r in table(FRAMEWORKS_MD, ["env", "holds", "pins"])]
    same(set(listed) - {".venv"}, envs.NAMES, "docs/frameworks.md's environments table")


def test_launchers_are_listed() -> None:
    same(named(row(SPEC_FIELDS, "`launcher`")[2], FRAMEWORKS.names()), LAUNCHERS.names(), "docs/spec.md, launcher")
    comment = re.search(r"launcher: \[mpirun\]\s+# (.*)", SPEC)
    assert comment is not None
    same([w.strip() for w in comment.group(1).split("|")], LAUNCHERS.names(), "docs/spec.md's example")
    launchers = table(FRAMEWORKS_MD, ["launcher", "on this host (local executor)", "in a Slurm job"])
    same([r[0].strip("`") for r in launchers], LAUNCHERS.names(), "docs/frameworks.md's launcher table")


def test_executors_are_listed() -> None:
    comment = re.search(r"^executor: local\s+# (.*)$", SPEC, re.MULTILINE)
    assert comment is not None
    listed = [part.split()[0] for part in comment.group(1).split(";")[0].split("|")]
    same(listed, EXECUTORS.names(), "docs/spec.md's example, executor")


# ------------------------------------------------------------------------------- spec fields


def test_spec_lists_every_field_option_and_choice() -> None:
    same([r[0].strip("`") for r in SPEC_FIELDS], FIELD_NAMES, "docs/spec.md's field table")
    for synonym, field in SYNONYMS.items():
        assert f"`{synonym}`" in row(SPEC_FIELDS, f"`{field}`")[2]
    options = table(SPEC, ["option", "default", "meaning"])
    same([r[0].strip("`") for r in options], [f.name for f in dataclasses.fields(Options)], "docs/spec.md, options")
    same(code(row(SPEC_FIELDS, "`device`")[2]), DEVICES, "docs/spec.md, field device")
    same(code(row(SPEC_FIELDS, "`optimizer`")[2]), OPTIMIZERS, "docs/spec.md, field optimizer")
    same(code(row(options, "`writer`")[2])[:3], WRITERS, "docs/spec.md, option writer")


# ------------------------------------------------------------------------ analysis and compare


def test_analysis_lists_the_summary_columns_in_order() -> None:
    text = doc("docs/analysis.md")
    paragraph = text.split("`DIR/summary.csv` with the full per-point timing columns:", 1)[1].split("Rows are", 1)[0]
    assert code(paragraph) == metrics.SUMMARY_COLUMNS


def test_compare_lists_its_rules() -> None:
    text = doc("docs/compare.md")
    ignored = table(text, ["field", "why it is left out"])
    same([r[0].strip("`") for r in ignored], compare.IGNORED_FIELDS, "docs/compare.md, fields left out of matching")
    synopsis = re.search(r"\[--metric ([^\]]*)\].*\[--format ([^\]]*)\]", text, re.DOTALL)
    assert synopsis is not None
    same(synopsis.group(1).split("|"), compare.METRICS, "docs/compare.md, --metric")
    same(synopsis.group(2).split("|"), compare_cli.FORMATS, "docs/compare.md, --format")
    same([code(r[0])[0] for r in table(text, ["pattern", "what it is", "e.g."])], per_run.PER_RUN_KEYS,
         "docs/compare.md, provenance left out")  # fmt: skip
    same([code(r[1])[0] for r in table(text, ["part", "masked as"])], [m for _, m, _ in per_run.PER_RUN_VALUES],
         "docs/compare.md, provenance masked")  # fmt: skip


# -------------------------------------------------------------------------------------- export

EXPORT = doc("docs/export.md")


TYPE_NAMES = {pa.bool_(): "bool", pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float32",
              pa.float64(): "float64", STRING: "string (dict.)"}  # fmt: skip


def type_name(kind: object) -> str:
    return TYPE_NAMES[kind]


def meaning(column: Column) -> str:
    """A column's meaning as the docs write it: its declaration's, a <tag> as code."""
    return re.sub(r"(<\w+>)", r"`\1`", column.doc).replace("|", "\\|")


def rendered(column: Column) -> str:
    """The docs' row of a column (tables in docs/export.md are written from this)."""
    return f"| `{column.name}` | {type_name(column.type)} | {column.unit} | {meaning(column)} |"


POINT_FIELDS_ROW = "per field"  # points.parquet: the Point's fields, one row for all


@pytest.mark.parametrize("name", PARQUET_TABLES)
def test_export_documents_every_column_as_declared(name: str) -> None:
    columns = TABLES[name]
    rows = table(EXPORT, ["column", "type", "unit", "meaning"], after=f"### `{name}.parquet`")
    documented: list[str] = []
    declared = {c.name: c for c in columns}
    for cell_names, kind, unit, text in rows:
        names = code(cell_names)
        documented += names
        if kind == POINT_FIELDS_ROW:
            same(names, FIELD_NAMES, f"docs/export.md, {name}.parquet's Point fields")
            continue
        (column,) = [declared[n] for n in names]
        shown = (kind, unit, text.replace("`", ""))
        assert shown == (type_name(column.type), column.unit, column.doc), f"{name}.parquet, {column.name}"
    assert documented == [c.name for c in columns], f"docs/export.md: {name}.parquet's columns or their order"


def test_export_lists_its_formats_files_and_version() -> None:
    options = table(EXPORT, ["option", "meaning"])
    same(code(row(options, "`-f`, `--format`")[1])[:3], FORMATS, "docs/export.md, --format")
    written = EXPORT.split("What is written:", 1)[1].split("```", 2)[1]
    names = {line.split()[0].removeprefix("DIR/") for line in written.splitlines() if line.strip()}
    same(names, {f"{t}.parquet" for t in PARQUET_TABLES} | {"summary.json", "mllog/<point>.log"},
         "docs/export.md, what is written")  # fmt: skip
    block = EXPORT.split("## summary.json", 1)[1].split("```json\n")[1].split("```")[0]
    example = json.loads(re.sub(r",?\s*\.\.\.", "", block))  # the example without its "..."
    assert example["hpcbench_version"] == hpcbench.__version__, "docs/export.md's summary.json example"
