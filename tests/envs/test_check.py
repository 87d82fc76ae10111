"""`python -m hpcbench.sweep check` against the real interpreters: .venv and the built envs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench.frameworks import FRAMEWORKS
from tests.conftest import run_module

pytestmark = pytest.mark.slow


def sections(stdout: str) -> dict[str, list[str]]:
    """The output's blocks by label ("this interpreter", "env modern", ...): heading first."""
    found = {}
    for block in stdout.strip().split("\n\n"):
        lines = block.splitlines()
        found[lines[0].split(":", 1)[0]] = lines
    return found


def table(lines: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """(framework, backend) -> column -> "works" / "no [n]", from one block's table."""
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


@pytest.fixture(scope="module")
def report() -> dict[str, list[str]]:
    result = run_module("hpcbench.sweep", "check", timeout=900)
    assert result.returncode == 0, result.stderr
    return sections(result.stdout)


def test_torch_gloo_works_in_this_interpreter(report: dict[str, list[str]]) -> None:
    lines = report["this interpreter"]
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


def test_modern_has_torch_tensorflow_and_horovod(modern: Path, report: dict[str, list[str]]) -> None:
    lines = report["env modern"]
    assert str(modern) in lines[0]
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
    note = refused.rsplit("[", 1)[1].rstrip("]")
    assert any(line.strip().startswith(f"[{note}] PyTensor's Numba linker") for line in lines), lines
    if "tensorflow" in FRAMEWORKS.names():
        for (framework, _), row in cells.items():
            if framework == "tensorflow":
                assert row["imports"] == "works"


def test_legacy_has_mxnet_and_horovod(legacy: Path, report: dict[str, list[str]]) -> None:
    lines = report["env legacy"]
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


def test_unbuilt_environments_are_listed_with_the_build_command(tmp_path: Path) -> None:
    result = run_module("hpcbench.sweep", "check", env={"HPCBENCH_ENVS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    found = sections(result.stdout)
    for name in ("modern", "legacy"):
        assert found[f"env {name}"][0].startswith(f"env {name}: not built: bash envs/build.sh {name} ")
        assert str(tmp_path / name) in found[f"env {name}"][0]
    assert "this interpreter" in found
