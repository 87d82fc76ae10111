"""The error policy of analyze, report, trace, predict, compare and export
(docs/running.md#outputs-and-exit-codes): bad input of any kind is one line on stderr and exit
2, a regression exit 1, success 0; no traceback without -v; no input file ever changes.
The sweeps are fabricated point files (no ranks run)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import h5py
import pytest
import yaml

from hpcbench.analysis.model import forecast
from hpcbench.cli import failure
from hpcbench.errors import HpcbenchError
from hpcbench.spec import Point
from hpcbench.store.reader import read_point
from hpcbench.testing.arrays import iterations
from hpcbench.testing.fabricate import write_point_file
from tests.cli.test_outputs import (
    PREDICTION,
    ROOT_USER,
    digest,
    hpcbench,
    point_file,
    untouched,  # noqa: F401 - the fixture every test here uses
    write_sweep,
)
from tests.conftest import run_module

DAMAGED_ID, GARBAGE_ID = "0123456789ab", "fedcba987654"


def damage(directory: Path) -> None:
    """Two point files that cannot be read: one says complete and holds nothing, one is not HDF5."""
    with h5py.File(directory / f"{DAMAGED_ID}.h5", "w") as f:
        f.attrs["status"] = "complete"
        f.attrs["schema_version"] = 3
    (directory / f"{GARBAGE_ID}.h5").write_bytes(b"not HDF5 at all")


@pytest.fixture(scope="module")
def area(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors")
    write_sweep(root / "sweep")
    (root / "empty").mkdir()
    (root / "not-a-sweep").mkdir()
    (root / "not-a-sweep" / "notes.txt").write_text("hello\n")
    (root / "damaged").mkdir()
    damage(root / "damaged")
    write_sweep(root / "partly", manifest=False)
    damage(root / "partly")
    (root / "two.yaml").write_text(yaml.safe_dump(PREDICTION))
    (root / "binary.yaml").write_bytes(b"nodes: [1]\n\xff\xfe\x00 not UTF-8\n")
    other = root / "other"  # a configuration no other sweep has
    other.mkdir()
    point = Point(framework="torch", backend="gloo", model="resnet18", ranks_per_node=3, batch_size=16)
    write_point_file(other / f"{point.id}.h5", point, iterations(3, 12, warmup=2, forward=0.01, batch=16))
    return root


pytestmark = pytest.mark.usefixtures("untouched")  # no input changes, whatever the command did


def bad_input(capsys: pytest.CaptureFixture[str], needle: str, *args: str | Path) -> list[str]:
    """Exit 2, one error line holding `needle`, no traceback, nothing on stdout but notes; the
    warnings before the error line."""
    code, stdout = hpcbench(*args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, stdout, err)
    assert "Traceback" not in err and lines and needle in lines[-1], err
    assert all(line.startswith("warning: ") for line in lines[:-1]), err
    assert "wrote" not in stdout
    return lines[:-1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["predict", "{area}/missing.yaml"], "missing.yaml: no such file or directory"),
        (["predict", "{area}/binary.yaml"], "not a text file (byte 11 is not UTF-8)"),
        (["predict", "{point}"], "an HDF5 file (a point or commbench file), not a prediction file"),
        (["predict", "{area}/empty"], "--nodes: {area}/empty is a directory"),
        (["predict", "{area}/empty", "--nodes", "2"], "empty: no point files (<id>.h5): not a sweep directory"),
        (["predict", "{area}/not-a-sweep", "--nodes", "2"], "not-a-sweep: no point files"),
        (["predict", "{area}/two.yaml", "--nodes", "2"], "--nodes: goes with a sweep directory"),
        (["trace", "{area}/missing.h5", "-o", "{area}/t.json"], "missing.h5: no such file"),
        (["trace", "{area}/sweep", "-o", "{area}/t.json"], "sweep: not a file"),
        (["trace", "{area}/damaged/0123456789ab.h5", "-o", "{area}/t.json"], "damaged point file"),
        (["trace", "{area}/damaged/fedcba987654.h5", "-o", "{area}/t.json"], "not a readable HDF5 file"),
        (["analyze", "{area}/missing"], "missing: no such sweep directory"),
        (["analyze", "{area}/two.yaml"], "two.yaml: not a directory"),
        (["analyze", "{area}/empty"], "no complete point files to analyse"),
        (["report", "{area}/missing"], "missing: no such sweep directory"),
        (["compare", "{area}/missing", "{area}/sweep"], "BASELINE_DIR"),
        (["export", "{area}/missing"], "SWEEP_DIR"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    area: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {"area": area, "point": point_file(area / "sweep")}
    bad_input(capsys, needle.format(**names), *[a.format(**names) for a in args])
    assert not (area / "t.json").exists()


def test_damaged_points_are_named(area: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["analyze"], ["predict", "--nodes", "2"]):
        warned = bad_input(capsys, "no complete point files", command[0], area / "damaged", *command[1:])
        assert any(DAMAGED_ID in w for w in warned) and any(GARBAGE_ID in w for w in warned), (command, warned)
    bad_input(capsys, "no point file could be exported", "export", area / "damaged", "-f", "json", "-o", area / "x")


def test_predict_names_a_damaged_point_it_leaves_out(area: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout = hpcbench("predict", area / "partly", "--nodes", "2")
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"warning: skipped {DAMAGED_ID}.h5" in err and f"warning: skipped {GARBAGE_ID}.h5" in err
    assert "link from" in stdout


def test_compare_with_nothing_in_common_prints_and_writes_nothing(
    area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "compare.txt"
    cases: list[list[str | Path]] = [[], ["-o", target], ["-o", target, "--format", "csv"]]
    for args in cases:
        code, stdout = hpcbench("compare", area / "sweep", area / "other", *args)
        err = capsys.readouterr().err.strip()
        assert code == 2 and stdout == "" and "no regression" not in err
        assert err.startswith("hpcbench compare: error: no configuration is in both sweeps (2 only in baseline, "
                              "1 only in new; no value in common for ")  # fmt: skip
        assert "model" in err and len(err.splitlines()) == 1
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_a_regression_exits_1_and_success_0(area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hpcbench("compare", area / "sweep", area / "sweep")[0] == 0
    slow = tmp_path / "slow"
    slow.mkdir()
    for path in (area / "sweep").glob("*.h5"):
        p = read_point(path)
        rows = p.iterations.copy()
        rows["t_end"] = rows["t_start"] + (rows["t_end"] - rows["t_start"]) * 1.5
        write_point_file(slow / path.name, p.point, rows)
    code, stdout = hpcbench("compare", area / "sweep", slow)
    assert code == 1 and stdout.splitlines()[-1].startswith("REGRESSED"), capsys.readouterr().err


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`folder` read-only: by its mode for a user; for root (who writes anyway) the file system
    answers EROFS, as a read-only mount does."""
    if not ROOT_USER:
        folder.chmod(0o555)
        return
    real = tempfile.mkstemp

    def mkstemp(*args: object, dir: str | Path | None = None, **kwargs: object) -> tuple[int, str]:
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, dir=dir, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_read_only_sweep_is_refused_before_the_analysis(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = write_sweep(tmp_path / "sweep", manifest=False)
    before = digest(sweep)
    _read_only(monkeypatch, sweep)
    try:
        bad_input(capsys, "cannot be written", command, sweep)
    finally:
        sweep.chmod(0o755)
    assert digest(sweep) == before


def test_an_unforeseen_error_is_one_line_and_v_shows_the_traceback(
    area: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("framework")

    monkeypatch.setattr(forecast, "extrapolate", broken)
    bad_input(capsys, "unexpected KeyError: 'framework'", "predict", area / "sweep", "--nodes", "2")
    code, _ = hpcbench("predict", area / "sweep", "--nodes", "2", "-v")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("hpcbench predict: error:")


def test_guarded_maps_every_kind_of_error() -> None:
    def raising(exc: BaseException) -> int:
        raise exc

    assert failure.guarded(lambda: raising(HpcbenchError("x")), "p") == failure.BAD_INPUT
    assert failure.guarded(lambda: raising(FileNotFoundError(2, "No such file", "f.h5")), "p") == 2
    assert failure.guarded(lambda: raising(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")), "p") == 2
    assert failure.guarded(lambda: failure.PROBLEM, "p") == 1
    with pytest.raises(BrokenPipeError):
        failure.guarded(lambda: raising(BrokenPipeError()), "p")


def test_the_issues_cases_as_a_user_runs_them(area: Path) -> None:
    """Through `python -m hpcbench`: predict's missing file is exit 2 (it was 1), an empty
    folder is not called a sweep directory, damaged points are named."""
    res = run_module("hpcbench", "predict", str(area / "missing.yaml"))
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.splitlines()) == 1
    res = run_module("hpcbench", "predict", str(area / "empty"))
    assert res.returncode == 2 and "is a sweep directory" not in res.stderr and "Traceback" not in res.stderr
    res = run_module("hpcbench", "predict", str(area / "damaged"), "--nodes", "2")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert DAMAGED_ID in res.stderr and GARBAGE_ID in res.stderr
    assert res.stdout == ""
