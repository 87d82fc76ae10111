"""The layout of a point file: one HDF5 file per point (job), shared by all its ranks.

::

    /                 attrs: schema_version, hpcbench_version, created, sweep, spec (YAML text),
                             status (running | complete | failed | stopped), n_ranks, n_iterations,
                             iterations_written, epoch_ns; failure (failed files), stop_reason
                             (stopped files)
    /point            attrs: every Point field that is set, id, json (the whole point)
    /provenance       attrs: hostnames, versions (Python, framework, MPI, HDF5), writer,
                             launcher source, selected environment variables (no secrets)
    /ranks            (n_ranks,) RANK_DTYPE: who each rank was and its clock offset
    /iterations       (n_ranks, n_iterations) ITERATION_DTYPE, rank-major
    /comm             (n_events,) COMM_DTYPE: every gradient message of every rank (schema >= 2)
    /resources        (n_samples,) RESOURCE_DTYPE: CPU / memory / GPU / InfiniBand samples (schema >= 2)
    /eval             (n_evals,) EVAL_DTYPE: held-out evaluations of every rank's shard (schema >= 3)
    /energy           (n_readings,) ENERGY_DTYPE: energy counters read between steps (schema >= 8)

Times: `t_start` / `t_end` are seconds since `epoch_ns` (wall clock, ns since the Unix
epoch, taken by rank 0 at creation) on the common clock: each rank measures with its
monotonic `perf_counter_ns` and adds its own `clock_offset_ns` (wall - monotonic, read once
at start), so ranks on different nodes line up to NTP accuracy. Phase columns are
durations in seconds; a phase that does not apply is 0.

Phases are disjoint and in this order inside an iteration: data (next batch), h2d (copy
to the device), forward, backward (gradient computation; with overlapped communication,
up to the moment the last gradient bucket was ready), comm (gradient exchange still
outstanding after backward: the non-overlapped part), update (optimizer step). So
data + h2d + forward + backward + comm + update <= t_end - t_start. `comm_total` is the
summed duration of all gradient messages of the iteration, overlapped or not.
"""

from __future__ import annotations

import numpy as np

# Schema history (bump on every change to what is written; readers accept <= current and bring an
# older file to the current shape as they read it, one step per version: store/upgrade.py):
#   1 (hpcbench 0.1.0): root/point/provenance attrs, ranks, iterations.
#   2 (hpcbench 0.2.0): comm and resources tables (rows of all ranks, a `rank` column),
#                       appended at every flush; readers give empty tables for version 1.
#                       iterations.warmup is uint8 0/1 (was numpy bool, an HDF5 enum that
#                       costs a type conversion on every write); the iterations dataset has
#                       no fill value (rows are valid up to iterations_written).
#   3 (hpcbench 0.3.0): eval table (test time and accuracy of each rank's held-out shard, after
#                       every epoch or at the end of training); readers give an empty table
#                       for older files.
#   4 (hpcbench 0.4.0): status `stopped` with `stop_reason`: the ranks were told to stop (SIGTERM,
#                       SIGINT, SIGUSR1/2: cancelled, requeued, preempted, time limit), agreed on
#                       an iteration and stopped there together, every row up to it written
#                       (iterations_written = that iteration on every rank); resumable, not failed.
#   5 (hpcbench 0.5.0): resources.sched_run_ns / sched_wait_ns (the rank process's CPU time and
#                       run-queue wait, all its threads, Linux schedstat) and main_run_ns /
#                       main_wait_ns (its main thread's); a sample is also taken when warm-up ends
#                       and when the timed loop ends. Readers fill the columns with -1 (not
#                       measured) in older files.
#   6 (hpcbench 0.6.0): resources.cpu_steal (the node's CPU time stolen by the hypervisor, percent,
#                       like cpu_user) and child_run_ns (the CPU time of the rank's descendant
#                       processes: a parameter server's servers, a framework's compute process).
#                       Readers fill them with NaN and -1 in older files. sched_run_ns is the
#                       process's CPU clock (ended threads included); sched_wait_ns and
#                       child_run_ns are -1 in the sampler thread's periodic samples.
#   7 (hpcbench 0.7.0): resources.work_wait (the run-queue wait share of the rank's threads, each
#                       weighted by its time on a CPU, since the sample before that read every
#                       thread): the wait of the threads that did the work, where a framework
#                       computes on its own threads. Readers fill it with NaN in older files.
#   8 (hpcbench 0.8.0): eval.peak_device_bytes (the most device memory the rank's framework had
#                       allocated so far: its allocator's peak; -1 on a CPU or where the framework
#                       has no such counter) and eval.peak_host_bytes (the rank process's peak
#                       resident set, getrusage's ru_maxrss). Readers fill both with -1 in older
#                       files. The energy table (each rank's GPU energy through NVML, each host's
#                       RAPL counters through its local rank 0, read when the timed loop begins,
#                       when warm-up ends, at every flush inside the loop and when it ends: never
#                       inside a step); readers give an empty table for older files.
#   9 (hpcbench 0.9.0): comm.axis (the mesh axis of the group a message spans: dp, fsdp, tp,
#                       pp; spec/parallel.py) and the collective kinds beyond all-reduce in
#                       comm.op (allgather, reducescatter, send, recv, broadcast, alltoall).
#                       Readers fill axis with "dp" in older files: every message then was a
#                       data-parallel one.
#   (unchanged at 9)    status `out_of_memory` with the `oom_*` attributes (OOM_ATTRS): a rank ran
#                       out of memory; a result, not resumed. Nothing else in the file changed:
#                       a reader that does not know the status sees a point that is not complete.
SCHEMA_VERSION = 9

PHASES = ("data", "h2d", "forward", "backward", "comm", "update")
COMPUTE_PHASES = ("data", "h2d", "forward", "backward", "update")  # what LIF compares

ITERATION_DTYPE = np.dtype(
    [("t_start", "<f8"), ("t_end", "<f8")]
    + [(phase, "<f8") for phase in PHASES]
    + [("comm_total", "<f8"), ("samples", "<i4"), ("loss", "<f4"), ("warmup", "u1")]
)

HOSTNAME_BYTES = 64
RANK_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("local_rank", "<i4"),
        ("node_rank", "<i4"),
        ("pid", "<i8"),
        ("clock_offset_ns", "<i8"),
        ("hostname", f"S{HOSTNAME_BYTES}"),
    ]
)

# One row per communication message (all-reduce of a gradient bucket, a fused Horovod
# tensor, a parameter-server push or pull, a sharded model's all-gather or reduce-scatter,
# a tensor-parallel all-reduce, a pipeline's send or receive), on the common clock like the
# iterations. `bytes` is the size nccl-tests calls a collective's: the whole buffer of an
# all-reduce or broadcast, the gathered output of an all-gather, the input of a
# reduce-scatter, the tensor sent or received.
COMM_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("iteration", "<i4"),
        ("op", "S16"),  # allreduce | allgather | reducescatter | broadcast | alltoall | send | recv | push | pull
        ("name", "S48"),  # bucket index or tensor name (beside op: the analysis reads the two as one key in place)
        ("axis", "S8"),  # the mesh axis its group spans: dp | fsdp | tp | pp (spec/parallel.py AXES)
        ("dtype", "S12"),
        ("bytes", "<i8"),
        ("t_start", "<f8"),  # when the message was handed to the backend
        ("t_end", "<f8"),  # when its completion was seen
    ]
)

# One row per resource sample of a rank (sampler thread in every rank, period settable).
# CPU percentages are of the whole node, as sysstat reports them; RSS is the rank's own.
# Absent sources are NaN (floats) or -1 (counters), never an error.
RESOURCE_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("t", "<f8"),
        ("cpu_user", "<f4"),
        ("cpu_system", "<f4"),
        ("cpu_iowait", "<f4"),
        ("cpu_steal", "<f4"),  # time the hypervisor ran something else on the node's virtual CPUs
        ("rss_bytes", "<i8"),
        ("gpu_util", "<f4"),  # percent
        ("gpu_mem_bytes", "<i8"),
        ("gpu_power_w", "<f4"),
        ("gpu_sm_clock_mhz", "<f4"),
        ("ib_rx_bytes", "<i8"),  # port counters summed over the node's InfiniBand ports
        ("ib_tx_bytes", "<i8"),
        # the rank process's threads, summed (/proc/self/task/*/schedstat), cumulative: time
        # on a CPU, and time runnable but waiting for one (-1: not Linux, or no schedstat);
        # main_*: the same of the rank's main thread (its training loop)
        ("sched_run_ns", "<i8"),
        ("sched_wait_ns", "<i8"),
        ("main_run_ns", "<i8"),
        ("main_wait_ns", "<i8"),
        # the rank's descendant processes (all their threads), cumulative time on a CPU
        ("child_run_ns", "<i8"),
        # the run-queue wait share of the rank's threads since the previous sample that read
        # every thread: Σ run_i · wait_i / (run_i + wait_i) / Σ run_i over the threads alive at
        # both (their differences); NaN in the periodic samples, the first one, or no run
        ("work_wait", "<f4"),
    ]
)
SCHED_COLUMNS = ("sched_run_ns", "sched_wait_ns", "main_run_ns", "main_wait_ns")  # absent before schema 5
CHILD_RUN = "child_run_ns"  # absent before schema 6, like cpu_steal
WORK_WAIT = "work_wait"  # absent before schema 7

# One row per evaluation of a rank on its shard of the held-out data (after every epoch, or
# once after training). The point's accuracy at an evaluation is sum(correct) / sum(total)
# over the ranks' rows with the same `epoch`; its test time is the slowest rank's.
EVAL_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("epoch", "<i4"),  # epochs completed (1-based); 0 when the point counts iterations, not epochs
        ("iteration", "<i4"),  # training iterations completed, warm-up included
        ("train_time_s", "<f8"),  # this rank's training wall time so far (iterations only, not evaluations)
        ("test_time_s", "<f8"),  # wall time of this evaluation
        ("correct", "<i8"),
        ("total", "<i8"),
        ("loss", "<f4"),  # mean test loss
        ("param_checksum", "<f8"),  # frameworks.base.checksum of the weights: equal on ranks that agree
        ("peak_device_bytes", "<i8"),  # the framework allocator's peak device memory so far (-1: none)
        ("peak_host_bytes", "<i8"),  # the process's peak resident set so far (ru_maxrss)
    ]
)

# One row per reading of an energy counter (hpcbench/trace/energy/), on the common clock: a
# rank's GPU through NVML, its host's RAPL domains (read by the host's local rank 0 only).
# Cumulative from an origin of the source's own: only differences of one rank, source and
# domain mean anything (store/energy.py).
ENERGY_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("t", "<f8"),  # seconds since epoch_ns, read between steps
        ("source", "S16"),  # rapl | nvml-counter | nvml-power (store/energy.py RECORDED_SOURCES)
        ("domain", "S24"),  # package-0, dram-0, core-1, psys, gpu-0, ...
        ("microjoules", "<i8"),  # cumulative
    ]
)

POINT = "point"
PROVENANCE = "provenance"
RANKS = "ranks"
ITERATIONS = "iterations"
COMM = "comm"
RESOURCES = "resources"
EVAL = "eval"
ENERGY = "energy"
# append-only, rows of every rank
TABLES = {COMM: COMM_DTYPE, RESOURCES: RESOURCE_DTYPE, EVAL: EVAL_DTYPE, ENERGY: ENERGY_DTYPE}

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_FAILED = "failed"
STATUS_STOPPED = "stopped"  # stopped on a signal, all ranks at the same iteration (attr stop_reason)
# a rank ran out of memory: a result, not a failure (attrs oom_*: OOM_ATTRS; resume leaves it)
STATUS_OOM = "out_of_memory"
STATUSES = (STATUS_RUNNING, STATUS_COMPLETE, STATUS_FAILED, STATUS_STOPPED, STATUS_OOM)
# root attributes of an out_of_memory file: what the rank that ran out said (rank/memory.py)
OOM_ATTRS = (
    "oom_rank",  # the rank that ran out (the first to say so)
    "oom_phase",  # where: build, step, test pass, flush
    "oom_iteration",  # the iteration it was in (-1 before the loop)
    "oom_peak_rss_bytes",  # the memory it reached: its peak resident memory
    "oom_device_peak_bytes",  # its framework allocator's device peak (-1: none, e.g. on a CPU)
    "oom_limit_bytes",  # the point's memory_limit_gb in bytes (-1: none)
    "oom_error",  # the exception's last line
)

# /provenance comm_end: what a message's recorded t_end is
COMM_END_COMPLETION = "completion"  # the moment the backend completed it
COMM_END_WAIT = "wait"  # the moment a wait after backward, in the messages' start order, saw it done
