"""`python -m hpcbench.sweep check` against the real interpreters: .venv and the built envs.

Probing is slow (seconds an environment), so every environment is probed once for the module
(`results`, as `check` does it) and the command then runs in this process on those reports:
the one table, `--json`, `--env NAME`. The test of unbuilt environments runs the command for
real, in a process of its own."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from hpcbench.cli import check
from hpcbench.cli.sweep import main
from hpcbench.frameworks import FRAMEWORKS
from hpcbench.plan import capabilities
from tests.conftest import run_module

pytestmark = pytest.mark.slow

Results = list[tuple[str, Any]]


@pytest.fixture(scope="module")
def results() -> Results:
    """(environment, report or why there is none) of .venv and every named environment, probed once."""
    return capabilities.survey()


def cli(results: Results, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    """`check ARGS` through the sweep command's parser, on the reports of `results`."""

    def survey(only: str | None = None) -> Results:
        allowed = [label for label, _ in results]
        if only is not None and only not in allowed:
            return capabilities.survey(only)  # raises, naming the allowed ones
        return [(label, result) for label, result in results if only in (None, label)]

    monkeypatch.setattr(check, "survey", survey)
    out = io.StringIO()
    code = main(["check", *args], out=out)
    return code, out.getvalue()


def blocks(stdout: str) -> dict[str, list[str]]:
    """The output's blocks by their heading's first word ("Where", "Why", "Models", "Environments")."""
    return {block.split(None, 1)[0]: block.splitlines() for block in stdout.strip().split("\n\n")}


def one_table(lines: list[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(framework, backend) -> (its environments or "nowhere [n]", its launchers), from the
    one table (its heading line and header left out)."""
    header = lines[1]
    at = [header.index(column) for column in ("backend", "environments", "launchers")]
    rows = {}
    for line in lines[2:]:
        cells = [line[:at[0]], line[at[0]:at[1]], line[at[1]:at[2]], line[at[2]:]]  # fmt: skip
        framework, backend, environments, launchers = (cell.strip() for cell in cells)
        assert (framework, backend) not in rows, line
        rows[framework, backend] = (environments, launchers)
    return rows


def names(launchers: str) -> list[str]:
    """The launchers of a row, without the environments a launcher works in only some of."""
    return re.sub(r" \([^)]*\)", "", launchers).split(", ")


def notes(lines: list[str]) -> dict[str, tuple[list[str], str]]:
    """ "n" -> (the rows a reason stands for, the reason), from the reasons' block."""
    found = {}
    for line in lines[1:]:
        ref, rest = line.strip().split(" ", 1)
        names, reason = rest.split(": ", 1)
        found[ref.strip("[]")] = (names.split(", "), reason)
    return found


def table(lines: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """(framework, backend) -> column -> "works" / "no [n]", from one environment's detailed table."""
    header = lines[1].split()
    rows = {}
    for line in lines[2:]:
        words = line.split()
        items = ("import", "launcher", "module", "models")  # the lines after the table
        if len(words) < len(header) or words[0] in items or words[0].startswith("["):
            continue
        cells = [w for w in words[2:] if w != "no"]  # "no [1]" -> "[1]"
        if len(cells) == len(header) - 2:
            rows[words[0], words[1]] = dict(zip(header[2:], cells, strict=True))
    return rows


def item(lines: list[str], name: str) -> str:
    """The text after an item's name ("import tensorflow", "parallel HDF5", ...)."""
    for line in lines:
        if line.strip().startswith(name + " "):
            return line.strip()[len(name) :].strip()
    raise AssertionError(f"no {name!r} line in:\n" + "\n".join(lines))


def test_one_table_has_a_row_per_framework_and_backend(results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stdout = cli(results, monkeypatch)
    assert code == 0
    found = blocks(stdout)
    rows = one_table(found["Where"])
    by_name = sorted(FRAMEWORKS, key=lambda fw: fw.name)
    assert list(rows) == [(fw.name, backend) for fw in by_name for backend in fw.backends]
    this = capabilities.this_label()
    environments, launchers = rows["torch", "gloo"]
    assert this in environments.split(", ")
    assert {"mpirun", "torchrun"} <= set(names(launchers))
    # every row that works nowhere points at reasons, each listed once, naming its rows
    reasons = notes(found.get("Why", ["Why"]))
    assert len({reason for _, reason in reasons.values()}) == len(reasons)
    for (framework, backend), (environments, launchers) in rows.items():
        if environments.startswith("nowhere ["):
            assert launchers == ""
            for ref in environments.removeprefix("nowhere [").rstrip("]").split(", "):
                assert f"{framework}/{backend}" in reasons[ref][0]
        else:
            assert launchers, (framework, backend)
    # each environment named below the table, with its interpreter
    listed = {line.split()[0] for line in found["Environments"][1:] if not line.startswith("   ")}
    assert listed == {label for label, _ in results}


def test_a_reason_several_rows_share_is_printed_once(results: Results) -> None:
    """In .venv alone chainer does not import: its two backends share that one reason."""
    venv = [(label, report) for label, report in results if label == capabilities.this_label()]
    found = blocks(check.overview(venv))
    rows = one_table(found["Where"])
    naive, pure_nccl = rows["chainer", "naive"][0], rows["chainer", "pure_nccl"][0]
    assert naive == pure_nccl and naive.startswith("nowhere ["), (naive, pure_nccl)
    reasons = notes(found["Why"])
    named, reason = reasons[naive.removeprefix("nowhere [").rstrip("]")]
    assert named == ["chainer/naive", "chainer/pure_nccl"]
    assert reason.startswith("chainer: ModuleNotFoundError")
    assert sum(reason in line for line in found["Why"]) == 1


def test_models_refused_are_summarised_once_per_framework_and_reason(
    legacy: Path, results: Results, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = blocks(cli(results, monkeypatch)[1])["Models"]
    mxnet = [line.strip() for line in lines if line.strip().startswith("mxnet: ")]
    assert mxnet == [f"mxnet: the 9 transformers: {FRAMEWORKS.get('mxnet').refusals['gpt2_124m']}"]
    assert "gpt2_124m, gpt2_350m, llama_1b" in lines[0]  # the transformers named once, in the heading


def test_json_parses_and_agrees_with_the_table(results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stdout = cli(results, monkeypatch, "--json")
    assert code == 0
    data = json.loads(stdout)
    assert data["version"] == check.JSON_VERSION
    _, text = cli(results, monkeypatch)
    found = blocks(text)
    rows = one_table(found["Where"])
    reasons = {reason for _, reason in notes(found.get("Why", ["Why"])).values()}
    assert [(r["framework"], r["backend"]) for r in data["rows"]] == list(rows)
    for row in data["rows"]:
        environments, launchers = rows[row["framework"], row["backend"]]
        if row["environments"]:
            assert environments == ", ".join(row["environments"])
            assert names(launchers) == row["launchers"]
            assert row["reasons"] == {}
        else:
            assert environments.startswith("nowhere [") and row["launchers"] == []
            assert all(any(text.startswith(reason) for text in reasons) for reason in row["reasons"])
    # every environment's report, whole; the table rebuilt from them is the one printed
    assert [label for label, _ in results] == list(data["environments"])
    again = [(label, e["error"] if e["report"] is None else e["report"]) for label, e in data["environments"].items()]
    assert check.overview(again) == text.rstrip("\n")


def test_env_shows_one_environment_in_detail(modern: Path, results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stdout = cli(results, monkeypatch, "--env", "modern")
    assert code == 0
    lines = stdout.strip().splitlines()
    assert lines[0] == f"modern: {modern} (Python {lines[0].rsplit('(Python ', 1)[1]}"
    assert "\n\n" not in stdout.strip()  # that environment alone
    assert item(lines, "import tensorflow") == "works: 2.21.0"
    assert item(lines, "import torch").startswith("works: 2.13.0")
    for module in ("horovod.torch", "horovod.tensorflow"):
        assert item(lines, f"import {module}") == "works: 0.28.1 (built with mpi, gloo)"
    assert item(lines, "parallel HDF5").startswith("works")
    assert item(lines, "build record").startswith("works: ")
    cells = table(lines)
    assert cells[("torch", "horovod")]["imports"] == "works"
    assert cells[("torch", "horovod")]["mpirun"] == "works"
    # PyTensor (Theano's successor, here) refuses the models its linker compiles for too long, and says why
    refused = item(lines, "models theano")
    assert refused.startswith("all but googlenet, resnet50, inception_v3 ["), refused
    note = refused.split(" [", 1)[1].split("]", 1)[0]
    assert any(line.strip().startswith(f"[{note}] PyTensor's Numba linker") for line in lines), lines
    if "tensorflow" in FRAMEWORKS.names():
        for (framework, _), row in cells.items():
            if framework == "tensorflow":
                assert row["imports"] == "works"


def test_this_interpreter_in_detail(results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stdout = cli(results, monkeypatch, "--env", capabilities.this_label())
    assert code == 0
    lines = stdout.strip().splitlines()
    cells = table(lines)[("torch", "gloo")]
    assert cells["imports"] == "works"
    assert cells["mpirun"] == "works"
    assert cells["torchrun"] == "works"
    assert item(lines, "parallel HDF5").startswith("works: h5py")
    # envs/setup.sh wrote the build record; the libraries loaded are those it names
    assert item(lines, "build record").startswith("works: ")
    # No GPU on the CI machine: NVML is listed with the reason, not an error of the command.
    nvml = item(lines, "NVML")
    assert nvml.startswith("works") or "NVMLError" in nvml


def test_legacy_has_mxnet_and_horovod(legacy: Path, results: Results, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = cli(results, monkeypatch, "--env", "legacy")[1].strip().splitlines()
    assert str(legacy) in lines[0]
    assert item(lines, "import mxnet") == "works: 1.9.1"
    assert item(lines, "import numpy") == "works: 1.23.5"
    assert item(lines, "import horovod.mxnet") == "works: 0.28.1 (built with mpi, gloo)"
    assert item(lines, "parallel HDF5").startswith("works")
    assert item(lines, "build record").startswith("works: ")
    if "mxnet" in FRAMEWORKS.names():
        for (framework, _), row in table(lines).items():
            if framework == "mxnet":
                assert row["imports"] == "works"


def test_an_unknown_env_is_refused_naming_the_allowed_ones() -> None:
    result = run_module("hpcbench.sweep", "check", "--env", "nope")  # refused before anything is probed
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "--env: no environment 'nope' (allowed: " in result.stderr
    assert "modern, legacy" in result.stderr


def test_unbuilt_environments_are_listed_with_the_build_command(tmp_path: Path) -> None:
    result = run_module("hpcbench.sweep", "check", "--json", env={"HPCBENCH_ENVS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # the JSON alone on stdout, whatever the probes print
    environments = data["environments"]
    for name in ("modern", "legacy"):
        assert environments[name]["report"] is None
        assert environments[name]["error"].startswith(f"not built: bash envs/build.sh {name} ")
        assert str(tmp_path / name) in environments[name]["error"]
    this = next(iter(environments))
    assert environments[this]["report"]["python"]
    rows = {(r["framework"], r["backend"]): r for r in data["rows"]}
    assert rows["torch", "gloo"]["environments"] == [this]
    results = [(label, e["error"] if e["report"] is None else e["report"]) for label, e in environments.items()]
    listed = blocks(check.overview(results))["Environments"]
    assert any(line.split()[:4] == ["modern", "not", "built:", "bash"] for line in listed), listed
