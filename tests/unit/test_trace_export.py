"""hpcbench.analysis.export.chrome against the Chrome Trace Event Format, on arrays built by hand.

3 ranks (two on node-a, one on node-b) x 4 iterations, iteration 0 a warm-up; rank 0 has
four gradient messages of which three overlap (three lanes), rank 1 one message, rank 2
none; resource samples without a GPU (NaN / -1), InfiniBand counters on node-a only.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcbench.analysis.export.chrome import chrome_trace, write_chrome_trace
from hpcbench.store import upgrade
from hpcbench.store.schema import COMM_DTYPE, ITERATION_DTYPE, PHASES, RANK_DTYPE, RESOURCE_DTYPE, RESOURCES

N_RANKS = 3
N_ITER = 4
HOSTS = ["node-a", "node-a", "node-b"]
TOL_US = 1e-6
Event = dict[str, Any]


def make_ranks() -> np.ndarray:
    ranks = np.zeros(N_RANKS, dtype=RANK_DTYPE)
    for r in range(N_RANKS):
        ranks[r] = (r, r % 2, r // 2, 1000 + r, 0, HOSTS[r].encode())
    return ranks


def make_iterations() -> np.ndarray:
    it = np.zeros((N_RANKS, N_ITER), dtype=ITERATION_DTYPE)
    for r in range(N_RANKS):
        for i in range(N_ITER):
            start = 1.0 + 0.1 * i + 0.001 * r
            row = it[r, i]
            row["t_start"] = start
            row["t_end"] = start + 0.09
            row["data"] = 0.01
            row["h2d"] = 0.0  # CPU run: no host-to-device copy, must not appear
            row["forward"] = 0.02
            row["backward"] = 0.03
            row["comm"] = 0.01
            row["update"] = 0.005
            row["comm_total"] = 0.04
            row["samples"] = 8
            row["loss"] = 2.0 - 0.1 * i
            row["warmup"] = 1 if i == 0 else 0
    # rank 1, iteration 3: the phases fill the iteration exactly (rounding must not stick out)
    it[1, 3]["update"] = 0.09 - (0.01 + 0.02 + 0.03 + 0.01)
    it[2, 0]["loss"] = np.nan  # a diverged loss: must still be valid JSON
    return it


def make_comm() -> np.ndarray:
    rows = [
        # rank, iteration, op, name, axis, dtype, bytes, t_start, t_end
        (0, 1, b"allreduce", b"bucket0", b"dp", b"float32", 4_000_000, 1.13, 1.16),
        (0, 1, b"allreduce", b"bucket1", b"dp", b"float32", 2_000_000, 1.14, 1.17),
        (0, 1, b"allreduce", b"bucket2", b"dp", b"float16", 1_000, 1.15, 1.155),
        (0, 1, b"allreduce", b"bucket3", b"tp", b"float32", 3_000, 1.165, 1.18),  # lane 0 is free again
        (1, 2, b"broadcast", b"fc1.weight", b"dp", b"float32", 123_456, 1.25, 1.2575),
    ]
    return np.array(rows, dtype=COMM_DTYPE)


def make_resources(gpu: bool = False) -> np.ndarray:
    res = np.zeros(N_RANKS * 3, dtype=RESOURCE_DTYPE)
    k = 0
    for r in range(N_RANKS):
        for j, t in enumerate((1.0, 1.2, 1.4)):
            row = res[k]
            row["rank"] = r
            row["t"] = t
            row["cpu_user"] = 50.0 + j
            row["cpu_system"] = 5.0
            row["cpu_iowait"] = 0.5
            row["cpu_steal"] = 2.0 if j else np.nan  # absent in the first sample
            row["rss_bytes"] = (100 + j) * 1024 * 1024
            row["gpu_util"] = 80.0 + j if gpu else np.nan
            row["gpu_mem_bytes"] = (2048 + j) * 1024 * 1024 if gpu else -1
            row["gpu_power_w"] = 250.0 if gpu else np.nan
            row["gpu_sm_clock_mhz"] = 1410.0 if gpu else np.nan
            ib = HOSTS[r] == "node-a"
            row["ib_rx_bytes"] = (0, 2_000_000, 6_000_000)[j] if ib else -1
            row["ib_tx_bytes"] = (0, 1_000_000, 1_000_000)[j] if ib else -1
            k += 1
    out: np.ndarray = res[::-1].copy()  # out of order: the export sorts by rank and time
    return out


def make_trace(gpu: bool = False, comm: np.ndarray | None = None) -> dict[str, Any]:
    return chrome_trace(
        make_iterations(),
        make_ranks(),
        make_comm() if comm is None else comm,
        make_resources(gpu),
        HOSTS,
        "torch-gloo-lenet-n1x3",
    )


@pytest.fixture(scope="module")
def trace() -> dict[str, Any]:
    return make_trace()


def events(trace: dict[str, Any], ph: str, **match: Any) -> list[Event]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in match.items())]


def end(e: Event) -> float:
    return float(e["ts"] + e["dur"])


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def assert_disjoint(evs: list[Event]) -> None:
    evs = sorted(evs, key=lambda e: (e["ts"], e["dur"]))
    for a, b in itertools.pairwise(evs):
        assert b["ts"] >= end(a) - TOL_US, (a, b)


# --- file and format ---------------------------------------------------------------------


def test_write_round_trip_and_no_temp_file(trace: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "point.trace.json"
    write_chrome_trace(path, trace)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(json.dumps(trace, allow_nan=False))
    assert loaded == trace
    # overwrite in place: still one file, the new content
    write_chrome_trace(path, {"traceEvents": []})
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert json.loads(path.read_text()) == {"traceEvents": []}


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("old")
    with pytest.raises(ValueError, match="JSON"):
        write_chrome_trace(path, {"traceEvents": [{"ts": float("nan")}]})
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
    assert path.read_text() == "old"


def test_top_level(trace: dict[str, Any]) -> None:
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["label"] == "torch-gloo-lenet-n1x3"
    assert isinstance(trace["traceEvents"], list)


def test_every_event_has_the_keys_of_its_phase_type(trace: dict[str, Any]) -> None:
    seen = set()
    for e in trace["traceEvents"]:
        ph = e["ph"]
        seen.add(ph)
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int)
        if ph == "X":
            assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
            assert is_number(e["ts"]) and is_number(e["dur"]) and e["dur"] >= 0
            assert isinstance(e["tid"], int)
        elif ph == "C":
            assert {"name", "ph", "ts", "pid", "args"} <= e.keys()
            assert is_number(e["ts"])
            assert e["args"] and all(is_number(v) for v in e["args"].values()), e
        elif ph == "M":
            assert {"name", "ph", "pid", "args"} <= e.keys()
            assert isinstance(e["args"], dict)
            if e["name"].startswith("thread_"):
                assert isinstance(e["tid"], int)
        else:
            pytest.fail(f"unexpected phase type {ph!r}")
    assert seen == {"X", "C", "M"}


# --- processes and threads ----------------------------------------------------------------


def test_one_process_per_rank_named_with_its_host(trace: dict[str, Any]) -> None:
    names = {e["pid"]: e["args"]["name"] for e in events(trace, "M", name="process_name")}
    assert names == {0: "rank 0 (node-a)", 1: "rank 1 (node-a)", 2: "rank 2 (node-b)"}
    assert len(events(trace, "M", name="process_name")) == N_RANKS
    order = {e["pid"]: e["args"]["sort_index"] for e in events(trace, "M", name="process_sort_index")}
    assert order == {0: 0, 1: 1, 2: 2}


def test_threads_are_named(trace: dict[str, Any]) -> None:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events(trace, "M", name="thread_name")}
    assert names == {
        (0, 0): "iterations",
        (0, 1): "communication",
        (0, 2): "communication 2",
        (0, 3): "communication 3",
        (1, 0): "iterations",
        (1, 1): "communication",
        (2, 0): "iterations",
    }
    used = {(e["pid"], e["tid"]) for e in events(trace, "X")}
    assert used == set(names)


# --- iterations and phases ------------------------------------------------------------------


def test_iteration_events(trace: dict[str, Any]) -> None:
    its = [e for e in events(trace, "X", tid=0) if e["name"].startswith("iteration ")]
    assert len(its) == N_RANKS * N_ITER
    it = make_iterations()
    for e in its:
        r, i = e["pid"], int(e["name"].split()[1])
        assert e["ts"] == pytest.approx(it[r, i]["t_start"] * 1e6, abs=TOL_US)
        assert e["dur"] == pytest.approx(90_000.0, abs=1e-3)
        assert e["args"]["samples"] == 8
        assert e["args"]["warmup"] is (i == 0)
        assert e["cat"] == ("warmup" if i == 0 else "iteration")
        if (r, i) == (2, 0):
            assert e["args"]["loss"] is None  # NaN loss: null in JSON
        else:
            assert e["args"]["loss"] == pytest.approx(2.0 - 0.1 * i, rel=1e-6)


def test_phases_nest_end_to_end_inside_their_iteration(trace: dict[str, Any]) -> None:
    x = events(trace, "X", tid=0)
    for parent in (e for e in x if e["name"].startswith("iteration ")):
        i = parent["args"]["iteration"]
        children = [e for e in x if e["name"] in PHASES and e["pid"] == parent["pid"] and e["args"]["iteration"] == i]
        assert [c["name"] for c in children] == ["data", "forward", "backward", "comm", "update"]  # h2d is 0
        cursor = parent["ts"]
        for c in children:
            assert c["ts"] >= parent["ts"] - TOL_US
            assert end(c) <= end(parent) + TOL_US
            assert c["ts"] == pytest.approx(cursor, abs=TOL_US)  # laid end to end
            assert c["dur"] > 0
            assert c["cat"] == ("phase,warmup" if i == 0 else "phase")
            cursor = end(c)
    full = [e for e in x if e["pid"] == 1 and e["name"] == "update" and e["args"]["iteration"] == 3]
    parent = next(e for e in x if e["pid"] == 1 and e["name"] == "iteration 3")
    assert end(full[0]) == pytest.approx(end(parent), abs=TOL_US)


# --- communication --------------------------------------------------------------------------


def test_no_overlap_on_any_thread(trace: dict[str, Any]) -> None:
    by_thread: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events(trace, "X"):
        by_thread[e["pid"], e["tid"]].append(e)
    for (_, tid), evs in by_thread.items():
        if tid == 0:  # iterations do not overlap each other, nor phases each other
            assert_disjoint([e for e in evs if e["name"].startswith("iteration ")])
            assert_disjoint([e for e in evs if e["name"] in PHASES])
        else:
            assert_disjoint(evs)


def test_overlapping_messages_go_to_separate_lanes(trace: dict[str, Any]) -> None:
    lanes = {e["name"]: e["tid"] for e in events(trace, "X", pid=0, cat="comm")}
    assert lanes == {
        "allreduce bucket0": 1,
        "allreduce bucket1": 2,
        "allreduce bucket2": 3,
        "allreduce (tp) bucket3": 1,  # bucket0 has ended by then
    }


def test_comm_events_carry_bytes_dtype_and_iteration(trace: dict[str, Any]) -> None:
    comm = events(trace, "X", cat="comm")
    assert len(comm) == len(make_comm())
    got = {(e["pid"], e["name"]): e["args"] for e in comm}
    for row in make_comm():
        axis = row["axis"].decode()
        kind = row["op"].decode() + ("" if axis == "dp" else f" ({axis})")  # a tensor-parallel group's, named
        args = got[int(row["rank"]), f"{kind} {row['name'].decode()}"]
        assert args["axis"] == axis
        assert args["bytes"] == int(row["bytes"])
        assert isinstance(args["bytes"], int)
        assert args["dtype"] == row["dtype"].decode()
        assert args["iteration"] == int(row["iteration"])


def test_microseconds_for_a_known_value(trace: dict[str, Any]) -> None:
    (e,) = events(trace, "X", name="broadcast fc1.weight")
    assert e["pid"] == 1
    assert e["ts"] == pytest.approx(1_250_000.0, abs=TOL_US)  # 1.25 s
    assert e["dur"] == pytest.approx(7_500.0, abs=1e-3)  # 7.5 ms
    (it,) = events(trace, "X", pid=0, name="iteration 2")
    assert it["ts"] == pytest.approx(1_200_000.0, abs=TOL_US)


def test_no_comm_and_no_resources_gives_iterations_only() -> None:
    trace = chrome_trace(
        make_iterations(),
        make_ranks(),
        np.zeros(0, dtype=COMM_DTYPE),
        np.zeros(0, dtype=RESOURCE_DTYPE),
        HOSTS,
        "schema-1",
    )
    assert not events(trace, "C")
    assert not events(trace, "X", cat="comm")
    assert {e["tid"] for e in events(trace, "M", name="thread_name")} == {0}
    assert len(events(trace, "M", name="process_name")) == N_RANKS
    json.loads(json.dumps(trace, allow_nan=False))


# --- resources ------------------------------------------------------------------------------


def test_cpu_and_rss_counters(trace: dict[str, Any]) -> None:
    cpu = sorted(events(trace, "C", name="cpu %", pid=0), key=lambda e: e["ts"])
    assert [e["ts"] for e in cpu] == pytest.approx([1.0e6, 1.2e6, 1.4e6], abs=TOL_US)
    assert cpu[1]["args"] == pytest.approx({"user": 51.0, "system": 5.0, "iowait": 0.5, "steal": 2.0})
    assert "steal" not in cpu[0]["args"]
    rss = sorted(events(trace, "C", name="rss MiB", pid=2), key=lambda e: e["ts"])
    assert [e["args"]["rss"] for e in rss] == pytest.approx([100.0, 101.0, 102.0])
    assert len(events(trace, "C", name="cpu %")) == N_RANKS * 3


def test_a_file_before_schema_6_has_no_steal_counter(trace: dict[str, Any]) -> None:
    """Resources of a schema-5 file (no cpu_steal column), as the reader gives them (store/upgrade.py)."""
    res = make_resources()
    kept = [name for name in RESOURCE_DTYPE.names or () if name not in ("cpu_steal", "child_run_ns", "work_wait")]
    old = np.asarray(res[kept].astype(np.dtype([(name, RESOURCE_DTYPE[name]) for name in kept])))
    old_trace = chrome_trace(
        make_iterations(), make_ranks(), make_comm(), upgrade.table(RESOURCES, old, 5), HOSTS, "torch-gloo-lenet-n1x3"
    )
    cpu = events(old_trace, "C", name="cpu %")
    assert len(cpu) == N_RANKS * 3 and not [e for e in cpu if "steal" in e["args"]]
    without_steal = [e for e in trace["traceEvents"] if e["name"] != "cpu %"]
    assert [e for e in old_trace["traceEvents"] if e["name"] != "cpu %"] == without_steal


def test_absent_gpu_gives_no_gpu_counters(trace: dict[str, Any]) -> None:
    assert not [e for e in events(trace, "C") if e["name"].startswith("gpu")]


def test_gpu_counters_where_present() -> None:
    trace = make_trace(gpu=True)
    for name, key, values in (
        ("gpu util %", "util", [80.0, 81.0, 82.0]),
        ("gpu mem MiB", "used", [2048.0, 2049.0, 2050.0]),
        ("gpu power W", "power", [250.0] * 3),
    ):
        for r in range(N_RANKS):
            evs = sorted(events(trace, "C", name=name, pid=r), key=lambda e: e["ts"])
            assert [e["args"][key] for e in evs] == pytest.approx(values), name


def test_infiniband_rate_from_consecutive_samples(trace: dict[str, Any]) -> None:
    for r in (0, 1):  # node-a has InfiniBand counters
        ib = sorted(events(trace, "C", name="ib MB/s", pid=r), key=lambda e: e["ts"])
        assert [e["ts"] for e in ib] == pytest.approx([1.0e6, 1.2e6], abs=TOL_US)  # from each interval's start
        assert ib[0]["args"] == pytest.approx({"rx": 10.0, "tx": 5.0})  # 2 MB and 1 MB in 0.2 s
        assert ib[1]["args"] == pytest.approx({"rx": 20.0, "tx": 0.0})
    assert not events(trace, "C", name="ib MB/s", pid=2)  # node-b: -1, absent
