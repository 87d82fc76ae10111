"""Nothing a sweep writes may land outside its directory: `..`, absolute names, symlinks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcbench.errors import HpcbenchError
from hpcbench.sweepdir.layout import SweepDir
from hpcbench.sweepdir.manifest import Manifest
from hpcbench.sweepdir.paths import inside
from tests.conftest import run_module, spec_text


def test_plain_names_stay_inside(tmp_path: Path) -> None:
    assert inside(tmp_path, "logs/abc.log") == tmp_path / "logs" / "abc.log"
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sub")  # a link that stays inside is fine
    assert inside(tmp_path, "link/x.h5") == tmp_path / "link" / "x.h5"


@pytest.mark.parametrize("name", ["../x.h5", "logs/../../x", "/etc/passwd", "", "."])
def test_names_that_leave_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(HpcbenchError, match="not a plain path inside the sweep directory"):
        inside(tmp_path, name)


def test_symlinks_that_leave_are_refused(tmp_path: Path) -> None:
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    sweep.mkdir()
    elsewhere.mkdir()
    (sweep / "logs").symlink_to(elsewhere)
    with pytest.raises(HpcbenchError, match="leads out of the sweep directory"):
        inside(sweep, "logs/a.log")
    (sweep / "0123456789ab.h5").symlink_to(elsewhere / "precious.h5")  # dangling: would be created there
    with pytest.raises(HpcbenchError, match="leads out of the sweep directory"):
        SweepDir(sweep).result("0123456789ab")


def test_manifest_with_a_path_in_a_point_id_is_refused(tmp_path: Path) -> None:
    entry = {"id": "../../etc/x", "label": "", "point": {}}
    data = {"version": 1, "name": "s", "executor": "local", "entries": [entry]}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(HpcbenchError, match="not 12 hex digits"):
        Manifest.load(tmp_path)


def test_a_run_through_a_symlink_out_of_the_sweep_writes_nothing_there(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("escape", framework="synthetic", backend="none", model="sleep", iterations=2))
    out, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "logs").symlink_to(elsewhere)
    res = run_module("hpcbench.sweep", str(spec), "--out", str(out))
    assert res.returncode == 2
    assert "leads out of the sweep directory" in res.stderr
    assert list(elsewhere.iterdir()) == []
    # refused before anything is written: no manifest, spec or points/ beside the link
    assert [p.name for p in out.iterdir()] == ["logs"]
