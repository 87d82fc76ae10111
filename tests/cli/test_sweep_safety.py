"""The sweep commands (run, status, resume, cancel) under the one error policy
(docs/running.md#outputs-and-exit-codes): bad input of any kind is one line on stderr and exit
2, with no traceback and no file changed; a failed point is exit 1; success 0. And what `run`
writes: `--out` is checked before anything is planned or written, values no machine runs are
refused with their range, the plan tells apart points that differ only in fields it has no
column for, and the analysis is named only when some point is complete.

Most cases run the command in this process on fabricated sweep directories or with --dry-run
(no rank starts); the few that need a finished point run one tiny synthetic point."""

from __future__ import annotations

import io
import math
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcbench.cli import main as cli
from hpcbench.cli import sweep as sweep_cli
from hpcbench.errors import SpecError
from hpcbench.executors import catalog
from hpcbench.plan.launch import parse_sweep
from hpcbench.spec import fields, load_sweep
from hpcbench.sweepdir.manifest import DONE, FAILED, PENDING, Manifest
from tests.cli.test_outputs import digest
from tests.conftest import run_module, spec_text

SYNTHETIC: dict[str, Any] = {"framework": "synthetic", "backend": "none", "model": "sleep", "warmup": 0}


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    """The sweep command installs its SIGTERM handler; this process keeps its own."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def hpcbench(*args: str | Path) -> tuple[int, str]:
    """`hpcbench ARGS` in this process: its exit status (argparse's too) and stdout."""
    out = io.StringIO()
    try:
        code = cli.main([str(a) for a in args], out)
    except SystemExit as exc:  # argparse refuses by exiting
        code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue()


def refused(capsys: pytest.CaptureFixture[str], needle: str, *args: str | Path) -> str:
    """Exit 2, one line on stderr (after argparse's usage line, if any) holding `needle`, no
    traceback, nothing planned on stdout. The error line."""
    code, stdout = hpcbench(*args)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("usage: ")]
    assert code == 2, (code, stdout, err)
    assert "Traceback" not in err and len(lines) == 1 and needle in lines[0], err
    assert "points, executor" not in stdout, stdout
    return lines[0]


def fabricated(directory: Path, name: str = "fab", states: tuple[str, ...] = (DONE, DONE)) -> Path:
    """A sweep directory as `run` leaves it, without running anything: spec.yaml, and a
    manifest whose points have `states`."""
    text = spec_text(name, {"seed": list(range(len(states)))}, **SYNTHETIC)
    directory.mkdir(parents=True)
    (directory / "spec.yaml").write_text(text)
    manifest = Manifest(directory, name, "local")
    for point, state in zip(parse_sweep(text, catalog()).points, states, strict=True):
        entry = manifest.add(point)
        entry.state = state
        entry.reason = "exit code 1; see logs/x.log" if state == FAILED else ""
    manifest.save()
    (directory / "logs").mkdir()
    (directory / "points").mkdir()
    return directory


@pytest.fixture
def area(tmp_path: Path) -> Path:
    """A spec, a file, another sweep; their digest is checked unchanged by each refusal."""
    (tmp_path / "spec.yaml").write_text(spec_text("safe", **SYNTHETIC))
    (tmp_path / "notes.txt").write_text("mine\n")
    fabricated(tmp_path / "other")
    return tmp_path


# ------------------------------------------------------------------------------------------
# run --out


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        ("notes.txt", "--out: {area}/notes.txt: is a regular file, not a directory"),
        ("notes.txt/below", "--out: {area}/notes.txt/below: cannot be written (Not a directory)"),
        ("spec.yaml", "--out: {area}/spec.yaml: is a regular file, not a directory"),
        ("/dev/null", "--out: /dev/null: is a character device, not a directory"),
        ("other/logs", "is the sweep directory {area}/other's own folder logs/"),
        ("other/logs/new", "is inside the sweep directory {area}/other's own folder logs/"),
        ("other/points", "is the sweep directory {area}/other's own folder points/"),
        ("x.h5", "has a point file's name"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_run_refuses_an_out_it_may_not_write_before_anything(
    area: Path, out: str, needle: str, dry_run: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    before = digest(area)
    target = out if out.startswith("/") else str(area / out)
    args: list[str | Path] = ["run", area / "spec.yaml", "--out", target, *(["--dry-run"] if dry_run else [])]
    line = refused(capsys, needle.format(area=area), *args)
    assert line.startswith("hpcbench: error: --out: ")
    assert digest(area) == before


@pytest.mark.parametrize("link", ["logs", "points"])
def test_a_linked_logs_or_points_is_refused_before_the_manifest_spec_and_run_files(
    tmp_path: Path, link: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("linked", **SYNTHETIC))
    out, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / link).symlink_to(elsewhere)
    before = digest(tmp_path)
    refused(capsys, "leads out of the sweep directory", "run", spec, "--out", out)
    assert digest(tmp_path) == before  # no manifest.json, spec.yaml, points/ or lock
    assert sorted(p.name for p in out.iterdir()) == [link] and list(elsewhere.iterdir()) == []


def test_a_linked_lock_is_never_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = fabricated(tmp_path / "sweep", states=(PENDING, PENDING))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (sweep / ".lock").symlink_to(victim)
    before = digest(tmp_path)
    refused(capsys, "is a symbolic link", "resume", sweep)
    assert digest(tmp_path) == before and victim.read_text() == "precious\n"


def test_another_sweeps_directory_is_refused_with_exit_2(area: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = digest(area)
    refused(capsys, "holds sweep 'fab', not 'safe'", "run", area / "spec.yaml", "--out", area / "other", "--dry-run")
    assert digest(area) == before


# ------------------------------------------------------------------------------------------
# status, resume, cancel: bad directories and arguments


@pytest.mark.parametrize("command", ["status", "resume", "cancel"])
@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("notes.txt", "notes.txt: not a sweep directory (not a directory)"),
        ("missing", "missing: not a sweep directory (no such directory)"),
        ("other/logs", "logs: not a sweep directory (no manifest.json)"),
    ],
)
def test_a_sweep_command_on_what_is_no_sweep_directory_is_one_line_and_exit_2(
    area: Path, command: str, target: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = digest(area)
    refused(capsys, needle, command, area / target)
    assert digest(area) == before


def test_a_damaged_manifest_is_one_line_and_exit_2(area: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (area / "other" / "manifest.json").write_text("{not json")
    before = digest(area)
    for command in ("status", "resume", "cancel"):
        refused(capsys, "unreadable manifest", command, area / "other")
    assert digest(area) == before


@pytest.mark.parametrize("interval", ["-1", "nan", "inf", "-inf", "0", "0.05", "1e400", "soon"])
def test_status_refuses_an_interval_that_would_spin_or_never_poll(
    area: Path, interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = digest(area)
    line = refused(capsys, "argument --interval:", "status", area / "other", "--wait", f"--interval={interval}")
    assert (
        f"seconds from {sweep_cli.MIN_INTERVAL_S:g} to {sweep_cli.MAX_INTERVAL_S:g}" in line or "not a number" in line
    )
    assert digest(area) == before


def test_status_takes_intervals_in_range() -> None:
    for text, value in (("0.1", 0.1), ("2", 2.0), ("3600", 3600.0)):
        args = sweep_cli.parser().parse_args(["status", "DIR", "--wait", "--interval", text])
        assert math.isclose(args.interval, value)


def test_status_exits_1_when_a_point_failed_and_0_when_all_are_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = fabricated(tmp_path / "done")
    failed = fabricated(tmp_path / "failed", states=(DONE, FAILED))
    code, stdout = hpcbench("status", done)
    assert code == 0 and "2 done" in stdout
    code, stdout = hpcbench("status", failed)
    assert code == 1 and "1 failed" in stdout and "exit code 1" in stdout  # a result, not an error
    assert capsys.readouterr().err == ""


def test_cancel_with_nothing_running_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = fabricated(tmp_path / "sweep", states=(DONE, PENDING))
    code, stdout = hpcbench("cancel", sweep)
    assert code == 0 and stdout.strip() == f"nothing to cancel: no point of {sweep} is queued or running"
    assert {e.state for e in Manifest.load(sweep).entries.values()} == {DONE, PENDING}


def test_the_issues_cases_as_a_user_runs_them(area: Path) -> None:
    """Through `python -m hpcbench`: what gave a traceback is one line and exit 2."""
    before = digest(area)
    for args in (
        ["run", str(area / "spec.yaml"), "--out", str(area / "notes.txt")],
        ["run", str(area / "spec.yaml"), "--out", str(area / "notes.txt" / "below")],
        ["status", str(area / "notes.txt")],
        ["status", str(area / "other"), "--wait", "--interval", "nan"],
    ):
        res = run_module("hpcbench", *args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr)
        assert res.stderr.strip().splitlines()[-1].startswith(("hpcbench: error: ", "hpcbench status: error: "))
    assert digest(area) == before


# ------------------------------------------------------------------------------------------
# Values beyond any machine


LIMITS = {
    "nodes": fields.MAX_NODES,
    "ranks_per_node": fields.MAX_RANKS_PER_NODE,
    "batch_size": fields.MAX_BATCH_SIZE,
    "iterations": fields.MAX_ITERATIONS,
    "warmup": fields.MAX_ITERATIONS,
    "epochs": fields.MAX_EPOCHS,
    "threads": fields.MAX_THREADS,
    "seed": fields.MAX_SEED,
}


@pytest.mark.parametrize("field", sorted(LIMITS))
def test_values_beyond_any_machine_are_refused_with_their_range(field: str) -> None:
    limit, least = LIMITS[field], 0 if field in ("warmup", "seed") else 1
    load_sweep(f"name: t\nfixed: {{{field}: {limit}}}\n")  # the limit itself is allowed
    for value in (limit + 1, 10**29):
        with pytest.raises(SpecError) as info:
            load_sweep(f"name: t\nmatrix: {{{field}: [1, {value}]}}\n")
        allowed = f"integers >= {least} and <= {limit}"
        assert str(info.value) == f"matrix.{field}[1]: {value} is too large (allowed: {allowed})"


def test_the_limits_are_generous() -> None:
    assert fields.MAX_NODES >= 10_000 and fields.MAX_RANKS_PER_NODE >= 256
    assert fields.MAX_BATCH_SIZE >= 2**20 and fields.MAX_ITERATIONS >= 10**8


@pytest.mark.parametrize(("field", "value"), [("batch_size", 10**29), ("nodes", 10**12)])
def test_the_issues_huge_values_are_refused_before_the_plan(
    tmp_path: Path, field: str, value: int, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: huge\nfixed: {{{field}: {value}}}\n")
    before = digest(tmp_path)
    refused(capsys, f"fixed.{field}: {value} is too large", "run", spec, "--out", tmp_path / "out", "--dry-run")
    assert digest(tmp_path) == before


# ------------------------------------------------------------------------------------------
# The plan and the last line


def test_the_plan_names_what_tells_points_apart_where_its_columns_do_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        spec_text("apart", {"seed": [0, 1], "ranks_per_node": [1, 2]}, **SYNTHETIC, extra={"forward_s": 0.001})
    )
    code, stdout = hpcbench("run", spec, "--out", tmp_path / "out", "--dry-run")
    assert code == 0, capsys.readouterr().err
    table = [line.split() for line in stdout.splitlines()[1:6]]
    assert table[0][-2:] == ["differs", "in"]
    assert sorted(row[-1] for row in table[1:]) == ["seed=0", "seed=0", "seed=1", "seed=1"]
    assert not (tmp_path / "out").exists()
    # points that the columns tell apart get no column
    spec.write_text(spec_text("plain", {"ranks_per_node": [1, 2]}, **SYNTHETIC))
    code, stdout = hpcbench("run", spec, "--out", tmp_path / "out", "--dry-run")
    assert code == 0 and "differs in" not in stdout


def test_the_plan_shows_extra_and_environ_differences(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: extras\nmatrix:\n  extra: [{forward_s: 0.001}, {forward_s: 0.002}]\n"
        "  environ: [{A: '1'}, {A: '2'}]\nfixed: {framework: synthetic, backend: none, model: sleep}\n"
    )
    code, stdout = hpcbench("run", spec, "--out", tmp_path / "out", "--dry-run")
    assert code == 0
    rows = [line for line in stdout.splitlines() if "synthetic" in line and "mpirun -n" not in line]
    assert len(rows) == 4 and len({row.split("  ")[-1] for row in rows}) == 4, stdout
    assert all("environ.A=" in row and "extra.forward_s=" in row for row in rows), stdout


@pytest.mark.mpi
def test_the_analysis_is_named_only_when_a_point_is_complete(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    # the spec given is the sweep's own spec.yaml: it is read, and left as it is (same inode)
    out = tmp_path / "sweep"
    out.mkdir()
    spec = out / "spec.yaml"
    spec.write_text(spec_text("hint", iterations=2, **SYNTHETIC))
    inode = os.stat(spec).st_ino
    res = run_module("hpcbench", "run", str(spec), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == f"next: python -m hpcbench.analyze {out}"
    assert os.stat(spec).st_ino == inode
    failing = tmp_path / "failing"
    res = run_module("hpcbench", "run", str(spec), "--out", str(failing), env={"HPCBENCH_FAULT": "0:0"})
    assert res.returncode == 1, res.stdout + res.stderr  # the results show a problem
    assert res.stdout.splitlines()[-1] == f"0 of 1 points done; results in {failing}"
    assert "hpcbench.analyze" not in res.stdout
