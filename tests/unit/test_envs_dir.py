"""Where named environments are looked for: a checkout's .envs/, else the user's data directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.plan import envs


def test_root_is_the_folder_holding_the_package() -> None:
    assert (envs.ROOT / "hpcbench" / "__init__.py").is_file()


def test_a_checkout_uses_its_own_envs_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCBENCH_ENVS_DIR", raising=False)
    assert (envs.ROOT / "envs" / "build.sh").is_file()  # these tests run from a checkout
    assert envs.envs_dir() == envs.ROOT / ".envs"


def test_the_variable_wins_and_an_installed_package_uses_the_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HPCBENCH_ENVS_DIR", str(tmp_path / "mine"))
    assert envs.envs_dir() == tmp_path / "mine"
    monkeypatch.delenv("HPCBENCH_ENVS_DIR")
    monkeypatch.setattr(envs, "ROOT", tmp_path / "site-packages")  # no envs/build.sh beside the package
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert envs.envs_dir() == tmp_path / "data" / "hpcbench" / "envs"


def test_the_build_command_says_where_an_installed_package_looks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HPCBENCH_ENVS_DIR", raising=False)
    assert envs.build_command("modern") == "bash envs/build.sh modern"  # a checkout: its own .envs
    monkeypatch.setattr(envs, "ROOT", tmp_path / "site-packages")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "my data"))
    where = tmp_path / "my data" / "hpcbench" / "envs"
    assert (
        envs.build_command("legacy") == f"HPCBENCH_ENVS_DIR='{where}' bash envs/build.sh legacy (in a source checkout)"
    )
    with pytest.raises(HpcbenchError, match=r"environment 'legacy' is not built .*HPCBENCH_ENVS_DIR="):
        envs.python("legacy")
