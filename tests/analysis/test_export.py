"""`hpcbench export` on point files written by the real writer with known contents: every
Parquet table read back (rows, types, units, values), every mllog line against the grammar,
summary.json against the analysis' own numbers, and bad input refused with nothing written."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcbench.analysis import pipeline, tables
from hpcbench.analysis.export import export_sweep, schemas
from hpcbench.analysis.export.parquet import FILES, TABLES
from hpcbench.analysis.export.summary import plain
from hpcbench.analysis.export.sweep import PARQUET_FILES
from hpcbench.cli import export as cli
from hpcbench.spec import FIELD_NAMES, Point
from hpcbench.store import schema
from hpcbench.testing.arrays import MIB, comm_rows, eval_rows, iterations, resource_rows, without
from hpcbench.testing.fabricate import write_point_file
from tests.conftest import ROOT, run_module

EPOCH_NS = 1_700_000_000_123_456_789  # the two-rank point's wall-clock time zero
FORWARD, SLOW_FORWARD = 0.0123, 0.05  # every iteration's forward; rank 1's at iteration 4
PERIOD = 0.1
TWO = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=2, batch_size=8, iterations=4, warmup=2,
            epochs=2)  # fmt: skip
ONE = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=1, batch_size=8, iterations=4, warmup=2,
            epochs=2)  # fmt: skip
FAILED = Point(framework="torch", backend="gloo", model="mlp", ranks_per_node=4, batch_size=8)
MESSAGES = [(r, i, 1000 * (r + 1), i * PERIOD + 0.02, i * PERIOD + 0.025) for r in range(2) for i in range(6)]


def two_rank_point(directory: Path) -> None:
    it = iterations(2, 6, warmup=2, data=0.001, forward=FORWARD, backward=0.02, comm=0.003, update=0.002,
                    comm_total=0.005, batch=8, period=PERIOD)  # fmt: skip
    it["forward"][1, 4] = SLOW_FORWARD
    it["t_end"][1, 4] += SLOW_FORWARD - FORWARD
    it["loss"] = 0.5
    comm = comm_rows(MESSAGES)
    comm["op"][-1] = b"broadcast"
    res = resource_rows([(0, 50, 10, 1, 100 * MIB), (1, 60, 20, 3, -1)])
    # epoch 1 ends after iteration 4 (2 warm-up + 2), epoch 2 after 6: 8 of 10 right, then 10 of 10
    evals = eval_rows([(0, 1, 0.2, 0.01, 4, 5), (1, 1, 0.2, 0.02, 4, 5),
                       (0, 2, 0.4, 0.01, 5, 5), (1, 2, 0.4, 0.01, 5, 5)])  # fmt: skip
    evals["iteration"] = [4, 4, 6, 6]
    path = write_point_file(directory / f"{TWO.id}.h5", TWO, it, comm=comm, resources=res, evals=evals,
                            hostnames=["n0", "n1"])  # fmt: skip
    with h5py.File(path, "r+") as f:  # a real wall clock as time zero (the fabricator writes 0)
        f.attrs["epoch_ns"] = EPOCH_NS


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sweep")
    two_rank_point(directory)
    write_point_file(directory / f"{ONE.id}.h5", ONE, iterations(1, 6, warmup=2, forward=FORWARD, batch=8))
    write_point_file(directory / f"{FAILED.id}.h5", FAILED, iterations(4, 6), status="failed")
    return directory


@pytest.fixture(scope="module")
def exported(sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "out"
    stdout = io.StringIO()
    assert cli.main([str(sweep), "-o", str(out)], stdout) == 0
    assert f"exported 2 points (parquet, mllog, json) to {out}" in stdout.getvalue()
    return out


def read(out: Path, name: str) -> Any:
    return pq.read_table(out / f"{name}.parquet")


# ---------------------------------------------------------------------------------------- Parquet


def test_every_table_is_there_with_its_declared_schema(exported: Path) -> None:
    assert PARQUET_FILES == FILES  # the names known without pyarrow are the files written
    for name, columns in TABLES.items():
        table = read(exported, name)
        assert table.column_names == [c.name for c in columns], name
        for column in columns:
            field = table.schema.field(column.name)
            assert field.type == column.type, (name, column.name)
            if column.unit:
                assert field.metadata[b"unit"] == column.unit.encode(), (name, column.name)
        meta = pq.ParquetFile(exported / f"{name}.parquet").metadata
        for g in range(meta.num_row_groups):
            assert {meta.row_group(g).column(c).compression for c in range(meta.num_columns)} == {"ZSTD"}
    assert pq.ParquetFile(exported / "iterations.parquet").metadata.num_row_groups == 1  # small points gathered
    assert read(exported, "iterations").schema.field("point").type == pa.dictionary(pa.int32(), pa.string())
    assert read(exported, "iterations").schema.field("rank").type == pa.int32()
    assert read(exported, "resources").schema.field("cpu_user_pct").type == pa.float32()


def test_iterations_hold_every_rank_and_the_injected_phase(exported: Path) -> None:
    frame = read(exported, "iterations").to_pandas()
    assert len(frame) == 2 * 6 + 1 * 6  # the failed point is not exported
    two = frame[frame["point"] == TWO.id].set_index(["rank", "iteration"])
    assert len(two) == 12
    assert two.loc[(1, 4), "forward_ns"] == round(SLOW_FORWARD * 1e9)
    others = two.drop(index=(1, 4))
    assert (others["forward_ns"] == round(FORWARD * 1e9)).all()
    assert (two["backward_ns"] == 20_000_000).all() and (two["comm_total_ns"] == 5_000_000).all()
    assert two.loc[(0, 3), "t_start_ns"] == round(3 * PERIOD * 1e9)
    assert two.loc[(1, 4), "t_end_ns"] - two.loc[(1, 4), "t_start_ns"] == round((0.0383 - FORWARD + SLOW_FORWARD) * 1e9)
    assert two["warmup"].tolist() == [True, True, False, False, False, False] * 2
    assert (two["samples"] == 8).all() and (two["loss"] == np.float32(0.5)).all()


def test_messages_resources_evaluations_and_ranks_come_back(exported: Path) -> None:
    messages = read(exported, "messages").to_pandas()
    assert len(messages) == len(MESSAGES)
    assert messages["bytes"].tolist() == [m[2] for m in MESSAGES]
    assert messages["t_start_ns"].tolist() == [round(m[3] * 1e9) for m in MESSAGES]
    assert messages["op"].tolist() == ["allreduce"] * 11 + ["broadcast"]
    assert messages["name"].tolist() == [str(i) for i in range(12)]  # one dictionary value per message name
    assert set(messages["dtype"]) == {"float32"}
    res = read(exported, "resources").to_pandas()
    assert res["cpu_user_pct"].tolist() == [50, 60] and res["rss_bytes"].iloc[0] == 100 * MIB
    assert math.isnan(res["rss_bytes"].iloc[1])  # -1 (not measured) is null
    assert read(exported, "resources").column("gpu_util_pct").null_count == 2
    evals = read(exported, "evaluations").to_pandas().sort_values(["epoch", "rank"])  # the file holds them by rank
    assert evals["epoch"].tolist() == [1, 1, 2, 2] and evals["correct"].tolist() == [4, 4, 5, 5]
    assert evals["test_time_ns"].tolist() == [10_000_000, 20_000_000, 10_000_000, 10_000_000]
    ranks = read(exported, "ranks").to_pandas()
    assert ranks[ranks["point"] == TWO.id]["hostname"].tolist() == ["n0", "n1"]


def test_a_file_of_an_older_schema_exports_the_columns_it_lacks_as_null(tmp_path: Path) -> None:
    """Schema 4 wrote no schedstat, steal, descendants or work_wait: the reader fills them unknown
    (store/upgrade.py), and they export as null beside the columns the file has."""
    later = (*schema.SCHED_COLUMNS, "cpu_steal", schema.CHILD_RUN, schema.WORK_WAIT)
    res = resource_rows([(0, 50, 10, 1, 100 * MIB), (0, 60, 20, 3, 200 * MIB)])
    for name in later:
        res[name] = 1  # measured in the rows given, dropped from the file below
    directory = tmp_path / "old"
    directory.mkdir()
    path = write_point_file(directory / f"{ONE.id}.h5", ONE, iterations(1, 6, warmup=2, forward=FORWARD, batch=8),
                            resources=res)  # fmt: skip
    with h5py.File(path, "r+") as f:  # as a version-4 writer laid it out
        rows = without(f["resources"][()], *later)
        del f["resources"]
        f["resources"] = rows
        f.attrs["schema_version"] = 4
    export_sweep(directory, ["parquet"], tmp_path / "out")
    exported = read(tmp_path / "out", "resources")
    assert exported.column("cpu_user_pct").to_pylist() == [50, 60]
    assert exported.column("rss_bytes").to_pylist() == [100 * MIB, 200 * MIB]
    assert all(
        exported.column(name).null_count == 2
        for name in [*schema.SCHED_COLUMNS, schema.CHILD_RUN, "cpu_steal_pct", schema.WORK_WAIT]
    )
    assert read(tmp_path / "out", "points").column("schema_version").to_pylist() == [4]


def test_points_table_has_every_field_and_the_file(exported: Path, sweep: Path) -> None:
    points = read(exported, "points").to_pylist()
    assert {p["point"] for p in points} == {TWO.id, ONE.id}
    assert set(points[0]) >= FIELD_NAMES
    two = next(p for p in points if p["point"] == TWO.id)
    assert (two["ranks"], two["hosts"], two["epochs"], two["file"]) == (2, 2, 2, f"{TWO.id}.h5")
    assert two["epoch_ns"] == EPOCH_NS and two["environ"] == "{}" and two["threads"] is None
    assert two["config"] == tables.points_table(tables.load(sweep).points).set_index("point").loc[TWO.id, "config"]


def test_small_chunks_give_the_same_rows(sweep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "CHUNK_ROWS", 5)  # 6 iterations a rank: one rank per row group
    export_sweep(sweep, ["parquet"], tmp_path / "small")
    export_sweep(sweep, ["parquet"], tmp_path / "whole")
    for name in ("iterations", "messages"):
        assert pq.ParquetFile(tmp_path / "small" / f"{name}.parquet").metadata.num_row_groups > 2
        assert read(tmp_path / "small", name).equals(read(tmp_path / "whole", name))


def test_docs_and_columns_cover_every_field_of_the_point_file() -> None:
    doc = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    for name, columns in TABLES.items():
        assert f"`{name}.parquet`" in doc
        missing = [c.name for c in columns if f"`{c.name}`" not in doc]
        assert not missing, f"docs/export.md does not describe {name} columns {missing}"
    for name, dtype in schemas.SOURCES.items():
        exported_names = {c.name for c in TABLES[name]}
        for f in dtype.names or ():
            ways = {f, f"{f}_ns", f"{f.removesuffix('_s')}_ns", f"{f}_pct"}
            assert ways & exported_names, f"{name}.parquet does not export the point file's {f}"


# ---------------------------------------------------------------------------------------- mllog

LINE = re.compile(r"^:::MLLOG (\{.*\})$")
KEYS = ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
KINDS = {"POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"}


def parse_log(path: Path) -> list[dict[str, Any]]:
    """Every line against the grammar; the events."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = LINE.match(line)
        assert match, f"{path.name}: not an MLLOG line: {line!r}"
        event = json.loads(match.group(1))
        assert list(event) == KEYS
        assert event["event_type"] in KINDS and isinstance(event["time_ms"], int)
        assert isinstance(event["metadata"], dict)
        assert event["namespace"] in ("", "hpcbench")
        assert (event["namespace"] == "hpcbench") == event["key"].startswith("hpcbench_")
        events.append(event)
    return events


def check_intervals(events: list[dict[str, Any]]) -> None:
    """time_ms never decreases; every interval opens before it closes, once at a time."""
    times = [e["time_ms"] for e in events]
    assert times == sorted(times)
    open_: set[str] = set()
    for e in events:
        stem = e["key"].rsplit("_", 1)[0]
        if e["event_type"] == "INTERVAL_START":
            assert e["key"].endswith("_start") and stem not in open_, e
            open_.add(stem)
        elif e["event_type"] == "INTERVAL_END":
            assert e["key"].endswith("_stop") and stem in open_, e
            open_.remove(stem)
    assert not open_
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1
    assert keys.index("run_start") < keys.index("run_stop") == len(keys) - 1


def test_mllog_lines_follow_the_grammar_and_the_data(exported: Path) -> None:
    logs = sorted((exported / "mllog").glob("*.log"))
    assert [p.stem for p in logs] == sorted([TWO.id, ONE.id])
    summary = {p["point"]: p for p in json.loads((exported / "summary.json").read_text())["points"]}
    for path in logs:
        events = parse_log(path)
        check_intervals(events)
        by_key = {e["key"]: e for e in events}
        assert by_key["run_stop"]["metadata"]["status"] == "success"
        assert by_key["throughput"]["value"] == pytest.approx(summary[path.stem]["throughput"])
        assert by_key["hpcbench_stats"]["value"] == summary[path.stem]
    events = parse_log(exported / "mllog" / f"{TWO.id}.log")
    by_key = {e["key"]: e for e in events}
    assert by_key["run_start"]["time_ms"] == EPOCH_NS // 1_000_000  # the first iteration started at 0
    assert by_key["global_batch_size"]["value"] == 16 and by_key["submission_benchmark"]["value"] == "mlp"
    assert by_key["submission_platform"]["value"] == "n0,n1"
    accuracy = [(e["metadata"]["epoch_num"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
    assert accuracy == [(1, 0.8), (2, 1.0)]
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_start"] == [1, 2]
    # epoch 1: iterations 2 and 3 (after two warm-up ones); its evaluation from the slowest rank's
    # end of iteration 3 to the end of the slower test (20 ms)
    epoch_1 = [e for e in events if e["metadata"].get("epoch_num") == 1]
    starts = {e["key"]: e["time_ms"] - EPOCH_NS // 1_000_000 for e in epoch_1}
    assert starts["epoch_start"] == pytest.approx(200, abs=1)
    assert starts["eval_start"] == pytest.approx(338, abs=1) and starts["eval_stop"] == pytest.approx(358, abs=1)
    one = {e["key"] for e in parse_log(exported / "mllog" / f"{ONE.id}.log")}
    assert "eval_accuracy" not in one and "block_start" not in one  # no evaluations recorded


# ---------------------------------------------------------------------------------------- JSON


def test_summary_json_matches_the_analysis(exported: Path, sweep: Path) -> None:
    text = (exported / "summary.json").read_text()
    assert "NaN" not in text
    doc = json.loads(text)
    analysis = pipeline.analyse(sweep)
    expected = [plain(row) for row in analysis.stats.to_dict("records")]
    assert [row["point"] for row in doc["points"]] == [row["point"] for row in expected]
    for got, want in zip(doc["points"], expected, strict=True):
        assert list(got) == list(want)
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert got[key] == value, key
    two = next(row for row in doc["points"] if row["point"] == TWO.id)
    assert two["scaling"] == "weak" and two["speedup"] is not None and two["gpu_util"] is None
    assert doc["units"]["t_iter_s"] == "s" and any(FAILED.id in w for w in doc["skipped"])


# ---------------------------------------------------------------------------------------- choices and errors


def test_formats_chosen_by_repeats_and_comma_lists(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "some"
    assert cli.main([str(sweep), "--format", "json", "-f", "mllog", "-o", str(out)], io.StringIO()) == 0
    assert sorted(p.name for p in out.iterdir()) == ["mllog", "summary.json"]
    assert cli.main([str(sweep), "--format", "parquet,json", "-o", str(tmp_path / "two")], io.StringIO()) == 0
    assert sorted(p.suffix for p in (tmp_path / "two").iterdir()) == [".json"] + [".parquet"] * 7


def test_default_output_is_inside_the_sweep(sweep: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in sweep.glob("*.h5"):
        (copy / p.name).write_bytes(p.read_bytes())
    assert cli.main([str(copy), "--format", "json"], io.StringIO()) == 0
    assert (copy / "export" / "summary.json").is_file()
    assert not [p for p in (copy / "export").iterdir() if p.name.startswith(".")]  # no staging left


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], needle: str, skipped: int = 0) -> None:
    """Exit 2 with one error line holding `needle`, after `skipped` warnings (one per point
    file skipped, printed when no point could be exported)."""
    assert cli.main(argv, io.StringIO()) == 2
    *warnings, error = capsys.readouterr().err.strip().splitlines()
    assert needle in error and error.startswith("hpcbench export: error: "), error
    assert len(warnings) == skipped and all(w.startswith("warning: skipped ") for w in warnings), warnings


def test_bad_input_exits_2_and_writes_nothing(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = listing(sweep)
    refused([str(tmp_path / "nowhere")], capsys, "SWEEP_DIR")
    refused([str(sweep), "--format", "parquet,xml"], capsys, "--format: 'xml' is not an export format")
    failed_only = tmp_path / "failed"
    failed_only.mkdir()
    (failed_only / f"{FAILED.id}.h5").write_bytes((sweep / f"{FAILED.id}.h5").read_bytes())
    refused([str(failed_only)], capsys, "no complete point files", skipped=1)
    assert listing(failed_only) == [f"{FAILED.id}.h5"]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "messages.parquet").write_text("someone's")
    refused([str(sweep), "-o", str(taken)], capsys, "exist already")
    assert listing(taken) == ["messages.parquet"] and (taken / "messages.parquet").read_text() == "someone's"
    (tmp_path / "a-file").write_text("")
    refused([str(sweep), "-o", str(tmp_path / "a-file")], capsys, "not a directory")
    assert listing(sweep) == before


def damaged(path: Path) -> None:
    with h5py.File(path, "w") as f:  # says complete, holds nothing
        f.attrs["status"] = "complete"
        f.attrs["schema_version"] = 3


def test_a_point_that_cannot_be_read_leaves_no_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "damaged"
    directory.mkdir()
    damaged(directory / "0123456789ab.h5")
    refused([str(directory)], capsys, "no point file could be exported", skipped=1)
    assert listing(directory) == ["0123456789ab.h5"]
    out = ["-o", str(tmp_path / "new" / "deep" / "out")]
    refused([str(directory), *out], capsys, "no point file could be exported", skipped=1)
    assert not (tmp_path / "new").exists()  # the folders it made are gone again


def test_every_skipped_point_is_named_when_none_can_be_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "damaged"
    directory.mkdir()
    for name in ("0123456789ab", "123456789abc", "23456789abcd"):
        damaged(directory / f"{name}.h5")
    refused([str(directory)], capsys, "3 point files skipped", skipped=3)


def test_force_replaces_an_earlier_export(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "again"
    assert cli.main([str(sweep), "-f", "json,mllog", "-o", str(out)], io.StringIO()) == 0
    first = (out / "summary.json").read_text()
    capsys.readouterr()  # the skipped point's warning
    (out / "summary.json").write_text("stale")
    refused([str(sweep), "-f", "json", "-o", str(out)], capsys, "exist already")
    assert (out / "summary.json").read_text() == "stale"
    assert cli.main([str(sweep), "-f", "json,mllog", "-o", str(out), "--force"], io.StringIO()) == 0
    capsys.readouterr()
    assert json.loads((out / "summary.json").read_text())["points"] == json.loads(first)["points"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left
    (out / "summary.json").unlink()
    (out / "summary.json").mkdir()  # --force replaces a regular file only
    refused([str(sweep), "-f", "json", "-o", str(out), "--force"], capsys, "not a regular file")
    assert (out / "summary.json").is_dir()


def test_unreadable_points_are_skipped_with_a_warning(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / f"{ONE.id}.h5").write_bytes((sweep / f"{ONE.id}.h5").read_bytes())
    damaged(copy / "0123456789ab.h5")
    (copy / "fedcba987654.h5").write_text("not HDF5")
    assert cli.main([str(copy), "-f", "json"], io.StringIO()) == 0
    err = capsys.readouterr().err
    assert "warning: skipped 0123456789ab.h5: " in err and "warning: skipped fedcba987654.h5: not a readable" in err
    doc = json.loads((copy / "export" / "summary.json").read_text())
    assert [p["point"] for p in doc["points"]] == [ONE.id] and len(doc["skipped"]) == 2


def test_the_command_exports_and_exits_2_with_one_line_on_bad_input(sweep: Path, tmp_path: Path) -> None:
    res = run_module("hpcbench", "export", str(sweep), "-f", "mllog,json", "-o", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == f"exported 2 points (mllog, json) to {tmp_path / 'out'}"
    assert f"warning: skipped {FAILED.id}.h5: status failed, not complete" in res.stderr
    res = run_module("hpcbench", "export", str(sweep), "--format", "csv")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip() == (
        "hpcbench export: error: --format: 'csv' is not an export format (allowed: parquet, mllog, json)"
    )


def test_mllog_of_a_point_that_counts_iterations(tmp_path: Path) -> None:
    point = Point(model="lenet", batch_size=8, iterations=4, warmup=2)
    it = iterations(3, 6, warmup=2, forward=FORWARD, batch=8, period=PERIOD)
    evals = eval_rows([(r, 0, 0.6, 0.05, 3, 4) for r in range(3)])  # one evaluation at the end: 9 of 12
    evals["iteration"] = 6
    write_point_file(tmp_path / f"{point.id}.h5", point, it, evals=evals)
    export_sweep(tmp_path, ["mllog"], tmp_path / "out")
    events = parse_log(tmp_path / "out" / "mllog" / f"{point.id}.log")
    check_intervals(events)
    keys = [e["key"] for e in events]
    assert "epoch_start" not in keys and keys.count("block_start") == 1
    by_key = {e["key"]: e for e in events}
    assert by_key["eval_accuracy"]["value"] == 0.75
    assert by_key["eval_accuracy"]["metadata"] == {"samples_count": 3 * 6 * 8}  # every rank's samples, warm-up too
    assert by_key["block_start"]["time_ms"] == 200 and by_key["eval_stop"]["time_ms"] == 562  # 500 + 12.3 + 50 ms
    assert by_key["hpcbench_warmup_stop"]["time_ms"] == 112 and by_key["eval_samples"]["value"] == 12


def test_mllog_power_readings_are_each_counters_average_between_its_readings(tmp_path: Path) -> None:
    """MLPerf power's events from the recorded counters: rank 0 reads its host's package (20 W,
    then 40 W), rank 1 the same package again (ignored: one reader per host's domain) and its
    GPU (100 W over 0.2 s; then a 50 ms window, shorter than NVML's update interval: left out);
    a reading after the run is outside the measurement."""
    point = Point(model="lenet", batch_size=8, iterations=4, warmup=2, ranks_per_node=2)
    it = iterations(2, 6, warmup=2, forward=FORWARD, batch=8, period=PERIOD)  # ends at 0.5123 s
    rows = [(0, 0.0, "rapl", "package-0", 0), (0, 0.25, "rapl", "package-0", 5_000_000),
            (0, 0.5, "rapl", "package-0", 15_000_000), (0, 10.0, "rapl", "package-0", 99_000_000),
            (1, 0.0, "rapl", "package-0", 7), (1, 0.5, "rapl", "package-0", 1_000_000_000),
            (1, 0.1, "nvml-counter", "gpu-1", 1_000_000), (1, 0.3, "nvml-counter", "gpu-1", 21_000_000),
            (1, 0.35, "nvml-counter", "gpu-1", 22_000_000)]  # fmt: skip
    energy = np.array([(r, t, s.encode(), d.encode(), uj) for r, t, s, d, uj in rows], dtype=schema.ENERGY_DTYPE)
    write_point_file(tmp_path / f"{point.id}.h5", point, it, energy=energy, hostnames=["n0", "n0"])
    export_sweep(tmp_path, ["mllog"], tmp_path / "out")
    events = parse_log(tmp_path / "out" / "mllog" / f"{point.id}.log")
    check_intervals(events)
    readings = [(e["time_ms"], e["value"], e["metadata"]) for e in events if e["key"] == "power_reading"]
    got = [(ms, m["source"], m["domain"], m["rank"]) for ms, _, m in readings]
    assert got == [(250, "rapl", "package-0", 0), (300, "nvml-counter", "gpu-1", 1), (500, "rapl", "package-0", 0)]
    assert [w for _, w, _ in readings] == pytest.approx([20.0, 100.0, 40.0])
    assert all(m["host"] == "n0" and m["unit"] == "W" for _, _, m in readings)
    by_key = {e["key"]: e for e in events}
    assert by_key["power_measurement_start"]["time_ms"] == 0 and by_key["power_measurement_stop"]["time_ms"] == 500
    assert by_key["conversion_eff"]["value"] == 1.0
    keys = [e["key"] for e in events]
    assert keys.index("run_start") < keys.index("power_reading") < keys.index("power_measurement_stop") < len(keys) - 1


def test_mllog_without_energy_has_no_power_events(exported: Path) -> None:
    for path in (exported / "mllog").glob("*.log"):
        assert not [e for e in parse_log(path) if e["key"].startswith(("power_", "conversion_eff"))]
