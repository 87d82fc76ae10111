"""The exported tables' columns, and each point's rows of them as Arrow tables.

One declaration per column (name, type, unit, meaning, encoding); `*_chunks` turn a point's
numpy arrays into Arrow tables of at most CHUNK_ROWS rows each, column by column.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from hpcbench.analysis.export.columns import (
    STRING,
    Column,
    constant,
    counter,
    floats,
    ints,
    nanoseconds,
    strings,
    table,
)
from hpcbench.spec import Point
from hpcbench.store import schema
from hpcbench.store.reader import PointData

CHUNK_ROWS = 1 << 20  # rows converted at a time, and the size of a row group of the large tables

POINT = Column("point", STRING, "", "the point's id (its file is SWEEP_DIR/<point>.h5)", "dictionary")
RANK = Column("rank", pa.int32(), "", "the rank (0 .. ranks - 1)", "dictionary")
_SINCE_EPOCH = "since the point's epoch_ns (points.parquet), on the common clock of its ranks"

_PHASE_DOCS = {
    "data": "waiting for the next batch",
    "h2d": "copying the batch to the device",
    "forward": "forward pass",
    "backward": "backward pass (with overlapped communication: until the last gradient bucket was ready)",
    "comm": "gradient exchange still outstanding after backward (the part not overlapped)",
    "update": "optimizer step",
}

ITERATIONS = (
    POINT,
    RANK,
    Column("iteration", pa.int32(), "", "0-based index in the point's run, warm-up included", "delta"),
    Column("warmup", pa.bool_(), "", "a warm-up iteration (left out of every metric)"),
    Column("t_start_ns", pa.int64(), "ns", f"start of the iteration, {_SINCE_EPOCH}", "delta"),
    Column("t_end_ns", pa.int64(), "ns", f"end of the iteration, {_SINCE_EPOCH}", "delta"),
    *(Column(f"{phase}_ns", pa.int64(), "ns", f"phase duration: {doc}", "delta") for phase, doc in _PHASE_DOCS.items()),
    Column("comm_total_ns", pa.int64(), "ns", "summed duration of all the iteration's gradient messages", "delta"),
    Column("samples", pa.int32(), "samples", "samples this rank processed in the iteration", "dictionary"),
    Column("loss", pa.float32(), "", "training loss of the batch", "split"),
)

MESSAGES = (
    POINT,
    RANK,
    Column("iteration", pa.int32(), "", "the iteration (0-based, warm-up included) the message belongs to", "delta"),
    Column(
        "op",
        STRING,
        "",
        "allreduce | allgather | reducescatter | broadcast | alltoall | send | recv | push | pull",
        "dictionary",
    ),
    Column("axis", STRING, "", "the mesh axis of the group the message spans: dp | fsdp | tp | pp", "dictionary"),
    Column("name", STRING, "", "bucket index or tensor name", "dictionary"),
    Column("dtype", STRING, "", "element type of the message", "dictionary"),
    Column("bytes", pa.int64(), "bytes", "message size", "dictionary"),
    Column("t_start_ns", pa.int64(), "ns", f"handed to the backend, {_SINCE_EPOCH}", "delta"),
    Column("t_end_ns", pa.int64(), "ns", f"completion seen, {_SINCE_EPOCH}", "delta"),
)

WORK_WAIT_MEANING = "its threads' run-queue wait share since the sample before that read them all, by CPU time"
RESOURCES = (
    POINT,
    RANK,
    Column("t_ns", pa.int64(), "ns", f"time of the sample, {_SINCE_EPOCH}", "delta"),
    Column("cpu_user_pct", pa.float32(), "%", "node CPU time in user mode (as sysstat reports it)", "split"),
    Column("cpu_system_pct", pa.float32(), "%", "node CPU time in the kernel", "split"),
    Column("cpu_iowait_pct", pa.float32(), "%", "node CPU time waiting for I/O", "split"),
    Column("cpu_steal_pct", pa.float32(), "%", "node CPU time stolen by the hypervisor; null without", "split"),
    Column("rss_bytes", pa.int64(), "bytes", "the rank's resident memory; null when not measured", "delta"),
    Column("gpu_util_pct", pa.float32(), "%", "GPU utilisation; null without a GPU", "split"),
    Column("gpu_mem_bytes", pa.int64(), "bytes", "GPU memory used; null without a GPU", "delta"),
    Column("gpu_power_w", pa.float32(), "W", "GPU power draw; null without a GPU", "split"),
    Column("gpu_sm_clock_mhz", pa.float32(), "MHz", "GPU SM clock; null without a GPU", "split"),
    Column("ib_rx_bytes", pa.int64(), "bytes", "InfiniBand bytes received (node's ports); null without", "delta"),
    Column("ib_tx_bytes", pa.int64(), "bytes", "InfiniBand bytes sent (node's ports); null without", "delta"),
    Column("sched_run_ns", pa.int64(), "ns", "CPU time of the rank's threads, cumulative; null without", "delta"),
    Column("sched_wait_ns", pa.int64(), "ns", "their run-queue wait for a CPU, cumulative; null without", "delta"),
    Column("main_run_ns", pa.int64(), "ns", "CPU time of the rank's main thread, cumulative; null without", "delta"),
    Column("main_wait_ns", pa.int64(), "ns", "its run-queue wait for a CPU, cumulative; null without", "delta"),
    Column("child_run_ns", pa.int64(), "ns", "CPU time of the rank's descendants, cumulative; null without", "delta"),
    Column("work_wait", pa.float32(), "fraction", WORK_WAIT_MEANING, "split"),
)

EVALUATIONS = (
    POINT,
    RANK,
    Column("epoch", pa.int32(), "", "epochs completed (1-based); 0 when the point counts iterations", "dictionary"),
    Column("iteration", pa.int32(), "", "training iterations completed, warm-up included", "delta"),
    Column("train_time_ns", pa.int64(), "ns", "the rank's training wall time so far (evaluations left out)", "delta"),
    Column("test_time_ns", pa.int64(), "ns", "wall time of this evaluation", "delta"),
    Column("correct", pa.int64(), "samples", "correctly classified samples of the rank's shard", "delta"),
    Column("total", pa.int64(), "samples", "samples of the rank's shard", "delta"),
    Column("loss", pa.float32(), "", "mean test loss", "split"),
    Column("param_checksum", pa.float64(), "", "checksum of the weights: equal on ranks that agree", "split"),
    Column("peak_device_bytes", pa.int64(), "bytes", "the allocator's peak device memory so far (null: none)", "delta"),
    Column("peak_host_bytes", pa.int64(), "bytes", "the process's peak resident set so far", "delta"),
)

ENERGY = (
    POINT,
    RANK,
    Column("t_ns", pa.int64(), "ns", f"time of the reading (between steps), {_SINCE_EPOCH}", "delta"),
    Column("source", STRING, "", "rapl | nvml-counter | nvml-power | ipmi-power", "dictionary"),
    Column("domain", STRING, "", "the counter read: package-0, dram-0, psys, gpu-0, ...", "dictionary"),
    Column(
        "microjoules",
        pa.int64(),
        "uJ",
        "cumulative since the source's own origin: differences of one counter only",
        "delta",
    ),
)

RANKS = (
    POINT,
    RANK,
    Column("local_rank", pa.int32(), "", "rank on its node", "dictionary"),
    Column("node_rank", pa.int32(), "", "index of its node", "dictionary"),
    Column("hostname", STRING, "", "the node it ran on", "dictionary"),
    Column("pid", pa.int64(), "", "process id", "delta"),
    Column("clock_offset_ns", pa.int64(), "ns", "wall clock minus monotonic clock, read at start", "delta"),
)

# Where each table's columns come from in the point file (the columns above, in order).
SOURCES = {
    "iterations": schema.ITERATION_DTYPE,
    "messages": schema.COMM_DTYPE,
    "resources": schema.RESOURCE_DTYPE,
    "evaluations": schema.EVAL_DTYPE,
    "energy": schema.ENERGY_DTYPE,
    "ranks": schema.RANK_DTYPE,
}


def _rank_ids(p: PointData) -> np.ndarray:
    n_ranks = p.iterations.shape[0]
    ids = p.ranks["rank"][:n_ranks] if len(p.ranks) >= n_ranks else np.arange(n_ranks)
    return np.asarray(ids, dtype=np.int32)


def iteration_chunks(p: PointData) -> Iterator[Any]:
    """point x rank x iteration rows, a block of whole ranks at a time."""
    n_ranks, n_iters = p.iterations.shape
    rank_ids = _rank_ids(p)
    step = max(1, CHUNK_ROWS // max(1, n_iters))
    for r0 in range(0, n_ranks, step):
        block = p.iterations[r0 : r0 + step].reshape(-1)
        k = len(block) // max(1, n_iters)
        arrays = {
            "point": constant(p.point_id, len(block)),
            "rank": pa.array(np.repeat(rank_ids[r0 : r0 + k], n_iters)),
            "iteration": pa.array(np.tile(np.arange(n_iters, dtype=np.int32), k)),
            "warmup": pa.array(block["warmup"] != 0),
            "samples": ints(block["samples"]),
            "loss": floats(block["loss"]),
        }
        for name in ("t_start", "t_end", *schema.PHASES, "comm_total"):
            arrays[f"{name}_ns"] = nanoseconds(block[name])
        yield table(ITERATIONS, arrays)


def _rank_rows(
    p: PointData, rows: np.ndarray, declared: Sequence[Column], make: Callable[[np.ndarray], dict[str, Any]]
) -> Iterator[Any]:
    """The `declared` table of per-rank `rows`, a block of rows at a time: the point, the rank,
    and what `make` makes of the block."""
    for i in range(0, len(rows), CHUNK_ROWS):
        block = rows[i : i + CHUNK_ROWS]
        yield table(declared, {"point": constant(p.point_id, len(block)), "rank": ints(block["rank"]), **make(block)})


def message_chunks(p: PointData) -> Iterator[Any]:
    return _rank_rows(p, p.comm, MESSAGES, lambda rows: {
        "iteration": ints(rows["iteration"]),
        "op": strings(rows["op"]),
        "axis": strings(rows["axis"]),
        "name": strings(rows["name"]),
        "dtype": strings(rows["dtype"]),
        "bytes": ints(rows["bytes"], np.int64),
        "t_start_ns": nanoseconds(rows["t_start"]),
        "t_end_ns": nanoseconds(rows["t_end"]),
    })  # fmt: skip


def _resource_columns(rows: np.ndarray) -> dict[str, Any]:
    arrays = {"t_ns": nanoseconds(rows["t"])}
    for name in ("cpu_user", "cpu_system", "cpu_iowait", "cpu_steal", "gpu_util"):
        arrays[f"{name}_pct"] = floats(rows[name])
    for name in ("gpu_power_w", "gpu_sm_clock_mhz", schema.WORK_WAIT):
        arrays[name] = floats(rows[name])
    counters = ("rss_bytes", "gpu_mem_bytes", "ib_rx_bytes", "ib_tx_bytes", *schema.SCHED_COLUMNS, schema.CHILD_RUN)
    for name in counters:
        arrays[name] = counter(rows[name])  # -1 (null) where not measured, and in files before the column
    return arrays


def resource_chunks(p: PointData) -> Iterator[Any]:
    return _rank_rows(p, p.resources, RESOURCES, _resource_columns)


def energy_chunks(p: PointData) -> Iterator[Any]:
    return _rank_rows(p, p.energy, ENERGY, lambda rows: {
        "t_ns": nanoseconds(rows["t"]),
        "source": strings(rows["source"]),
        "domain": strings(rows["domain"]),
        "microjoules": ints(rows["microjoules"], np.int64),
    })  # fmt: skip


def evaluation_chunks(p: PointData) -> Iterator[Any]:
    return _rank_rows(p, p.eval, EVALUATIONS, lambda rows: {
        "epoch": ints(rows["epoch"]),
        "iteration": ints(rows["iteration"]),
        "train_time_ns": nanoseconds(rows["train_time_s"]),
        "test_time_ns": nanoseconds(rows["test_time_s"]),
        "correct": ints(rows["correct"], np.int64),
        "total": ints(rows["total"], np.int64),
        "loss": floats(rows["loss"]),
        "param_checksum": floats(rows["param_checksum"]),
        "peak_device_bytes": counter(rows["peak_device_bytes"]),
        "peak_host_bytes": counter(rows["peak_host_bytes"]),
    })  # fmt: skip


def rank_chunks(p: PointData) -> Iterator[Any]:
    return _rank_rows(p, p.ranks, RANKS, lambda rows: {
        "local_rank": ints(rows["local_rank"]),
        "node_rank": ints(rows["node_rank"]),
        "hostname": strings(rows["hostname"]),
        "pid": ints(rows["pid"], np.int64),
        "clock_offset_ns": ints(rows["clock_offset_ns"], np.int64),
    })  # fmt: skip


# ---------------------------------------------------------------------------------------
# points.parquet: one row per point, the analysis' points table and the file's attributes


def _field_type(annotation: Any) -> Any:
    options = typing.get_args(annotation) or (annotation,)
    if int in options:
        return pa.int64()
    if float in options:
        return pa.float64()
    return STRING  # str, and mappings written as JSON text


def _point_column(f: dataclasses.Field[Any]) -> Column:
    kind = _field_type(_HINTS[f.name])
    doc = "Point field (docs/spec.md)" + (", a mapping as JSON text" if "tuple" in str(f.type) else "")
    return Column(f.name, kind, "", doc, "dictionary" if kind == STRING else "plain")


_HINTS = typing.get_type_hints(Point)
POINTS = (
    POINT,
    Column("config", STRING, "", "the id shared by repeats of a configuration (the id with seed 0)", "dictionary"),
    *(_point_column(f) for f in sorted(dataclasses.fields(Point), key=lambda f: f.name)),
    Column("ranks", pa.int32(), "", "ranks that ran (nodes x ranks_per_node)"),
    Column("hosts", pa.int32(), "", "distinct hosts the ranks ran on"),
    Column("file", STRING, "", "the point file's name in SWEEP_DIR", "dictionary"),
    Column("blas", STRING, "", "BLAS libraries the ranks used (provenance); null if not recorded", "dictionary"),
    Column("sweep", STRING, "", "name of the sweep", "dictionary"),
    Column("created", STRING, "", "UTC time the file was created (ISO 8601)", "dictionary"),
    Column("epoch_ns", pa.int64(), "ns", "wall clock (since the Unix epoch) that is time 0 of the point's times"),
    Column("hpcbench_version", STRING, "", "version of the hpcbench that wrote the file", "dictionary"),
    Column("schema_version", pa.int32(), "", "point-file schema version"),
    Column("iterations_written", pa.int64(), "", "iterations recorded per rank, warm-up included"),
)


def points_row(p: PointData, analysed: dict[Any, Any]) -> dict[str, Any]:
    """The point's row: `analysed` (its row of analysis.tables.points_table) and the file's
    attributes, as plain Python values (NaN and absent as None)."""
    row = {c.name: _plain(analysed.get(c.name)) for c in POINTS}
    row["file"] = p.path.name
    for key in ("sweep", "created", "hpcbench_version"):
        row[key] = None if p.attrs.get(key) is None else str(p.attrs[key])
    for key in ("epoch_ns", "schema_version", "iterations_written"):
        row[key] = None if p.attrs.get(key) is None else int(p.attrs[key])
    return row


def points_table(rows: list[dict[str, Any]]) -> Any:
    return pa.Table.from_pylist(rows, schema=pa.schema([c.field() for c in POINTS]))


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value != value:  # NaN: absent
        return None
    return value
