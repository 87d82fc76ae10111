"""The one `hpcbench` command: its subcommands, and that they are the kept `python -m` entries."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hpcbench.cli.main import SUBCOMMANDS
from tests.conftest import ROOT, run_module, spec_text


def test_help_lists_every_subcommand() -> None:
    res = run_module("hpcbench", "--help")
    assert res.returncode == 0
    for name in ("run", "status", "resume", "cancel", "check", "analyze", "report", "trace", "commbench", "predict",
                 "compare", "export"):  # fmt: skip
        assert name in {cmd.name for cmd in SUBCOMMANDS}
        assert f"\n    {name}" in res.stdout, res.stdout


def test_console_script_is_installed() -> None:
    script = ROOT / ".venv" / "bin" / "hpcbench"
    text = script.read_text()
    assert "hpcbench.cli.main" in text


def test_unknown_subcommand_is_a_usage_error() -> None:
    res = run_module("hpcbench", "bogus")
    assert res.returncode == 2
    assert "invalid choice: 'bogus'" in res.stderr


def test_run_dry_run_is_the_sweep_entry_point(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = write_spec(spec_text("same", {"ranks_per_node": [1, 2]}))
    out = tmp_path / "sweep"
    new = run_module("hpcbench", "run", str(spec), "--out", str(out), "--dry-run")
    old = run_module("hpcbench.sweep", str(spec), "--out", str(out), "--dry-run")
    assert new.returncode == old.returncode == 0
    assert new.stdout == old.stdout
    assert "2 points" in new.stdout
    assert not out.exists()  # a dry run creates nothing


def test_errors_name_the_command_used(tmp_path: Path) -> None:
    res = run_module("hpcbench", "analyze", str(tmp_path / "none"))
    assert res.returncode == 2  # bad input (docs/running.md#outputs-and-exit-codes)
    assert res.stderr.strip() == f"hpcbench: error: {tmp_path / 'none'}: no such sweep directory"
    res = run_module("hpcbench.analyze", str(tmp_path / "none"))
    assert res.stderr.startswith("hpcbench.analyze: error: ")
    res = run_module("hpcbench", "commbench", "--sizes", "nonsense")
    assert res.returncode == 2
    assert res.stderr.startswith("hpcbench commbench: error: --sizes:")


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    # `hpcbench analyze DIR | head`: the pipe closes before everything is written.
    code = (
        "import sys; from hpcbench.cli.pipes import quiet_on_closed_pipe\n"
        "def main() -> int:\n    print('row\\n' * 200000)\n    return 0\n"
        "sys.exit(quiet_on_closed_pipe(main)())"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
