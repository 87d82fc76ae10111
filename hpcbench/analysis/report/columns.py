"""The report's tables: their columns (`Column`: a stats column, its title and format) and what
each section shows and says of its figures. `html.py` renders them."""

from __future__ import annotations

from dataclasses import dataclass

from hpcbench.analysis.metric_table import Format, metric, number, percent

_num, _pct = number, percent


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    fmt: Format = str

    @classmethod
    def of(cls, key: str) -> Column:
        """The column of a derived metric, as the metric table defines it."""
        m = metric(key)
        return cls(m.key, m.label, m.fmt)


IDENT = [Column("point", "point"), Column("framework", "framework"), Column("backend", "backend"),
         Column("model", "model"), Column("ranks", "N"), Column("batch_size", "batch")]  # fmt: skip

SCALING = [
    *IDENT,
    *(Column.of(key) for key in ("t_iter_s", "throughput", "speedup", "efficiency", "scaling", "lif", "lif_excess")),
    *(Column.of(key) for key in ("comm_share", "comm_union_share", "comm_exposed_share", "overlap", "cv")),
]
PHASE_TABLE = [
    *IDENT,
    *(Column(f"{p}_s", f"{p} (ms)", _num(2, 1e3)) for p in ("data", "h2d", "forward", "backward", "comm", "update")),
    Column.of("comm_total_s"),
]
# seed 002's tables: training time, testing time, accuracy, CPU usage and memory
SEED002 = [
    *IDENT,
    Column("train_time_s", "Training Time (s)", _num(2)),
    Column("test_time_s", "Testing Time (s)", _num(2)),
    Column("accuracy", "Accuracy (%)", _num(2, 100)),
    Column("cpu_user", "CPU user %", _num(2)),
    Column("cpu_system", "CPU system %", _num(2)),
    Column("cpu_iowait", "CPU iowait %", _num(2)),
    Column("cpu_total", "CPU total %", _num(2)),
    Column("rank_cpus", "CPUs per rank", _num(2)),
    Column("cpu_wait", "loop waited for a CPU %", _num(1, 100)),  # run-queue wait, not iowait
    Column("work_wait", "threads waited for a CPU, by their work %", _num(1, 100)),
    Column("helper_cpus", "CPUs of the ranks' child processes", _num(2)),
    Column("other_cpus", "CPUs of other processes", _num(2)),
    Column("cpu_steal", "CPU steal %", _num(1)),
    Column("mem_avg_mib", "Memory AVG (MiB)", _num(2)),
    Column("mem_max_mib", "Memory MAX (MiB)", _num(2)),
]
ACCURACY = [
    *IDENT,
    Column("epochs", "epochs", _num(0)),
    Column("accuracy", "accuracy (%)", _num(2, 100)),
    Column("best_accuracy", "best (%)", _num(2, 100)),
    Column("time_to_best_s", "time to best (s)", _num(2)),
    Column("time_to_target_s", "time to target (s)", _num(2)),
]
# the columns the model's two tables share
MEASURED = Column("measured_t_iter_s", "measured (ms)", _num(2, 1e3))
ERROR = Column("rel_error", "error", _pct)
OVERSUBSCRIBED = Column("oversubscribed", "oversubscribed")
PREDICTION = [
    *IDENT,
    Column("calibration", "calibration"),
    MEASURED,
    Column("predicted_t_iter_s", "predicted WFBP (ms)", _num(2, 1e3)),
    ERROR,
    Column("predicted_no_overlap_s", "predicted no overlap (ms)", _num(2, 1e3)),
    Column("rel_error_no_overlap", "error (no overlap)", _pct),
    Column("measured_efficiency", "measured E", _pct),
    Column("predicted_efficiency", "predicted E", _pct),
    Column("alpha_s", "α (µs)", _num(2, 1e6)),
    Column("beta_s_per_byte", "β (ns/B)", _num(4, 1e9)),
    OVERSUBSCRIBED,
]
HELD_OUT = [
    *IDENT,
    OVERSUBSCRIBED,
    MEASURED,
    Column("predicted_t_iter_s", "predicted held out (ms)", _num(2, 1e3)),
    ERROR,
    Column("resid_compute_s", "miss: compute (ms)", _num(2, 1e3)),
    Column("resid_exchange_s", "miss: exchange (ms)", _num(2, 1e3)),
    Column("resid_other_s", "miss: no phase (ms)", _num(2, 1e3)),
    Column("repeat_spread", "repeats differ", _pct),
]
REPEATS = [
    Column("config", "configuration"), Column("framework", "framework"), Column("backend", "backend"),
    Column("model", "model"), Column("ranks", "N"), Column("batch_size", "batch"), Column("repeats", "repeats"),
    Column("throughput_mean", "samples/s mean", _num(1)), Column("throughput_ci95", "± 95 % CI", _num(1)),
    Column("throughput_cv", "CV", _pct), Column("t_iter_s_mean", "t_iter mean (ms)", _num(2, 1e3)),
    Column("t_iter_s_ci95", "± 95 % CI (ms)", _num(2, 1e3)),
]  # fmt: skip


# What tells a row apart where the columns before it do not (hpcbench.spec.labels): the fields
# that differ among the points whose framework, backend, env, model, N and batch are the same.
DIFFERS = Column("differs", "differs in")
SERIES_SAME = ("nodes", "ranks_per_node", "seed")  # one line of a vs-N figure: its x axis and repeats


WORKLOAD = [
    *IDENT,
    Column("precision", "precision"),
    Column("seq_len", "seq", _num(0)),
    Column("compile", "compile"),
    *(Column.of(key) for key in ("throughput", "tokens_per_s", "tokens_per_s_device", "tflops_device", "mfu")),
    Column("peak_source", "MFU's peak"),
    *(Column.of(key) for key in ("peak_device_gib", "peak_host_gib", "perplexity")),
]
ENERGY = [
    *IDENT,
    Column.of("throughput"),
    *(Column.of(key) for key in ("energy_j", "energy_per_sample_j", "energy_per_token_j")),
    *(Column.of(key) for key in ("power_gpu_w", "power_cpu_w", "power_dram_w", "power_node_w")),
    Column("energy_note", "why blank"),
]
ENERGY_ABOUT = (
    "What the counters read over the timed window (warm-up ended to loop ended), read between steps: each GPU's "
    "through NVML (its energy counter, or its power integrated between reads), each host's CPU packages and DRAM "
    "through RAPL. Energy = Σ packages, DRAM and GPUs (cores and uncore are inside their package); per sample: over "
    "the samples of the timed iterations; power: per GPU, and per host for CPU and DRAM; node W: the node meter's "
    "(IPMI DCMI) where the site has one, the whole node, not added into the energy. A window shorter than a "
    "counter's update interval is not a measurement: the point's figures are blank and the last column says why."
)
WORKLOAD_ABOUT = (
    "tokens/s = samples/s × tokens per sample (sequence models); per device: over the devices the ranks used "
    "(a GPU per rank, a CPU per node). TFLOP/s/device = samples/s × the model's training FLOPs per sample "
    "(forward and backward matrix products and attention, counted as PyTorch's FLOP counter counts them; "
    "embeddings, norms and the optimizer not counted) / devices. MFU = that over the device's dense peak for "
    "the point's precision: a datasheet's, chosen by the device's NVML name, or one measured with "
    "`hpcbench check --peak` (the column says which). Memory: the largest rank's allocator peak on its device "
    "and its process's peak resident set. Perplexity: exp of the held-out mean token loss."
)

# collectives per point x op x mesh axis (analysis/collectives.py), where some point runs a layout
COLLECTIVES = [
    Column("point", "point"), Column("layout", "layout"), Column("op", "op"), Column("axis", "axis"),
    Column("group_size", "n", _num(0)), Column("level", "level"),
    Column("messages_per_iter", "messages / iter / rank", _num(2)),
    Column("bytes_per_iter", "MB / iter / rank", _num(2, 1e-6)),
    Column("time_per_message_s", "time / message (ms)", _num(3, 1e3)),
    Column("algbw", "algbw (GB/s)", _num(2, 1e-9)), Column("busbw", "busbw (GB/s)", _num(2, 1e-9)),
]  # fmt: skip
COLLECTIVES_ABOUT = (
    "Each point's messages in its timed iterations by kind and mesh axis: per iteration and rank, the mean "
    "time of a message (hand-over to completion, waits for peers included), algbw = bytes / time and busbw = "
    "algbw × nccl-tests' bus factor over the axis's n ranks (all-reduce 2(n−1)/n; all-gather, reduce-scatter "
    "(n−1)/n; broadcast, send, receive 1); level: whether the axis's groups lie inside a node."
)

# the parallel layouts measured beside the layout model's predictions (analysis/layouts_measured.py)
LAYOUTS = [
    Column("config", "configuration"), Column("layout", "layout"), Column("point", "point"),
    Column("status", "status"), Column("calibration", "calibration"),
    Column("measured_t_iter_s", "measured t_iter (ms)", _num(2, 1e3)),
    Column("predicted_t_iter_s", "predicted t_iter (ms)", _num(2, 1e3)), Column("rel_error", "error", _pct),
    Column("measured_tokens_per_s", "measured tokens/s", _num(0)),
    Column("predicted_tokens_per_s", "predicted tokens/s", _num(0)),
    Column("measured_rank", "measured rank", _num(0)), Column("predicted_rank", "predicted rank", _num(0)),
    Column("measured_peak_device_gib", "measured peak memory / device (GiB)", _num(3)),
    Column("predicted_memory_gib", "predicted memory / device (GiB)", _num(3)),
    Column("predicted_exposed_s", "predicted exposed comm (ms)", _num(2, 1e3)),
    Column("predicted_bubble_s", "predicted bubble (ms)", _num(2, 1e3)), Column("note", "note"),
]  # fmt: skip
LAYOUTS_ABOUT = (
    "Points that differ only in their parallel layout, side by side. The layout model (hpcbench predict --layouts) "
    "is calibrated on the group's data-parallel point alone (the calibration row): its forward + backward as the "
    "one-device compute, split over tp × pp; α, β fitted on its all-reduce messages as the link; its data, "
    "host-to-device, update and time in no phase added as measured. Every other layout is held out; error = "
    "(predicted − measured) / measured. Ranks: by samples/s, 1 the most (the layouts train different global "
    "batches). A layout whose point ran out of memory is listed as such and not ranked."
)
