"""The figures of a workload users compare across frameworks and layouts (docs/metrics-and-model.md,
"Tokens, FLOPs and MFU"), from what the worker recorded (frameworks/workload.py) and the measured
throughput:

- `tokens_per_s` = throughput × tokens per sample (a sequence model's; none for images) and
  `tokens_per_s_device` = that over the devices the ranks used (a GPU per rank; a CPU per
  node);
- `tflops_device`: model FLOP/s per device = throughput × the model's training FLOPs per
  sample / devices (workloads/flops.py);
- `mfu` = that over the device's dense peak for the point's precision (devices/peaks.py),
  with `peak_source` saying which peak (a datasheet's, or measured by `hpcbench check
  --peak`); blank without a peak, and `mfu_note` says why;
- `peak_device_gib` and `peak_host_gib`: the largest over ranks of the framework allocator's
  peak device memory and of the process's peak resident set, at the last test;
- `perplexity`: exp of the held-out loss of a language model (the mean over ranks of their
  last test's mean token loss; a masked-LM's over its masked tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hpcbench.devices import cache, peaks
from hpcbench.errors import HpcbenchError
from hpcbench.store.reader import PointData

GIB = 2**30
COLUMNS = [
    "precision", "seq_len", "compile", "tokens_per_s", "tokens_per_s_device", "tflops_device", "mfu",
    "peak_source", "mfu_note", "peak_device_gib", "peak_host_gib", "perplexity",
]  # fmt: skip


def _peak_memory(p: PointData, column: str) -> float:
    ev = p.eval
    if not len(ev):
        return math.nan
    values = ev[column][ev[column] >= 0]
    return float(values.max()) / GIB if values.size else math.nan


def _perplexity(p: PointData, tokens: int) -> float:
    ev = p.eval
    if not tokens or not len(ev):
        return math.nan
    last = ev[ev["iteration"] == ev["iteration"].max()]
    return float(np.exp(last["loss"].astype(float).mean()))


def row(p: PointData, throughput: float) -> dict[str, Any]:
    """The workload columns of one point whose measured throughput is `throughput` samples/s."""
    prov, point = p.provenance, p.point
    tokens = int(prov.get("tokens_per_sample") or 0)
    flops = float(prov.get("model_flops_per_sample") or math.nan)
    on_devices = point.ranks * point.devices_per_rank if point.device == "cuda" else point.nodes
    devices = int(prov.get("mfu_devices") or on_devices)
    rate = throughput * flops / devices if throughput > 0 else math.nan
    out: dict[str, Any] = {
        "precision": point.precision or "fp32",
        "seq_len": tokens or math.nan,
        "compile": point.compile or "",
        "tokens_per_s": throughput * tokens if tokens else math.nan,
        "tokens_per_s_device": throughput * tokens / devices if tokens else math.nan,
        "tflops_device": rate / 1e12,
        "peak_device_gib": _peak_memory(p, "peak_device_bytes"),
        "peak_host_gib": _peak_memory(p, "peak_host_bytes"),
        "perplexity": _perplexity(p, tokens),
    }
    value, source, note = math.nan, "", ""
    peak = recorded_peak(prov)
    if peak is not None:
        value = peaks.mfu(throughput * flops, peak, devices) if throughput > 0 else math.nan
        source = peak.source
        note = peaks.mfu_problem(value, peak) or ""
    elif "model_flops_per_sample" in prov:
        note = f"{prov.get('peak_source', 'no peak recorded')}: run `hpcbench check --peak` on that machine"
    else:
        note = "written before hpcbench recorded model FLOPs"
    out.update(mfu=value, peak_source=source, mfu_note=note)
    return out


def recorded_peak(prov: dict[str, object]) -> peaks.Peak | None:
    """The peak the worker recorded, else the one that applies now to the recorded device (a
    peak measured on it since, with `hpcbench check --peak`, here), else None."""
    if prov.get("peak_flops_per_s"):
        return peaks.Peak(float(str(prov["peak_flops_per_s"])), str(prov.get("peak_dtype", "")),
                          str(prov["peak_source"]), str(prov.get("device_name", "")))  # fmt: skip
    name, dtype = prov.get("device_name"), prov.get("peak_dtype")
    if not isinstance(name, str) or not isinstance(dtype, str):
        return None
    try:
        found = peaks.peak_for(name, dtype, cache.load_measured())
    except HpcbenchError:
        return None
    if found is None:
        return None
    return peaks.Peak(found.flops_per_s, dtype, f"{found.source} (found at analysis)", name)


def add(table: pd.DataFrame, points: Sequence[PointData]) -> pd.DataFrame:
    """`table` (one row per point, a `throughput` column) with the workload columns."""
    if table.empty:
        return table.reindex(columns=[*table.columns, *COLUMNS])
    by_id = {p.point_id: p for p in points}
    pairs = zip(table["point"], table["throughput"], strict=True)
    rows = [{"point": pid, **row(by_id[pid], float(x))} for pid, x in pairs]
    return table.merge(pd.DataFrame(rows)[["point", *COLUMNS]], on="point", how="left")


def has_tokens(table: pd.DataFrame) -> bool:
    return "tokens_per_s" in table and bool(table["tokens_per_s"].notna().any())


def notes(table: pd.DataFrame) -> list[str]:
    """What the MFU column was computed against, one line per peak naming its points, and
    why it is blank or suspect where it is (one line per reason)."""
    if not has_tokens(table) and not ("mfu" in table and table["mfu"].notna().any()):
        return []
    out = []
    for column, what in (("peak_source", "MFU is taken against {}"), ("mfu_note", "MFU: {}")):
        for value, group in table.groupby(column, sort=True):
            if value:
                out.append(f"{what.format(value)} (points {', '.join(group['point'])})")
    return out
