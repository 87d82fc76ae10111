"""A new launcher is one new module: a toy launcher registered from the test tree (a plugin
named in $HPCBENCH_PLUGINS) runs a real two-rank PyTorch point through the `hpcbench`
command, and its ranks read their layout through the toy's own `rank_env`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hpcbench.launchers import LAUNCHERS, detect
from hpcbench.rank.env import RankEnv
from hpcbench.store.reader import read_point
from tests.conftest import ROOT, run_module, spec_text

PLUGIN = {"HPCBENCH_PLUGINS": "tests.plugins.toy_launcher", "PYTHONPATH": str(ROOT)}


def test_the_plugin_registers_and_is_asked_first_for_its_own_variables() -> None:
    import tests.plugins.toy_launcher  # noqa: F401 - what $HPCBENCH_PLUGINS makes every registry import

    assert "toy" in LAUNCHERS.names()
    env = {"TOY_RANK": "1", "TOY_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
    assert detect(env, hostname="h", launcher="toy") == RankEnv(1, 2, 1, 2, 0, "h", "toy", mpi=False)
    # a process that does not know its launcher: the lower detect_order wins
    assert detect(env, hostname="h").source == "toy"
    assert detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, hostname="h").source == "openmpi"


def test_a_sweep_runs_through_a_launcher_from_a_plugin(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    text = spec_text("toy", {"ranks_per_node": [2]}, framework="torch", backend="gloo", launcher="toy", iterations=3)
    spec = write_spec(text)
    out = tmp_path / "sweep"
    res = run_module("hpcbench", "run", str(spec), "--out", str(out), env=PLUGIN, timeout=300)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in (out / "logs").glob("*.log"))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    (path,) = out.glob("*.h5")
    data = read_point(path)
    assert data.point.launcher == "toy"
    assert data.provenance["launcher_source"] == "toy"  # every rank read the toy's variables
    assert sorted(data.ranks["rank"].tolist()) == [0, 1]
    assert (data.iterations["t_end"] > data.iterations["t_start"]).all()


def test_without_the_plugin_the_launcher_is_unknown(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(spec_text("toy", framework="torch", backend="gloo", launcher="toy"))
    res = run_module("hpcbench", "run", str(spec), "--out", str(tmp_path / "sweep"))
    assert res.returncode == 2
    assert "'toy'" in res.stderr and "mpirun" in res.stderr
    assert not (tmp_path / "sweep").exists()
