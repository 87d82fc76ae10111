"""The output policy (hpcbench/sweepdir/outputs.py, docs/running.md#outputs-and-exit-codes),
through the policy itself and through every command that writes a file of its choosing:
`compare -o`, `trace -o`, `predict --csv`, `export -o`, and `analyze`/`report` in the sweep.

Each refusal is one line on stderr, exit 2, no traceback, and leaves every file as it was
(checksums before and after); the sweeps are fabricated point files (no ranks run)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hpcbench.analysis.cache import CACHE_DIR
from hpcbench.cli import main as cli
from hpcbench.sweepdir import outputs
from hpcbench.sweepdir.outputs import OutputError, OutputFile, check_file
from hpcbench.testing.arrays import model_point
from tests.conftest import run_module

ROOT_USER = os.geteuid() == 0

PREDICTION = {
    "layers": [[4e6, 0.010], [1e6, 0.020]],
    "batch_size": 32,
    "single_rank": {"phases": {"forward": 0.015, "backward": 0.030, "update": 0.005}},
    "ranks_per_node": 2,
    "nodes": [1, 2],
    "links": {"intra": {"bandwidth_gbps": 100, "latency_us": 5}, "inter": {"bandwidth_gbps": 10, "latency_us": 50}},
}


def digest(*roots: Path) -> dict[str, str]:
    """Every path under `roots`: its kind, and a regular file's SHA-256 (links are not followed)."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]:
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[str(p)] = "file " + hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                out[str(p)] = "link " + os.readlink(p)
            else:
                out[str(p)] = stat.filemode(st.st_mode)[0]
    return out


def write_sweep(directory: Path, manifest: bool = True) -> Path:
    """Two complete points of one configuration (1 and 2 ranks) that follow the model, and a
    manifest and spec like a real sweep's."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in (1, 2):
        model_point(directory, n)
    if manifest:
        (directory / "manifest.json").write_text(
            json.dumps({"version": 1, "name": "t", "executor": "local", "entries": []})
        )
        (directory / "spec.yaml").write_text("name: t\n")
        (directory / "logs").mkdir(exist_ok=True)
        (directory / "logs" / "x.log").write_text("log\n")
    return directory


def point_file(directory: Path) -> Path:
    return sorted(directory.glob("*.h5"))[0]


@pytest.fixture(scope="module")
def area(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base/ and new/ sweeps of the same configurations, and a prediction file."""
    root = tmp_path_factory.mktemp("outputs")
    write_sweep(root / "base")
    write_sweep(root / "new")
    (root / "two.yaml").write_text(yaml.safe_dump(PREDICTION))
    return root


@pytest.fixture
def untouched(area: Path) -> Iterator[None]:
    """The inputs are byte for byte the same after the test."""
    before = digest(area)
    yield
    assert digest(area) == before


def hpcbench(*args: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main([str(a) for a in args], out)
    return code, out.getvalue()


def refused(capsys: pytest.CaptureFixture[str], needle: str, *args: str | Path) -> str:
    """The command exits 2 with one line on stderr holding `needle`, and no traceback."""
    code, stdout = hpcbench(*args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert code == 2, (code, stdout, err)
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert "wrote" not in stdout
    return lines[0]


# -- the policy itself --------------------------------------------------------------------


def test_a_new_file_is_written_whole_and_its_folders_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.csv"
    with OutputFile(target, option="-o") as output:
        assert target.parent.is_dir() and not target.exists()  # claimed: a temporary file beside it
        output.write_text("x,y\n")
    assert target.read_text() == "x,y\n"
    assert [p.name for p in target.parent.iterdir()] == ["out.csv"]  # no temporary file left


def test_a_failure_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.csv"
    with pytest.raises(RuntimeError), OutputFile(target, option="-o"):
        raise RuntimeError("the work failed")
    assert list(tmp_path.iterdir()) == []  # neither the file, its temporary, nor the folders made


def test_a_name_taken_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    with OutputFile(target, option="-o") as output:
        target.write_text("someone's")
        with pytest.raises(OutputError, match="made meanwhile"):
            output.write_text("ours")
    assert target.read_text() == "someone's"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_force_replaces_a_regular_file_only(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old")
    with pytest.raises(OutputError, match=re.escape("exists already; --force replaces it")):
        check_file(target, option="-o")
    with OutputFile(target, option="-o", force=True) as output:
        output.write_text("new")
    assert target.read_text() == "new"


def test_inputs_and_their_other_names_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("a: 1\n")
    twin = tmp_path / "twin.yaml"
    os.link(source, twin)
    for target in (source, twin, tmp_path / "." / "in.yaml"):
        with pytest.raises(OutputError, match="is an input"):
            check_file(target, option="--csv", force=True, reads=[source])


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("0123456789ab.h5", "point file's name"),
        ("0123456789ab.attempt1.h5", "point file's name"),
        ("0123456789ab.h5.new", "point file's name"),
        ("manifest.json", "own manifest.json"),
        ("spec.yaml", "own spec.yaml"),
        (".lock", "own .lock"),
        ("points/0123456789ab.json", "own folder points/"),
        ("logs/new.log", "own folder logs/"),
        ("logs/deeper/new.log", "own folder logs/"),
        ("slurm/x.out", "own folder slurm/"),
    ],
)
def test_a_sweeps_own_names_are_refused_even_with_force(tmp_path: Path, name: str, why: str) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "manifest.json").write_text(json.dumps({"version": 1, "executor": "slurm"}))
    with pytest.raises(OutputError, match=re.escape(why)):
        check_file(sweep / name, option="-o", force=True)
    other = tmp_path / "mine"  # the same names elsewhere are free, but for a point file's name
    if "point file" not in why:
        check_file(other / name, option="-o", force=True)


def test_an_hdf5_output_may_take_an_h5_name_outside_sweeps(tmp_path: Path) -> None:
    """`commbench -o intra.h5`: HDF5 by a writer of its own, through the temporary file."""
    target = tmp_path / "commbench" / "intra.h5"
    with pytest.raises(OutputError, match=re.escape("point file's name")):
        check_file(target, option="-o")  # a text output never takes one
    with OutputFile(target, option="-o", hdf5=True) as output:
        output.temporary.write_bytes(b"\x89HDF")
        output.commit()
    assert target.read_bytes() == b"\x89HDF" and os.listdir(target.parent) == ["intra.h5"]
    sweep = write_sweep(tmp_path / "sweep", manifest=False)
    with pytest.raises(OutputError, match=re.escape("point file's name (*.h5) in the sweep directory")):
        check_file(sweep / "intra.h5", option="-o", hdf5=True)


def test_a_folder_of_point_files_or_an_input_folder_is_a_sweep(tmp_path: Path) -> None:
    points = tmp_path / "points-only"
    points.mkdir()
    (points / "0123456789ab.h5").write_bytes(b"")
    with pytest.raises(OutputError, match=re.escape("own manifest.json")):
        check_file(points / "manifest.json", option="-o")
    bare = tmp_path / "bare"
    bare.mkdir()
    check_file(bare / "manifest.json", option="-o")
    with pytest.raises(OutputError, match=re.escape("own folder logs/")):
        check_file(bare / "logs" / "x.log", option="-o", reads=[bare])


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    real = tmp_path / "real.txt"
    real.write_text("kept")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    try:
        cases = [(folder, "is a directory"), (fifo, "is a FIFO"), (sock_path, "is a socket"),
                 (link, "is a symbolic link"), (Path("/dev/null"), "is a character device"),
                 (Path("/dev/full"), "is a character device"), (Path("."), "names a folder")]  # fmt: skip
        for target, what in cases:
            with pytest.raises(OutputError, match=re.escape(what)):
                check_file(target, option="-o", force=True)
    finally:
        sock.close()
    assert real.read_text() == "kept"


def test_a_folder_nothing_can_be_written_in_is_refused_before_the_work(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="cannot be written"), OutputFile(Path("/proc/hpcbench-out.csv"), option="-o"):
        pytest.fail("the work must not start")
    under_a_file = tmp_path / "file"
    under_a_file.write_text("")
    with pytest.raises(OutputError, match=re.escape("cannot be written (Not a directory)")):
        OutputFile(under_a_file / "out.csv", option="-o").__enter__()
    assert under_a_file.read_text() == ""


@pytest.mark.skipif(ROOT_USER, reason="root writes in a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="cannot be written"), OutputFile(folder / "out.csv", option="-o"):
            pytest.fail("the work must not start")
        with pytest.raises(OutputError, match="cannot be made"), OutputFile(folder / "sub" / "out.csv", option="-o"):
            pytest.fail("the work must not start")
    finally:
        folder.chmod(0o755)
    assert list(folder.iterdir()) == []


# -- through the commands -----------------------------------------------------------------


@pytest.mark.usefixtures("untouched")
def test_compare_never_writes_onto_a_sweep_or_a_device(area: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, new = area / "base", area / "new"
    point = point_file(new)
    refused(capsys, "point file's name", "compare", base, new, "-o", point)
    refused(capsys, "point file's name", "compare", base, new, "-o", point, "--force")
    refused(capsys, "own manifest.json", "compare", base, new, "-o", new / "manifest.json", "--format", "csv")
    refused(capsys, "own manifest.json", "compare", base, new, "-o", new / "manifest.json", "--force")
    refused(capsys, "own folder logs/", "compare", base, new, "-o", new / "logs" / "x.log", "--force")
    refused(capsys, "is a character device", "compare", base, new, "-o", "/dev/full")
    refused(capsys, "is a character device", "compare", base, new, "-o", "/dev/full", "--force")
    refused(capsys, "is a directory", "compare", base, new, "-o", new)
    refused(capsys, "cannot be written", "compare", base, new, "-o", "/proc/hpcbench-compare.txt")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_compare_writes_new_files_and_replaces_only_with_force(
    area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "made" / "here" / "compare.md"
    code, stdout = hpcbench("compare", area / "base", area / "new", "-o", target, "--format", "md")
    assert code == 0, capsys.readouterr().err
    assert stdout.startswith(f"wrote {target}\n") and target.read_text().startswith("# hpcbench compare")
    target.write_text("mine")
    refused(capsys, "exists already; --force replaces it", "compare", area / "base", area / "new", "-o", target)
    assert target.read_text() == "mine"
    assert hpcbench("compare", area / "base", area / "new", "-o", target, "--force")[0] == 0
    assert "no regression" in target.read_text()


@pytest.mark.usefixtures("untouched")
def test_trace_never_writes_onto_its_point_file(area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    point = point_file(area / "base")
    refused(capsys, "is an input", "trace", point, "-o", point)
    refused(capsys, "is an input", "trace", point, "-o", point, "--force")
    refused(capsys, "is a directory", "trace", point, "-o", tmp_path)
    refused(capsys, "cannot be written", "trace", point, "-o", "/proc/hpcbench-trace.json")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(capsys, "is a FIFO", "trace", point, "-o", fifo, "--force")
    target = tmp_path / "missing" / "folder" / "trace.json"  # made, as every command makes its folders
    assert hpcbench("trace", point, "-o", target)[0] == 0
    events = json.loads(target.read_text())["traceEvents"]
    refused(capsys, "exists already", "trace", point, "-o", target)
    assert json.loads(target.read_text())["traceEvents"] == events
    assert hpcbench("trace", point, "-o", target, "--force", "--ideal")[0] == 0
    assert len(json.loads(target.read_text())["traceEvents"]) > len(events)


@pytest.mark.usefixtures("untouched")
def test_predict_never_writes_onto_its_input(area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml_file, sweep = area / "two.yaml", area / "base"
    refused(capsys, "is an input", "predict", yaml_file, "--csv", yaml_file)
    refused(capsys, "is an input", "predict", yaml_file, "--csv", yaml_file, "--force")
    refused(capsys, "point file's name", "predict", sweep, "--nodes", "2", "--csv", point_file(sweep))
    refused(capsys, "own spec.yaml", "predict", sweep, "--nodes", "2", "--csv", sweep / "spec.yaml", "--force")
    refused(capsys, "is a directory", "predict", yaml_file, "--csv", tmp_path)
    refused(capsys, "cannot be written", "predict", yaml_file, "--csv", "/proc/hpcbench-predict.csv")
    target = tmp_path / "new" / "two.csv"
    assert hpcbench("predict", yaml_file, "--csv", target)[0] == 0
    table = target.read_text()
    refused(capsys, "exists already", "predict", yaml_file, "--csv", target)
    assert target.read_text() == table
    assert hpcbench("predict", sweep, "--nodes", "2", "--csv", target, "--force")[0] == 0
    assert target.read_text() != table


@pytest.mark.usefixtures("untouched")
def test_export_never_writes_into_a_sweeps_own_folders(
    area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = area / "base"
    refused(capsys, "own folder logs/", "export", sweep, "-f", "json", "-o", sweep / "logs")
    refused(capsys, "own folder points/", "export", sweep, "-f", "json", "-o", sweep / "points")
    refused(capsys, "not a directory", "export", sweep, "-f", "json", "-o", point_file(sweep))
    refused(capsys, "point file's name", "export", sweep, "-f", "json", "-o", tmp_path / "new.h5")
    refused(capsys, "not a directory", "export", sweep, "-f", "json", "-o", "/dev/full")
    refused(capsys, "cannot", "export", sweep, "-f", "json", "-o", "/proc/hpcbench-export")
    assert list(tmp_path.iterdir()) == []


def test_analyze_and_report_refuse_a_link_or_folder_in_place_of_their_files(
    area: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = write_sweep(tmp_path / "sweep", manifest=False)
    elsewhere = tmp_path / "precious.csv"
    elsewhere.write_text("precious")
    (sweep / "summary.csv").symlink_to(elsewhere)
    (sweep / "report.html").mkdir()
    before = digest(tmp_path)
    refused(capsys, "summary.csv: is a symbolic link", "analyze", sweep)
    refused(capsys, "report.html: is a directory", "report", sweep)
    assert digest(tmp_path) == before


def test_analyze_rewrites_its_own_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = write_sweep(tmp_path / "sweep", manifest=False)
    (sweep / "summary.csv").write_text("stale")
    assert hpcbench("analyze", sweep)[0] == 0
    assert (sweep / "summary.csv").read_text().startswith("point,")
    assert not [p for p in sweep.iterdir() if p.name.startswith(".") and p.name != CACHE_DIR]  # no temporary file left
    assert not list((sweep / CACHE_DIR).glob(".*"))  # nor in the analysis cache


def test_the_issues_cases_as_a_user_runs_them(area: Path, tmp_path: Path) -> None:
    """Through `python -m hpcbench`: no traceback, exit 2, the point file untouched."""
    before = digest(area)
    point = point_file(area / "new")
    for args in (["compare", area / "base", area / "new", "-o", point],
                 ["trace", point, "-o", point],
                 ["predict", area / "new", "--nodes", "2", "--csv", point]):  # fmt: skip
        res = run_module("hpcbench", *map(str, args))
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and str(point) in res.stderr
    assert digest(area) == before


def test_point_file_names_come_from_the_layout() -> None:
    assert outputs.is_point_file_name("0123456789ab.h5")
    assert not outputs.is_point_file_name("trace.json")
    files, folders = outputs.sweep_names(Path("/nonexistent"))
    assert {"manifest.json", "spec.yaml"} <= files and {"points", "logs"} <= folders
