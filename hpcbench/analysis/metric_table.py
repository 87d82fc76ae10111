"""The derived metrics, each defined once: its column, label, unit and format, its formula (for
figures and docs), whether repeats summarise it, and the figure it is plotted in. The summary
table, the repeats, the report and the command line all read this table; a new metric is one
row here plus the function that computes it (hpcbench.analysis.metrics).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Format = Callable[[object], str]


def number(digits: int, scale: float = 1.0) -> Format:
    """`v * scale` with `digits` decimals and thousands separators; NaN as empty."""

    def fmt(v: object) -> str:
        if not isinstance(v, int | float) or isinstance(v, bool):
            return str(v)
        return "" if math.isnan(v) else f"{v * scale:,.{digits}f}"

    return fmt


def percent(v: object) -> str:
    """A fraction as a percentage with one decimal; NaN as empty."""
    return "" if not isinstance(v, int | float) or math.isnan(v) else f"{v:.1%}"


@dataclass(frozen=True)
class Metric:
    key: str  # the column in the summary and stats tables
    label: str  # column title, unit included
    fmt: Format
    formula: str = ""  # how it is computed (axis label of its figure)
    title: str = ""  # its figure's title, when it has one
    repeated: bool = False  # summarised over repeats (mean, 95 % CI, CV)
    ideal: bool = False  # its figure draws the ideal (1.0) line


METRICS: tuple[Metric, ...] = (
    Metric("t_iter_s", "t_iter (ms)", number(2, 1e3), "median over iterations of the ranks' mean", repeated=True),
    Metric("throughput", "samples/s", number(1), "samples/s", "Throughput X = N·b / t_iter", repeated=True),
    Metric("speedup", "speedup", number(2), "S(N) = X(N) / X(1)", repeated=True),
    Metric(
        "efficiency", "efficiency", percent, "E(N) = X(N) / (N·X(1))", "Scaling efficiency", repeated=True, ideal=True
    ),
    Metric("scaling", "scaling", str, "strong (global batch fixed) or weak (batch per rank fixed)"),
    Metric("lif", "LIF", number(3), "mean over iterations of max / mean rank compute", repeated=True),
    Metric("lif_excess", "LIF excess", percent, "(max − mean) / mean rank compute"),
    Metric(
        "comm_share",
        "comm summed",
        percent,
        "summed message time / t_iter (overlapping messages each counted: can pass 100 %)",
        "Summed message time / t_iter",
        repeated=True,
    ),
    Metric("comm_union_share", "comm in flight", percent, "time any message was in flight / t_iter"),
    Metric("comm_exposed_share", "comm exposed", percent, "time in flight after backward ended / t_iter"),
    Metric("overlap", "overlap", percent, "1 − comm exposed / comm in flight: message time backward hid"),
    Metric("cv", "CV", percent, "coefficient of variation of t_iter over iterations"),
    Metric("comm_total_s", "comm total (ms)", number(2, 1e3), "sum of the rank's message durations"),
    Metric("accuracy", "accuracy (%)", number(2, 100), repeated=True),
    Metric("train_time_s", "Training Time (s)", number(2), repeated=True),
    Metric("test_time_s", "Testing Time (s)", number(2), repeated=True),
    Metric("time_to_best_s", "time to best (s)", number(2), repeated=True),
    # a workload's figures (analysis/workload.py)
    Metric(
        "tokens_per_s", "tokens/s", number(0), "tokens/s = X · tokens per sample", "Tokens per second", repeated=True
    ),
    Metric("tokens_per_s_device", "tokens/s/device", number(0), "X · tokens per sample / devices"),
    Metric("tflops_device", "TFLOP/s/device", number(3), "X · model FLOPs per sample / devices / 10¹²"),
    Metric(
        "mfu",
        "MFU",
        percent,
        "model FLOP/s per device / the device's dense peak",
        "Model FLOPs utilisation",
        repeated=True,
    ),
    Metric("peak_device_gib", "device mem (GiB)", number(2), "the allocator's peak, largest rank"),
    Metric("peak_host_gib", "host RSS (GiB)", number(2), "the process's peak resident set, largest rank"),
    Metric("perplexity", "perplexity", number(2), "exp(held-out mean token loss)"),
    # the energy the counters read over the timed window (analysis/energy.py)
    Metric("energy_j", "energy (J)", number(1), "Σ packages, DRAM and GPUs over the timed window"),
    Metric("energy_per_sample_j", "J/sample", number(4), "energy / samples trained in the timed window", repeated=True),
    Metric("energy_per_token_j", "J/token", number(6), "energy per sample / tokens per sample"),
    Metric("power_gpu_w", "GPU W", number(1), "mean over GPUs of joules / seconds"),
    Metric("power_cpu_w", "CPU W", number(1), "mean over hosts of their packages' watts (RAPL)"),
    Metric("power_dram_w", "DRAM W", number(1), "mean over hosts of their DRAM's watts (RAPL)"),
    Metric("power_node_w", "node W", number(1), "mean over hosts of their node meter's watts (IPMI DCMI)"),
)
BY_KEY = {m.key: m for m in METRICS}
REPEATED = [m.key for m in METRICS if m.repeated]


def metric(key: str) -> Metric:
    return BY_KEY[key]
