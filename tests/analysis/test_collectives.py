"""Collectives per mesh axis (analysis/collectives.py) on point files written through the real
writer, whose messages' bytes and durations are set here: known bytes and times give known
algbw and busbw (nccl-tests' factors), warm-up left out, each axis's level from the layout."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcbench.analysis import collectives, pipeline
from hpcbench.analysis.report import html as report
from hpcbench.cli.analyze import cmd_summary
from hpcbench.spec import Point
from hpcbench.spec.parallel import Layout
from hpcbench.store.reader import read_point
from hpcbench.testing.arrays import comm_rows, iterations
from hpcbench.testing.fabricate import write_point_file

WARMUP, ITERS = 2, 6
MB = 1_000_000


def _messages(ranks: int, kinds: list[tuple[bytes, bytes, int, float, int]]) -> np.ndarray:
    """Every rank, every iteration: `count` messages of each (op, axis, bytes, seconds, count);
    warm-up iterations send 7 bytes taking a second (what the table must leave out)."""
    parts = []
    for op, axis, nbytes, seconds, count in kinds:
        rows = []
        for r in range(ranks):
            for i in range(ITERS):
                warm = i < WARMUP
                for k in range(count):
                    t0 = i * 10.0 + k * 0.1
                    rows.append((r, i, 7 if warm else nbytes, t0, t0 + (1.0 if warm else seconds)))
        parts.append(comm_rows(rows, op=op, axis=axis))
    return np.concatenate(parts)


def _point(tmp: Path, name: str, nodes: int, per_node: int, parallel: tuple[tuple[str, int], ...],
           kinds: list[tuple[bytes, bytes, int, float, int]]) -> Path:  # fmt: skip
    point = Point(framework="torch", backend="nccl", model="gpt_tiny", nodes=nodes, ranks_per_node=per_node,
                  batch_size=4, iterations=ITERS - WARMUP, warmup=WARMUP, parallel=parallel)  # fmt: skip
    ranks = nodes * per_node
    its = iterations(ranks, ITERS, warmup=WARMUP, forward=0.1, backward=0.2, period=10.0, batch=4)
    hosts = [f"node{r // per_node}" for r in range(ranks)]
    return write_point_file(tmp / f"{name}.h5", point, its, comm=_messages(ranks, kinds), hostnames=hosts)


SHARDED = [  # fsdp 4 × tp 2 on 2 nodes of 4: tp groups {0,1} inside a node, fsdp groups {0,2,4,6} across
    (b"allreduce", b"tp", 2 * MB, 1e-3, 4),
    (b"allgather", b"fsdp", 8 * MB, 4e-3, 2),
    (b"reducescatter", b"fsdp", 8 * MB, 8e-3, 1),
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("collectives")
    _point(tmp, "sharded", 2, 4, (("fsdp", 4), ("tp", 2)), SHARDED)
    _point(tmp, "plain", 1, 4, (), [(b"allreduce", b"dp", 3 * MB, 2e-3, 3)])
    return tmp


def _row(table: pd.DataFrame, op: str, axis: str) -> dict[str, object]:
    found = table[(table["op"] == op) & (table["axis"] == axis)]
    assert len(found) == 1, table
    return dict(found.iloc[0])


def test_known_bytes_and_durations_give_known_bandwidths(sweep: Path) -> None:
    table = collectives.of_point(read_point(sweep / "sharded.h5"))
    assert sorted(zip(table["op"], table["axis"], strict=True)) == [
        ("allgather", "fsdp"), ("allreduce", "tp"), ("reducescatter", "fsdp")]  # fmt: skip
    tp = _row(table, "allreduce", "tp")
    assert (tp["layout"], tp["group_size"], tp["level"]) == ("fsdp4 tp2", 2, "intra")
    assert tp["messages_per_iter"] == pytest.approx(4)  # warm-up's messages left out
    assert tp["bytes_per_iter"] == pytest.approx(8 * MB)
    assert tp["time_per_message_s"] == pytest.approx(1e-3)
    assert tp["algbw"] == pytest.approx(2e9)  # 2 MB in 1 ms
    assert tp["busbw"] == pytest.approx(2e9 * 2 * 1 / 2)  # all-reduce: 2(n−1)/n, n = 2
    gather = _row(table, "allgather", "fsdp")
    assert (gather["group_size"], gather["level"]) == (4, "inter")
    assert gather["algbw"] == pytest.approx(2e9) and gather["busbw"] == pytest.approx(2e9 * 3 / 4)
    assert gather["bytes_per_iter"] == pytest.approx(16 * MB) and gather["messages_per_iter"] == pytest.approx(2)
    scatter = _row(table, "reducescatter", "fsdp")
    assert scatter["algbw"] == pytest.approx(1e9) and scatter["busbw"] == pytest.approx(0.75e9)
    assert scatter["time_per_iter_s"] == pytest.approx(8e-3)


def test_plain_data_parallelism_is_one_dp_group(sweep: Path) -> None:
    row = _row(collectives.of_point(read_point(sweep / "plain.h5")), "allreduce", "dp")
    assert (row["layout"], row["group_size"], row["level"]) == ("dp4", 4, "intra")
    assert row["algbw"] == pytest.approx(1.5e9) and row["busbw"] == pytest.approx(1.5e9 * 2 * 3 / 4)
    assert row["messages_per_iter"] == pytest.approx(3) and row["bytes_per_iter"] == pytest.approx(9 * MB)


def test_levels_and_factors() -> None:
    assert collectives.level(Layout(dp=1, tp=2, fsdp=3), "tp", 3) == "mixed"  # {2,3} crosses nodes of 3
    assert collectives.level(Layout(dp=2, tp=4), "tp", 4) == "intra"
    assert collectives.level(Layout(dp=2, tp=4), "dp", 4) == "inter"
    assert collectives.bus_factor("broadcast", 8) == 1.0 and collectives.bus_factor("send", 2) == 1.0
    assert collectives.bus_factor("alltoall", 4) == 0.75
    assert np.isnan(collectives.bus_factor("push", 4))


def test_analyze_and_the_report_show_the_table(sweep: Path) -> None:
    out = io.StringIO()
    assert cmd_summary(sweep, out) == 0
    text = out.getvalue()
    assert "collectives per mesh axis" in text and "reducescatter" in text and "fsdp4 tp2" in text
    analysis = pipeline.analyse(sweep)
    assert len(analysis.collectives) == 4
    titles = [s.title for s in report.sections(analysis)]
    assert "Collectives per mesh axis" in titles
    assert "busbw (GB/s)" in report.render_markdown(analysis, [])


def test_a_sweep_without_layouts_has_no_section(tmp_path: Path) -> None:
    _point(tmp_path, "plain", 1, 2, (), [(b"allreduce", b"dp", MB, 1e-3, 1)])
    out = io.StringIO()
    assert cmd_summary(tmp_path, out) == 0
    assert "collectives per mesh axis" not in out.getvalue()
    assert pipeline.analyse(tmp_path).collectives.empty
